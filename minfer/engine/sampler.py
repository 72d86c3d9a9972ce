"""Sampling: turn one row of logits into the next token id.

The chain follows llama.cpp's default order: repetition penalty, top-k, top-p, min-p,
temperature, then a draw from the remaining distribution. temperature == 0 is greedy (argmax
after the penalty). A seed makes the draws reproducible: each Sampler owns its own
torch.Generator, so two generations never share random state.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from ..errors import MinferError


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.8
    top_k: int = 40  # 0: no limit
    top_p: float = 0.95  # 1.0: off
    min_p: float = 0.05  # 0.0: off
    repeat_penalty: float = 1.0  # 1.0: off; > 1 discourages tokens seen in the last repeat_last_n
    repeat_last_n: int = 64
    seed: int | None = None  # None: a fresh random seed
    stop: tuple[str, ...] = field(default=())
    ignore_eos: bool = False

    def __post_init__(self):
        checks = [
            (self.max_tokens >= 0, f"max_tokens must be >= 0, got {self.max_tokens}"),
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (self.repeat_penalty > 0, f"repeat_penalty must be > 0, got {self.repeat_penalty}"),
            (self.repeat_last_n >= 0, f"repeat_last_n must be >= 0, got {self.repeat_last_n}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise MinferError(f"sampling: {msg}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise MinferError("sampling: stop strings must be non-empty strings")
        object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.seed = params.seed if params.seed is not None else random.SystemRandom().randrange(2**63)
        self.generator = torch.Generator().manual_seed(self.seed)

    def __call__(self, logits: torch.Tensor, history: list[int]) -> int:
        """Next token from logits [n_vocab]; `history` is the sequence so far (for the penalty)."""
        p = self.params
        logits = logits.to(torch.float32)
        if p.repeat_penalty != 1.0 and p.repeat_last_n > 0 and history:
            logits = apply_repeat_penalty(logits, history[-p.repeat_last_n:], p.repeat_penalty)
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
    out = logits.clone()
    ids = torch.tensor(sorted(set(recent)), dtype=torch.long)
    seen = out[ids]
    out[ids] = torch.where(seen > 0, seen / penalty, seen * penalty)
    return out
