"""SentencePiece ("llama") tokenization on a hand-built vocabulary.

Expected ids are derived by hand from the algorithm (llama.cpp llm_tokenizer_spm): the text
gets a leading space, spaces become "▁", characters are merged pairwise, highest token score
first (ties: leftmost pair), and characters that never become a token fall back to <0xNN> bytes.
"""

from __future__ import annotations

import pytest

from minfer.tokenizer import Tokenizer

# ids 0..2 specials, 3..258 byte tokens <0x00>..<0xFF>, then the pieces below
NORMAL = [
    ("▁", -1.0), ("h", -2.0), ("e", -2.0), ("l", -2.0), ("o", -2.0), ("▁h", -3.0), ("ll", -1.5),
    ("he", -2.5), ("llo", -1.0), ("▁he", -4.0), ("w", -2.0), ("▁w", -3.0), ("r", -2.0), ("d", -2.0),
    ("or", -2.5), ("ld", -2.6),
]
ID = {text: 259 + i for i, (text, _) in enumerate(NORMAL)}
BYTE0 = 3


def spm_meta(**overrides) -> dict:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [t for t, _ in NORMAL]
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * 259 + [s for _, s in NORMAL],
        "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * len(NORMAL),
    }
    meta.update(overrides)
    return meta


@pytest.fixture(scope="module")
def spm() -> Tokenizer:
    return Tokenizer.from_metadata(spm_meta())


def test_defaults(spm):
    assert spm.kind == "llama"
    assert (spm.bos_id, spm.eos_id, spm.add_bos) == (1, 2, True)
    assert spm.eot_ids == {2}  # eos, and "</s>" by its text


def test_score_ordered_merges(spm):
    # "▁hello▁world": ll(-1.5) -> llo(-1.0) -> he(-2.5, left of or) -> or -> ld -> ▁w -> ▁he;
    # the stale ▁h pair (its right side became "he") is skipped
    assert spm.encode("hello world") == [1, ID["▁he"], ID["llo"], ID["▁w"], ID["or"], ID["ld"]]
    assert spm.encode("hello world", add_special=False) == [ID["▁he"], ID["llo"], ID["▁w"], ID["or"], ID["ld"]]


def test_byte_fallback(spm):
    assert spm.encode("hi", add_special=False) == [ID["▁h"], BYTE0 + ord("i")]
    assert spm.encode("é", add_special=False) == [ID["▁"], BYTE0 + 0xC3, BYTE0 + 0xA9]


def test_special_tokens_and_space_prefix(spm):
    # with parse_special the control token is matched and the following text gets the space prefix
    assert spm.encode("<s>hello", add_special=False, parse_special=True) == [1, ID["▁he"], ID["llo"]]
    # without it, "<s>" is plain text: ▁ < s > as bytes, then "hello" without a prefix space
    assert spm.encode("<s>hello", add_special=False) == [
        ID["▁"], BYTE0 + ord("<"), BYTE0 + ord("s"), BYTE0 + ord(">"), ID["he"], ID["llo"]]


def test_no_space_prefix_flag():
    tok = Tokenizer.from_metadata(spm_meta(**{"tokenizer.ggml.add_space_prefix": False}))
    assert tok.encode("hello", add_special=False) == [ID["he"], ID["llo"]]


def test_add_eos_flag():
    tok = Tokenizer.from_metadata(spm_meta(**{"tokenizer.ggml.add_eos_token": True,
                                              "tokenizer.ggml.add_bos_token": False}))
    assert tok.encode("hi") == [ID["▁h"], BYTE0 + ord("i"), 2]


def test_decode(spm):
    ids = spm.encode("hello world", add_special=False)
    assert spm.decode(ids) == "hello world"  # the prefix space is stripped from the first token
    # llama.cpp keeps the space when a BOS comes first (it consumes the one-space strip)
    assert spm.decode([1, *ids]) == " hello world"
    assert spm.decode([1, *ids], special=True) == "<s> hello world"
    assert spm.decode(spm.encode("hi é", add_special=False)) == "hi é"


def test_stream_decode_byte_tokens(spm):
    dec = spm.stream_decoder()
    assert dec.feed(ID["▁"]) == ""
    assert dec.feed(BYTE0 + 0xC3) == ""  # half of "é" is held back
    assert dec.feed(BYTE0 + 0xA9) == "é"
    assert dec.flush() == ""
