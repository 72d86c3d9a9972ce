"""The SmolLM2 tokenizer against llama.cpp's own tokenization of the fixture strings."""

from __future__ import annotations

import time

import pytest

from minfer.gguf.reader import GGUFReader
from minfer.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def smollm2_meta(smollm2_path) -> dict:
    with GGUFReader(smollm2_path) as r:
        return r.metadata


@pytest.fixture(scope="session")
def tok(smollm2_meta) -> Tokenizer:
    return Tokenizer.from_metadata(smollm2_meta)


def test_vocab_properties(tok):
    assert tok.kind == "gpt2"
    assert tok.pre == "smollm"
    assert tok.n_vocab == 49152
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    assert tok.add_bos is False  # the file says add_bos_token = false
    # llama.cpp's EOG rules: eos (<|im_end|>), <|endoftext|> by its text, and <reponame>
    # (id 4) as the FIM repo-name token
    assert tok.eot_ids == {0, 2, 4}
    assert tok.token_text(2) == "<|im_end|>"


def test_tokenize_matches_llamacpp(tok, llamacpp_ref):
    cases = llamacpp_ref["tokenize"]
    assert len(cases) >= 20
    for case in cases:
        assert tok.encode(case["text"], add_special=True, parse_special=True) == case["ids"], case["text"]


def test_greedy_prompts_match_llamacpp(tok, llamacpp_ref):
    for case in llamacpp_ref["greedy"]:
        assert tok.encode(case["prompt"], add_special=True, parse_special=True) == case["prompt_ids"]


def test_special_tokens_are_text_without_parse_special(tok):
    text = "<|im_start|>user\nhi<|im_end|>"
    plain = tok.encode(text)
    assert 1 not in plain and 2 not in plain
    assert tok.encode(text, parse_special=True)[0] == 1
    assert tok.decode(plain) == text


def test_roundtrip(tok, llamacpp_ref):
    texts = [c["text"] for c in llamacpp_ref["tokenize"]] + [c["prompt"] for c in llamacpp_ref["greedy"]]
    for text in texts:
        assert tok.decode(tok.encode(text)) == text


def test_decode_control_tokens_only_when_asked(tok):
    ids = tok.encode("<|im_start|>user\nHi<|im_end|>", parse_special=True)
    assert tok.decode(ids) == "user\nHi"
    assert tok.decode(ids, special=True) == "<|im_start|>user\nHi<|im_end|>"
    assert tok.token_to_piece(2) == b""
    assert tok.token_to_piece(2, special=True) == b"<|im_end|>"


@pytest.mark.parametrize("text", ["emoji 🙂🚀 done", "日本語のテキスト", "café 👩‍👩‍👧 naïve ∑x²"])
def test_stream_decoder_never_splits_characters(tok, text):
    ids = tok.encode(text)
    # this vocabulary splits these characters over several byte tokens
    assert any(not _is_utf8(tok.token_to_piece(i)) for i in ids)
    dec = tok.stream_decoder()
    pieces = [dec.feed(i) for i in ids] + [dec.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text


def test_stream_decoder_flush_replaces_an_unfinished_character(tok):
    dec = tok.stream_decoder()
    first_byte_of_emoji = tok.encode("🙂")[0]
    assert dec.feed(first_byte_of_emoji) == ""
    assert dec.flush() == "\ufffd"


def test_gpl3_speed(smollm2_meta, fixtures_dir):
    text = (fixtures_dir / "text" / "gpl-3.txt").read_text()
    fresh = Tokenizer.from_metadata(smollm2_meta)  # empty word cache
    t0 = time.perf_counter()
    ids = fresh.encode(text, add_special=False)
    dt = time.perf_counter() - t0
    print(f"\nGPL-3 ({len(text)} chars) -> {len(ids)} tokens in {dt * 1000:.0f} ms")
    assert dt < 30.0  # a hang guard (~0.3 s here), not a benchmark: CI machines are shared
    assert fresh.decode(ids) == text


def test_from_gguf(smollm2_path, llamacpp_ref):
    tok = Tokenizer.from_gguf(smollm2_path)
    case = llamacpp_ref["tokenize"][0]
    assert tok.encode(case["text"], parse_special=True) == case["ids"]


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
