"""Sampling: turn one row of logits into the next token id (parameters: engine/params.py).

The chain and the draw are kernels/sample.py's, shared with the device: token i of a sequence
is drawn with the counter-based uniform number uniform(seed, i), from the request's seed (or a
fresh random one). So a sequence draws the same tokens whatever else runs beside it, and a
backend that samples on the device (cuda) picks what the host would from the same logits.
"""

from __future__ import annotations

import random

import torch

from ..kernels.sample import KMAX, pick_from_top
from ..rng import uniform
from .params import SamplingParams


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.seed = params.seed if params.seed is not None else random.SystemRandom().randrange(2**63)

    def __call__(self, logits: torch.Tensor, history: list[int], index: int = 0) -> int:
        """Token `index` of the generation from logits [n_vocab]; `history` is the sequence so far
        (for the penalties)."""
        p = self.params
        logits = logits.to(torch.float32)
        if p.penalized and history:
            logits = apply_penalties(logits, history[-p.repeat_last_n:], p)
        if p.greedy:
            return int(torch.argmax(logits))
        k = p.top_k if 0 < p.top_k < logits.shape[0] else logits.shape[0]
        # sorted, largest first; at least the device's KMAX candidates, so that the arithmetic over
        # them is the device's (kernels.sample.sample_rows) and both pick the same token
        values, ids = torch.topk(logits, max(k, min(KMAX, logits.shape[0])))

        def row(v: float) -> torch.Tensor:
            return torch.tensor([v], dtype=torch.float32)

        u = row(uniform(self.seed, index))
        choice = pick_from_top(values[None], ids[None], torch.tensor([k]), row(p.temperature), row(p.top_p),
                               row(p.min_p), u)
        return int(choice[0])


def apply_repeat_penalty(logits: torch.Tensor, recent: list[int], penalty: float) -> torch.Tensor:
    """llama.cpp's repetition penalty: a seen token's logit is divided by `penalty` when positive,
    multiplied when negative. Returns a new tensor."""
    return apply_penalties(logits, recent, SamplingParams(repeat_penalty=penalty))


def apply_penalties(logits: torch.Tensor, recent: list[int], p: SamplingParams) -> torch.Tensor:
    """Repetition, frequency and presence penalties over the tokens in `recent`. A new tensor.
    A token masked out (-inf: a grammar refuses it) stays -inf: a repeat penalty that rounds to 0 in
    float32 (any valid value below ~1e-45; the schema fuzz sent 5e-324) would otherwise make it
    -inf * 0 = NaN, which greedy's argmax picks (a grammar-refused token, a 500)."""
    out = logits.clone()
    ids, counts = torch.tensor(recent, dtype=torch.long).unique(return_counts=True)
    seen = out[ids]
    if p.repeat_penalty != 1.0:
        scaled = torch.where(seen > 0, seen / p.repeat_penalty, seen * p.repeat_penalty)
        seen = torch.where(seen == float("-inf"), seen, scaled)
    seen = seen - p.frequency_penalty * counts.to(seen.dtype) - p.presence_penalty
    out[ids] = seen
    return out
