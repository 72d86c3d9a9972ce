"""llama.cpp's BPE pre-tokenizers: split text into words before byte-level BPE.

A pre-tokenizer is a list of regexes applied in turn (llama.cpp `unicode_regex_split`): each one
splits every piece left by the previous one into its matches *and* the unmatched runs between
them, so no character is ever dropped. Two regexes are not run as regexes by llama.cpp but by
hand-written scanners with slightly different edge behaviour (the GPT-2 and the Llama-3 one);
we reimplement those scanners, and run every other regex the way llama.cpp does: on the
"collapsed" text (one class character per non-ASCII codepoint, see `unicode.collapse`) with each
`\\p{X}` rewritten to a class of that character plus its ASCII members.

Variants and their regexes come from llama.cpp `src/llama-vocab.cpp` (`llm_tokenizer_bpe`, the
`tokenizer.ggml.pre` name table in `llama_vocab::impl::load`) and `src/unicode.cpp`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from . import unicode as U

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
LLAMA3_REGEX = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_REGEX_CI = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# o200k (gpt-4o, gpt-oss): llama.cpp's ECMAScript spelling of tokenizer.json's case classes (words as
# upper-then-lower runs through lookaheads), run as a regex on the collapsed text as llama.cpp runs it
_CASED = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
GPT4O_REGEX = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CASED +
               r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CASED +
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class PreTokenizer:
    """One `tokenizer.ggml.pre` variant: its regexes and the vocab flags llama.cpp ties to it."""

    name: str
    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a word that is itself a token skips BPE (llama3)
    add_bos: bool = False  # default when the file has no add_bos_token key
    clean_spaces: bool = True  # detokenizer removes " ," " ." " 's" ... (clean_up_tokenization_spaces)

    def split(self, text: str) -> list[str]:
        return split_words(text, self.regexes)


_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", GPT2_REGEX, r"\p{N}+", "[0-9][0-9][0-9]")
_GPT2 = (GPT2_REGEX,)
_LLAMA3 = (LLAMA3_REGEX,)
_QWEN2 = (QWEN2_REGEX,)
_SMOLLM = (r"\p{N}", GPT2_REGEX)
_GPT4O = (GPT4O_REGEX,)


def _variants() -> dict[str, PreTokenizer]:
    table: dict[str, PreTokenizer] = {}

    def add(names: str, regexes: tuple[str, ...], **flags) -> None:
        for name in names.split():
            table[name] = PreTokenizer(name, regexes, **flags)

    add("default", _DEFAULT)
    add("gpt-2 phi-2 mpt olmo jais gigachat a.x-4.0 mellum exaone4", _GPT2)
    add("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2", _LLAMA3,
        ignore_merges=True, add_bos=True)
    add("qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open", _QWEN2, clean_spaces=False)
    add("stablelm2 megrez", _QWEN2)
    add("smollm command-r", _SMOLLM, clean_spaces=False)
    add("gpt-4o llama4 kanana2 talkie minimax-m2", _GPT4O, clean_spaces=False)
    add("starcoder refact codeshell exaone minerva-7b mellum2", _SMOLLM)
    return table


VARIANTS: dict[str, PreTokenizer] = _variants()


# --- the two hand-written scanners -----------------------------------------------------------------
def _scan_gpt2(text: str, flags: list[int], a: int, b: int, out: list[tuple[int, int]]) -> None:
    """llama.cpp unicode_regex_split_custom_gpt2 on text[a:b]."""
    L, N, WS = U.LETTER, U.NUMBER, U.WHITESPACE

    def fl(p: int) -> int:  # 0 outside the piece: "no flags at all"
        return flags[p] if a <= p < b else 0

    pos = a
    while pos < b:
        start = pos
        c = text[pos]
        if c == "'" and pos + 1 < b:
            n1 = text[pos + 1]
            if n1 in "stmd":
                pos += 2
                out.append((start, pos))
                continue
            if pos + 2 < b and n1 + text[pos + 2] in ("re", "ve", "ll"):
                pos += 3
                out.append((start, pos))
                continue
        f2 = fl(pos + 1) if c == " " else flags[pos]
        for klass in (L, N):
            if f2 & klass:
                pos += c == " "
                while f2 & klass:
                    pos += 1
                    f2 = fl(pos)
                break
        else:
            if f2 and not f2 & (WS | L | N):
                pos += c == " "
                while f2 and not f2 & (WS | L | N):
                    pos += 1
                    f2 = fl(pos)
            else:
                n_ws = 0
                while fl(pos + n_ws) & WS:
                    n_ws += 1
                if n_ws > 1 and pos + n_ws < b:
                    pos += n_ws - 1  # \s+(?!\S): leave the last space to the next word
                elif n_ws > 0:
                    pos += n_ws
                else:
                    pos += 1
        out.append((start, pos))


def _scan_llama3(text: str, flags: list[int], a: int, b: int, out: list[tuple[int, int]]) -> None:
    """llama.cpp unicode_regex_split_custom_llama3 on text[a:b]."""
    L, N, WS = U.LETTER, U.NUMBER, U.WHITESPACE

    def fl(p: int) -> int:
        return flags[p] if a <= p < b else 0

    pos = a
    while pos < b:
        start = pos
        c = text[pos]
        f = flags[pos]
        if c == "'" and pos + 1 < b:
            n1 = text[pos + 1].lower() if text[pos + 1].isascii() else ""
            if n1 and n1 in "stmd":
                pos += 2
                out.append((start, pos))
                continue
            if n1 and pos + 2 < b and text[pos + 2].isascii() and (n1 + text[pos + 2].lower()) in ("re", "ve", "ll"):
                pos += 3
                out.append((start, pos))
                continue
        if c not in "\r\n" and not f & N and (f & L or fl(pos + 1) & L):
            pos += 1
            while fl(pos) & L:
                pos += 1
            out.append((start, pos))
            continue
        if f & N:
            run = pos
            while fl(pos) & N:
                pos += 1
                if pos - run >= 3:
                    out.append((run, pos))
                    run = pos
            if pos > run:
                out.append((run, pos))
            continue
        f2 = fl(pos + 1) if c == " " else f
        if not f2 & (WS | L | N) and f:
            pos += c == " "
            while f2 and not f2 & (WS | L | N):
                pos += 1
                f2 = fl(pos)
            while pos < b and text[pos] in "\r\n":
                pos += 1
            out.append((start, pos))
            continue
        n_ws = 0
        last_nl = 0
        while fl(pos + n_ws) & WS:
            if text[pos + n_ws] in "\r\n":
                last_nl = pos + n_ws + 1
            n_ws += 1
        if last_nl > 0:
            pos = last_nl  # \s*[\r\n]+
        elif n_ws > 1 and pos + n_ws < b:
            pos += n_ws - 1  # \s+(?!\S)
        elif n_ws > 0:
            pos += n_ws
        else:
            pos += 1
        out.append((start, pos))


_Scanner = Callable[[str, list[int], int, int, list[tuple[int, int]]], None]
_SCANNERS: dict[str, _Scanner] = {GPT2_REGEX: _scan_gpt2, LLAMA3_REGEX: _scan_llama3, LLAMA3_REGEX_CI: _scan_llama3}


# --- every other regex: run on the collapsed text ------------------------------------------------
_PROPERTY = re.compile(r"\\p\{(\w{1,2})\}")


@functools.lru_cache(maxsize=64)
def _compile(expr: str) -> tuple[re.Pattern[str], bool]:
    """Python pattern for a llama.cpp pre-tokenizer regex, and whether it runs on collapsed text.

    `\\p{X}` becomes `[<class char><ASCII members>]` (or just the members inside a set).
    ECMAScript's `\\s` is ASCII-only, hence re.ASCII; non-ASCII whitespace was mapped to U+000B.
    """
    if not _PROPERTY.search(expr):
        return re.compile(expr, re.ASCII), False
    out = []
    inside = False
    i = 0
    while i < len(expr):
        ch = expr[i]
        if ch == "[" and (i == 0 or expr[i - 1] != "\\"):
            inside = True
        elif ch == "]" and inside and expr[i - 1] != "\\":
            inside = False
        m = _PROPERTY.match(expr, i)
        if m and m.group(1) in U.PROPERTY_CLASS:
            klass = U.PROPERTY_CLASS[m.group(1)]
            out.append(klass if inside else f"[{klass}]")
            i = m.end()
            continue
        out.append(ch)
        i += 1
    return re.compile("".join(out), re.ASCII), True


def _regex_split(subject: str, pattern: re.Pattern[str], a: int, b: int, out: list[tuple[int, int]]) -> None:
    last = a
    for m in pattern.finditer(subject[a:b]):
        s, e = a + m.start(), a + m.end()
        if s > last:
            out.append((last, s))
        if e > s:
            out.append((s, e))
        last = e
    if last < b:
        out.append((last, b))


def split_words(text: str, regexes: tuple[str, ...]) -> list[str]:
    """Apply each regex in turn to the pieces left by the previous one (llama.cpp semantics)."""
    if not text:
        return []
    spans = [(0, len(text))]
    flags: list[int] | None = None
    collapsed: str | None = None
    plain: str | None = None
    for expr in regexes:
        new: list[tuple[int, int]] = []
        scanner = _SCANNERS.get(expr)
        if scanner is not None:
            if flags is None:
                flags = U.text_flags(text)
            for a, b in spans:
                scanner(text, flags, a, b, new)
        else:
            pattern, use_collapsed = _compile(expr)
            if use_collapsed:
                subject = collapsed = collapsed if collapsed is not None else U.collapse(text)
            else:
                subject = plain = plain if plain is not None else U.whitespace_to_vt(text)
            for a, b in spans:
                _regex_split(subject, pattern, a, b, new)
        spans = new
    return [text[a:b] for a, b in spans]
