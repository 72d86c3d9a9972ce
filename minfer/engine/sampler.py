"""Sampling: turn one row of logits into the next token id (parameters: engine/params.py).

Each Sampler owns its own torch.Generator, seeded from the request's seed (or a fresh random
one), so a sequence draws the same tokens whatever else runs beside it.
"""

from __future__ import annotations

import random

import torch

from .params import SamplingParams


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.seed = params.seed if params.seed is not None else random.SystemRandom().randrange(2**63)
        self.generator = torch.Generator().manual_seed(self.seed % 2**64)

    def __call__(self, logits: torch.Tensor, history: list[int]) -> int:
        """Next token from logits [n_vocab]; `history` is the sequence so far (for the penalties)."""
        p = self.params
        logits = logits.to(torch.float32)
        if p.penalized and history:
            logits = apply_penalties(logits, history[-p.repeat_last_n:], p)
        if p.greedy:
            return int(torch.argmax(logits))
        k = p.top_k if 0 < p.top_k < logits.shape[0] else logits.shape[0]
        values, ids = torch.topk(logits, k)  # sorted, largest first
        keep = k
        if p.top_p < 1.0:
            cum = torch.softmax(values, 0).cumsum(0)
            # the smallest prefix whose mass reaches top_p (at least one token)
            keep = min(keep, int((cum < p.top_p).sum()) + 1)
        if p.min_p > 0.0:
            probs = torch.softmax(values[:keep], 0)
            keep = max(1, int((probs >= p.min_p * probs[0]).sum()))
        probs = torch.softmax(values[:keep] / p.temperature, 0)
        choice = torch.multinomial(probs, 1, generator=self.generator)
        return int(ids[choice])


def apply_repeat_penalty(logits: torch.Tensor, recent: list[int], penalty: float) -> torch.Tensor:
    """llama.cpp's repetition penalty: a seen token's logit is divided by `penalty` when positive,
    multiplied when negative. Returns a new tensor."""
    return apply_penalties(logits, recent, SamplingParams(repeat_penalty=penalty))


def apply_penalties(logits: torch.Tensor, recent: list[int], p: SamplingParams) -> torch.Tensor:
    """Repetition, frequency and presence penalties over the tokens in `recent`. A new tensor."""
    out = logits.clone()
    ids, counts = torch.tensor(recent, dtype=torch.long).unique(return_counts=True)
    seen = out[ids]
    if p.repeat_penalty != 1.0:
        seen = torch.where(seen > 0, seen / p.repeat_penalty, seen * p.repeat_penalty)
    seen = seen - p.frequency_penalty * counts.to(seen.dtype) - p.presence_penalty
    out[ids] = seen
    return out
