"""Byte-level BPE on a hand-built vocabulary: merge order, llama3's ignore_merges, byte
fallback, user-defined tokens, and the metadata errors."""

from __future__ import annotations

import pytest

from minfer.errors import TokenizerError, UnsupportedError
from minfer.tokenizer import Tokenizer
from minfer.tokenizer.unicode import BYTE_TO_CHAR

# ids 0..255: the byte alphabet in byte order; then merged tokens
EXTRA = ["he", "ll", "hell", "hello", "xyz", "<|eot|>", "<tool>", "Ġw", "Ġwo"]
ID = {t: 256 + i for i, t in enumerate(EXTRA)}
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o"]


def bpe_meta(pre: str | None = "gpt-2", **overrides) -> dict:
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": list(BYTE_TO_CHAR) + EXTRA,
        "tokenizer.ggml.token_type": [1] * 256 + [1, 1, 1, 1, 1, 3, 4, 1, 1],
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.bos_token_id": ID["<|eot|>"],
        "tokenizer.ggml.eos_token_id": ID["<|eot|>"],
    }
    if pre is not None:
        meta["tokenizer.ggml.pre"] = pre
    meta.update(overrides)
    return meta


def byte_id(ch: str) -> int:
    return BYTE_TO_CHAR.index(ch)


def test_merges_in_rank_order():
    tok = Tokenizer.from_metadata(bpe_meta())
    assert tok.encode("hello") == [ID["hello"]]
    # "hel": h e -> he; "he l" has no merge
    assert tok.encode("hel") == [ID["he"], byte_id("l")]
    # " wo" -> Ġ w -> Ġw o -> Ġwo ; "llo" -> ll o
    assert tok.encode("llo wo") == [ID["ll"], byte_id("o"), ID["Ġwo"]]


def test_ignore_merges_only_for_llama3():
    # "xyz" is a token but no merge builds it: gpt-2 spells it out, llama3 takes the word whole
    assert Tokenizer.from_metadata(bpe_meta("gpt-2")).encode("xyz") == [byte_id(c) for c in "xyz"]
    llama3 = Tokenizer.from_metadata(bpe_meta("llama-bpe"))
    assert llama3.add_bos  # llama3's default when the file has no add_bos_token
    assert llama3.encode("xyz") == [ID["<|eot|>"], ID["xyz"]]
    assert llama3.encode("xyz", add_special=False) == [ID["xyz"]]


def test_user_defined_tokens_always_split_control_only_with_parse_special():
    tok = Tokenizer.from_metadata(bpe_meta())
    # <tool> (user-defined) is matched even without parse_special, like llama.cpp
    assert tok.encode("<tool>hello") == [ID["<tool>"], ID["hello"]]
    assert tok.encode("<|eot|>", parse_special=True) == [ID["<|eot|>"]]
    assert ID["<|eot|>"] not in tok.encode("<|eot|>")
    assert tok.is_eog(ID["<|eot|>"])


def test_unknown_pre_falls_back_to_default_with_warning():
    with pytest.warns(UserWarning, match="falling back to 'default'.*smollm"):
        tok = Tokenizer.from_metadata(bpe_meta("no-such-pre"))
    assert tok.pre == "default"
    with pytest.warns(UserWarning, match="missing"):
        Tokenizer.from_metadata(bpe_meta(None))


def test_clean_spaces_on_decode():
    # gpt-2 vocabularies clean up " ," etc. (llama.cpp clean_spaces), smollm's do not
    text = "a , b . it 's"
    ids = [byte_id(BYTE_TO_CHAR[b]) for b in text.encode()]
    assert Tokenizer.from_metadata(bpe_meta("gpt-2")).decode(ids) == "a, b. it's"
    assert Tokenizer.from_metadata(bpe_meta("smollm")).decode(ids) == text


@pytest.mark.parametrize(("change", "key"), [
    ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.tokens": "abc"}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.tokens": [1, 2, 3]}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.tokens": []}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.tokens": ["a", "b", "a"]}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.merges": None}, "tokenizer.ggml.merges"),
    ({"tokenizer.ggml.token_type": [1, 1]}, "tokenizer.ggml.token_type"),
    ({"tokenizer.ggml.scores": [0.5]}, "tokenizer.ggml.scores"),
    ({"tokenizer.ggml.model": None}, "tokenizer.ggml.model"),
    ({"tokenizer.ggml.model": 3}, "tokenizer.ggml.model"),
    ({"tokenizer.ggml.eos_token_id": "2"}, "tokenizer.ggml.eos_token_id"),
    ({"tokenizer.ggml.add_bos_token": "yes"}, "tokenizer.ggml.add_bos_token"),
])
def test_bad_metadata_names_the_key(change, key):
    meta = bpe_meta()
    for k, v in change.items():
        if v is None:
            meta.pop(k)
        else:
            meta[k] = v
    with pytest.raises(TokenizerError, match=key.replace(".", r"\.")):
        Tokenizer.from_metadata(meta)


def test_add_bos_without_a_valid_bos_id():
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": list("abcde"),
            "tokenizer.ggml.merges": [], "tokenizer.ggml.add_bos_token": True}
    # gpt2's default BOS id (11) is outside this 5-token vocabulary, so BOS is unset
    with pytest.raises(TokenizerError, match=r"add_bos_token is true.*bos_token_id"):
        Tokenizer.from_metadata(meta)
    meta["tokenizer.ggml.bos_token_id"] = 7
    with pytest.warns(UserWarning, match="bos_token_id: id 7 is outside"), pytest.raises(TokenizerError):
        Tokenizer.from_metadata(meta)


def test_unknown_model_is_unsupported():
    with pytest.raises(UnsupportedError, match="'bert'.*gpt2, llama"):
        Tokenizer.from_metadata(bpe_meta(**{"tokenizer.ggml.model": "bert"}))


def test_bad_ids_and_inputs():
    tok = Tokenizer.from_metadata(bpe_meta())
    for bad in (-1, tok.n_vocab, "3", 2.0):
        with pytest.raises(TokenizerError, match="outside the vocabulary"):
            tok.decode([bad])
    with pytest.raises(TokenizerError):
        tok.encode(b"bytes")
