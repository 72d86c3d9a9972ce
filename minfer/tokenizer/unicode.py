"""Codepoint classes and the GPT-2 byte alphabet, as llama.cpp's tokenizer sees them.

llama.cpp does not use a regex engine's notion of `\\p{L}` or `\\s`; it classifies every codepoint
with its own table (src/unicode-data.cpp, generated from UnicodeData.txt):

- one general-category flag per codepoint: letter, number, separator, mark, punctuation,
  symbol, control, or *undefined* for unassigned codepoints (Cn);
- a separate whitespace flag for exactly the Unicode White_Space property (so U+001C..U+001F,
  which Python's `str.isspace()` accepts, are *not* whitespace here).

We derive the same flags from `unicodedata` (the Unicode version of the running Python; newly
assigned codepoints may differ from llama.cpp's table, nothing else does).

`collapse()` is llama.cpp's trick for running `\\p{..}` regexes through a byte regex engine:
every non-ASCII codepoint is replaced by one representative character of its class.
"""

from __future__ import annotations

import functools
import unicodedata

UNDEFINED = 0x001
NUMBER = 0x002
LETTER = 0x004
SEPARATOR = 0x008
MARK = 0x010
PUNCTUATION = 0x020
SYMBOL = 0x040
CONTROL = 0x080
WHITESPACE = 0x100

_CATEGORY_FLAG = {"L": LETTER, "N": NUMBER, "Z": SEPARATOR, "M": MARK, "P": PUNCTUATION, "S": SYMBOL,
                  "C": CONTROL}

# Unicode White_Space (PropList.txt)
WHITESPACE_CODEPOINTS = frozenset(
    [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F,
     0x205F, 0x3000]
)


@functools.lru_cache(maxsize=1 << 16)
def char_flags(ch: str) -> int:
    """Category flag (exactly one) plus WHITESPACE where it applies, for one character."""
    cat = unicodedata.category(ch)
    flags = UNDEFINED if cat == "Cn" else _CATEGORY_FLAG[cat[0]]
    if ord(ch) in WHITESPACE_CODEPOINTS:
        flags |= WHITESPACE
    return flags


def text_flags(text: str) -> list[int]:
    """`char_flags` of every character of `text`."""
    return [char_flags(c) for c in text]


# --- collapsed representation (llama.cpp unicode_regex_split) -------------------------------------
# representative character of each class, and the ASCII members llama.cpp lists for that class
# inside a regex character set (ASCII text is never collapsed, so these decide ASCII matches)
_COLLAPSED_CHAR = {NUMBER: "\xd1", LETTER: "\xd2", PUNCTUATION: "\xd3", MARK: "\xd4", SYMBOL: "\xd5"}
_OTHER_CHAR = "\xd0"
_WHITESPACE_CHAR = "\x0b"
PROPERTY_CLASS = {
    "N": "\xd10-9",
    "L": "\xd2A-Za-z",
    "Lu": "\xd2A-Za-z",
    "Ll": "\xd2A-Za-z",
    "Lt": "\xd2A-Za-z",
    "Lm": "\xd2A-Za-z",
    "Lo": "\xd2A-Za-z",
    "P": "\xd3!-#%-*,-/:-;?-@\\[-\\]_\\{\\}",
    "M": "\xd4",
    "S": "\xd5\\$\\+<->\\^`\\|",
}


@functools.lru_cache(maxsize=1 << 16)
def _collapsed_char(ch: str) -> str:
    if ord(ch) < 128:
        return ch
    flags = char_flags(ch)
    if flags & WHITESPACE:
        return _WHITESPACE_CHAR
    return _COLLAPSED_CHAR.get(flags & 0xFF, _OTHER_CHAR)


def collapse(text: str) -> str:
    """One character per codepoint: ASCII kept, others replaced by their class representative."""
    if text.isascii():
        return text
    return "".join([_collapsed_char(c) for c in text])


def whitespace_to_vt(text: str) -> str:
    """Non-ASCII whitespace -> U+000B, as llama.cpp does before a regex without `\\p{..}`."""
    if text.isascii():
        return text
    return "".join([_WHITESPACE_CHAR if ord(c) > 0x7F and ord(c) in WHITESPACE_CODEPOINTS else c
                    for c in text])


# --- GPT-2 byte-level alphabet -----------------------------------------------------------------------
def _byte_alphabet() -> list[str]:
    """Byte b -> a printable character: printable Latin-1 bytes map to themselves, the other 68
    bytes to U+0100 onwards in byte order (the mapping of OpenAI's GPT-2 encoder)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    for b in keep:
        table[b] = chr(b)
    n = 0
    for b in range(256):
        if not table[b]:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_TO_CHAR: tuple[str, ...] = tuple(_byte_alphabet())
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
