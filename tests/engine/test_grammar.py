"""Constrained decoding in the engine (engine/grammar.py, engine/masks.py): the bitmask's meaning,
grammars that hold alone and in a batch (each sequence its own matcher), logit_bias, and the
errors a bad grammar gives."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch

from minfer.api import load, sampling_params
from minfer.engine.grammar import Grammar, check_grammar, ll_tokenizer
from minfer.engine.params import SamplingParams
from minfer.errors import GrammarError, ParamError
from minfer.kernels.sample import apply_bitmask


def test_apply_bitmask_keeps_exactly_the_set_bits():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 70, generator=gen)
    allowed = [{0, 31, 32, 69}, {5}]
    bits = torch.zeros(2, 3, dtype=torch.int64)
    for r, ids in enumerate(allowed):
        for t in ids:
            bits[r, t // 32] |= 1 << (t % 32)
    bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)  # the words as int32, as llguidance writes
    out = apply_bitmask(logits, bits)
    for r, ids in enumerate(allowed):
        for t in range(70):
            assert (out[r, t] == logits[r, t]) if t in ids else out[r, t] == float("-inf"), (r, t)


SCHEMAS = [
    {"type": "object", "properties": {"c": {"enum": ["red", "green"]}}, "required": ["c"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 3},
    {"enum": ["north", "south"]},
]


@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    with load(tiny_gguf("tiny-llama", "q8_0"), n_ctx=256, n_slots=4, progress=False) as m:
        yield m


def test_schemas_hold_alone_and_in_a_batch(tiny):
    prompt = "Answer in JSON:"
    alone = [tiny.generate(prompt, json_schema=s, temperature=0, max_tokens=40) for s in SCHEMAS]
    for text, s in zip(alone, SCHEMAS, strict=True):
        jsonschema.validate(json.loads(text), s)
    together = tiny.generate_batch([prompt] * 3, params=[sampling_params(json_schema=s, temperature=0, max_tokens=40)
                                                         for s in SCHEMAS])
    assert [r.text for r in together] == alone
    assert all(r.finish_reason == "stop" for r in together)
    sampled = tiny.generate_batch([prompt] * 4, json_schema=SCHEMAS[1], temperature=1.0, top_k=0, max_tokens=40)
    for r in sampled:
        jsonschema.validate(json.loads(r.text), SCHEMAS[1])


def test_gbnf_and_logit_bias(tiny):
    text = tiny.generate("x", grammar='root ::= "ab" [0-9] [0-9] "!"', temperature=0, max_tokens=20)
    assert len(text) == 5 and text.startswith("ab") and text[2:4].isdigit() and text.endswith("!")
    tok = tiny.tokenize(" the", add_special=False)[0]
    r = tiny.generate_batch(["hello"], temperature=0, max_tokens=4, logit_bias={tok: 100.0})[0]
    assert r.token_ids == [tok] * 4


def test_bad_grammars(tiny):
    with pytest.raises(GrammarError, match="frobnicate"):
        check_grammar(Grammar.json_schema({"type": "frobnicate"}), tiny.tokenizer)
    with pytest.raises(GrammarError, match="nope"):
        check_grammar(Grammar.gbnf('root ::= nope'), tiny.tokenizer)
    with pytest.raises(GrammarError, match="not valid JSON"):
        Grammar.json_schema("{oops")
    with pytest.raises(ParamError, match="logit_bias"):
        SamplingParams(logit_bias={5: 1000.0})


BOUNDED = [  # strings whose maxLength lands on, between and beyond the slice bounds, and unbounded ones
    {"type": "array", "minItems": 100, "items": {"type": "string", "maxLength": 24}},
    {"type": "array", "minItems": 100, "items": {"type": "string", "maxLength": 3}},
    {"type": "object", "properties": {"a": {"type": "string", "minLength": 5, "maxLength": 9},
                                      "b": {"type": "string"}}, "required": ["a", "b"]},
    {"type": "array", "items": {"type": "string", "pattern": "^[a-z ]{0,40}$"}},
]


def _mask(matcher, n_vocab: int) -> torch.Tensor:
    out = torch.empty((n_vocab + 31) // 32, dtype=torch.int32)
    matcher.unsafe_compute_mask_ptr(out.data_ptr(), out.numel() * 4)
    return out


@pytest.mark.parametrize("schema", range(len(BOUNDED)))
def test_the_slices_change_no_mask(smollm2_model, schema, test_seed):
    """The tokenizer view's extra slices (short JSON strings, grammar.SLICE_BOUNDS) only skip trie walks:
    along random walks through schemas with bounded and unbounded strings (on the real SmolLM2
    vocabulary), every mask equals the one computed with no slices at all. (llguidance adds a slice
    only where the lexer allows all of it, so a wrong slice costs time, not tokens: this guards that
    property, which the masks' speed-up relies on, against the library version minfer installs.)"""
    import llguidance

    tok = smollm2_model.tokenizer
    n_vocab = smollm2_model.engine.n_vocab
    ours = ll_tokenizer(tok, n_vocab)
    plain = ours.with_slices([])
    compiled = Grammar.json_schema(BOUNDED[schema]).compiled()
    rng = random.Random(test_seed * 31 + schema)
    for walk in range(3):
        a = llguidance.LLMatcher(ours, compiled, log_level=0)
        b = llguidance.LLMatcher(plain, compiled, log_level=0)
        for step in range(40):
            want, got = _mask(b, n_vocab), _mask(a, n_vocab)
            assert torch.equal(got, want), (schema, walk, step)
            words = want.to(torch.int64) & 0xFFFFFFFF
            allowed = ((words.unsqueeze(1) >> torch.arange(32)) & 1).flatten()[:n_vocab].nonzero().flatten()
            if len(allowed) == 0 or a.is_stopped():
                break
            t = int(allowed[rng.randrange(len(allowed))])
            assert a.consume_token(t) and b.consume_token(t)
