"""Log-probabilities an engine reports (the server's `logprobs`) against an oracle computed here:
the float64 log-softmax of the same logits rows, on a real (tiny) model."""

from __future__ import annotations

import torch

from minfer.api import load
from minfer.engine.params import SamplingParams

# Measured 2026-12-02 (tiny-llama f32, 8 sampled steps, top 20): max |reported - float64 log-softmax| 9.0e-7
# (float32 log_softmax of values around -6.3, and the decode path's rows vs the prefill's, ~2e-7); bound 3x.
# An unnormalised `row - max` is off by log(sum exp(row - max)) = 5.3 here.
MAX_ABS = 2.7e-6
TOP = 20


def test_logprobs_are_the_log_softmax_of_the_rows_sampled_from(tiny_gguf):
    with load(tiny_gguf("tiny-llama", "f32"), n_ctx=64, n_slots=1, progress=False) as m:
        ids = m.prompt_ids("hello there, general")
        # sampled at a high temperature: the sampled token is often not the most likely one
        seq = m.engine.add(ids, SamplingParams(max_tokens=8, temperature=1.5, seed=5, ignore_eos=True))
        seq.logprobs_n = TOP
        m.engine.run([seq])
        steps = seq.generated
        ref = torch.log_softmax(m.logits(ids + steps)[len(ids) - 1:-1].double(), dim=-1)
    assert len(seq.logprobs) == len(steps) == 8
    off_top = 0
    for j, (tok, (lp, top)) in enumerate(zip(steps, seq.logprobs, strict=True)):
        assert abs(lp - float(ref[j, tok])) < MAX_ABS, (j, lp, float(ref[j, tok]))
        want_lp, want_ids = ref[j].topk(TOP)
        assert [i for i, _ in top] == want_ids.tolist(), j
        assert max(abs(v - float(w)) for (_, v), w in zip(top, want_lp, strict=True)) < MAX_ABS, j
        off_top += tok != top[0][0]
    assert off_top >= 2  # (the chosen token's logprob was checked apart from the top list's)
