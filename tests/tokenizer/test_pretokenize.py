"""Pre-tokenizer variants: hand-derived splits, and agreement with the original HF regexes
(run by the `regex` module, an independent engine) on a mixed corpus."""

from __future__ import annotations

import pytest
import regex

from minfer.tokenizer.pretokenize import VARIANTS, split_words

TEXT = "Hello  world's 12345 foo!!\n\nbar"

EXPECTED = {
    # 's|'t|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    "gpt-2": ["Hello", " ", " world", "'s", " 12345", " foo", "!!", "\n", "\n", "bar"],
    # contractions, [^\r\n\p{L}\p{N}]?\p{L}+, \p{N}{1,3}, punctuation keeps trailing newlines
    "llama-bpe": ["Hello", " ", " world", "'s", " ", "123", "45", " foo", "!!\n\n", "bar"],
    # as llama3 but one digit per piece
    "qwen2": ["Hello", " ", " world", "'s", " ", "1", "2", "3", "4", "5", " foo", "!!\n\n", "bar"],
    # digits split off first, then the GPT-2 rules inside each piece
    "smollm": ["Hello", " ", " world", "'s", " ", "1", "2", "3", "4", "5", " foo", "!!", "\n", "\n", "bar"],
    # punctuation runs first ("'" is punctuation), GPT-2 rules, digit runs, then 3-digit groups
    "default": ["Hello", " ", " world", "'", "s", " ", "123", "45", " foo", "!!", "\n", "\n", "bar"],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hand_derived_splits(name):
    assert VARIANTS[name].split(TEXT) == EXPECTED[name]


def test_llama3_contractions_are_case_insensitive():
    assert VARIANTS["llama-bpe"].split("I'M HE'LL") == ["I", "'M", " HE", "'LL"]
    assert VARIANTS["gpt-2"].split("I'M") == ["I", "'", "M"]


def test_non_ascii_classes_in_collapsed_regexes():
    # qwen2 runs as a regex over collapsed text: é is a letter, ٣ (Arabic-Indic 3) a number,
    # U+3000 (ideographic space) whitespace
    assert VARIANTS["qwen2"].split("é٣x\u3000\u3000y") == ["é", "٣", "x", "\u3000", "\u3000y"]


def test_nothing_is_lost():
    text = "a\x00b\x1c\u0378\ufffd  \u2028z"  # control, U+001C, an unassigned codepoint
    for pre in VARIANTS.values():
        assert "".join(pre.split(text)) == text
    assert split_words("", VARIANTS["gpt-2"].regexes) == []


_HF_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_HF_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_HF_QWEN2 = _HF_LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")


@pytest.mark.parametrize(("name", "pattern"), [("gpt-2", _HF_GPT2), ("llama-bpe", _HF_LLAMA3), ("qwen2", _HF_QWEN2)])
def test_agrees_with_hf_regex(name, pattern, llamacpp_ref, fixtures_dir):
    corpus = [c["text"] for c in llamacpp_ref["tokenize"]]
    corpus += [(fixtures_dir / "text" / "gpl-3.txt").read_text()[:6000]]
    corpus += ["  x\t\ty  \n  \r\n\tz   ", "you'RE we'Ve 'd'll''s", "(a)[b]{c} <d> 10,000.5e-3 %$#@!",
               "Ünïcödé Ελληνικά русский 中文 한국어 עברית ١٢٣", "tail spaces   ", "   ", "x\u00a0\u00a0y"]
    compiled = regex.compile(pattern)
    for text in corpus:
        assert VARIANTS[name].split(text) == compiled.findall(text), text
