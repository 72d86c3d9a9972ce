"""Perplexity of SmolLM2 on the GPL-3 text against llama-perplexity's (fixtures: 18.429, 14 chunks)."""

from __future__ import annotations

import math

import pytest

from minfer.errors import ContextOverflowError, MinferError


def test_perplexity_matches_llamacpp(smollm2_model, fixtures_dir, llamacpp_ref):
    ref = llamacpp_ref["perplexity"]
    text = (fixtures_dir / "text" / ref["text"]).read_text(encoding="utf-8")
    r = smollm2_model.perplexity(text, n_ctx=ref["n_ctx"])
    print(f"PPL {r.ppl:.4f} +/- {r.ppl_error:.4f} (llama.cpp {ref['ppl']:.4f}), {r.seconds:.1f} s")
    assert r.chunks == ref["chunks"]
    assert r.n_scored == ref["chunks"] * ref["scored_per_chunk"]
    assert abs(r.ppl - ref["ppl"]) / ref["ppl"] < 0.005  # issue 11: within 0.5 % (measured -0.42 %, int4 kernels)
    for ours, theirs in zip(r.nll_per_chunk, ref["nll_per_chunk"], strict=True):
        assert abs(ours - theirs) < 0.03
    assert r.ppl == pytest.approx(math.exp(sum(r.nll_per_chunk) / r.chunks), rel=1e-9)
    assert 0 < r.ppl_error < 0.1 * r.ppl


def test_perplexity_needs_a_whole_chunk(smollm2_model):
    with pytest.raises(MinferError, match="at least one chunk"):
        smollm2_model.perplexity("too short", n_ctx=512)


def test_perplexity_chunk_larger_than_context(smollm2_model):
    with pytest.raises(ContextOverflowError):
        smollm2_model.perplexity("x " * 5000, n_ctx=2048)
