"""Perplexity with llama-perplexity's method, so numbers compare with llama.cpp's.

The text is tokenized without BOS and without special-token parsing and cut into chunks of
n_ctx tokens (a partial last chunk is dropped). Each chunk is a fresh sequence whose first
token is replaced by BOS; only the second half is scored: positions n_ctx/2 .. n_ctx-2 predict
tokens n_ctx/2+1 .. n_ctx-1. A chunk's NLL is the mean over its scored tokens, and
PPL = exp(mean of all scored NLLs) (= exp(mean of chunk NLLs): chunks score equally many).
The ± is llama.cpp's: PPL * sqrt(var(nll) / (N - 1)) over all N scored tokens.

Each chunk runs through the engine like any request: a sequence that generates nothing
(max_tokens 0) and keeps the logits of its scored positions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import ContextOverflowError, MinferError
from .engine import Engine
from .params import SamplingParams


@dataclass(frozen=True)
class PerplexityResult:
    n_ctx: int
    nll_per_chunk: list[float]
    ppl: float
    ppl_error: float
    n_scored: int
    seconds: float

    @property
    def chunks(self) -> int:
        return len(self.nll_per_chunk)


def perplexity(engine: Engine, tokenizer, text: str, n_ctx: int = 512,
               on_chunk: Callable[[int, int, float], None] | None = None) -> PerplexityResult:
    """Score `text`; `on_chunk(index, n_chunks, running_ppl)` is called after each chunk."""
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 4 or n_ctx % 2:
        raise MinferError(f"perplexity context must be an even number >= 4, got {n_ctx}")
    if n_ctx > engine.n_ctx:
        raise ContextOverflowError(f"perplexity chunks of {n_ctx} tokens need a context of {n_ctx}; "
                                   f"the model is loaded with {engine.n_ctx}")
    bos = tokenizer.bos_id
    if bos is None:
        raise MinferError("perplexity puts BOS at each chunk start, but the tokenizer has no BOS token")
    tokens = tokenizer.encode(text, add_special=False, parse_special=False)
    n_chunks = len(tokens) // n_ctx
    if n_chunks == 0:
        raise MinferError(f"the text has {len(tokens)} tokens; perplexity needs at least one chunk "
                          f"of {n_ctx}")
    first = n_ctx // 2
    t0 = time.perf_counter()
    chunk_nll: list[float] = []
    total = total_sq = 0.0
    count = 0
    score = SamplingParams(max_tokens=0)
    for c in range(n_chunks):
        chunk = tokens[c * n_ctx:(c + 1) * n_ctx]
        chunk[0] = bos
        seq = engine.add(chunk, score, logit_rows=range(first, n_ctx - 1), reuse_prefix=False)
        engine.run([seq])
        logits = torch.cat(seq.prompt_logits)
        targets = torch.tensor(chunk[first + 1:], dtype=torch.long)
        # float32 log-softmax (error ~1e-6 per token), float64 sums across tokens and chunks
        nll = -torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0].to(torch.float64)
        chunk_nll.append(float(nll.mean()))
        total += float(nll.sum())
        total_sq += float((nll * nll).sum())
        count += nll.numel()
        if on_chunk is not None:
            on_chunk(c, n_chunks, math.exp(total / count))
    mean = total / count
    var = total_sq / count - mean * mean
    ppl = math.exp(mean)
    err = ppl * math.sqrt(var / (count - 1)) if var > 0 and count > 1 else 0.0
    return PerplexityResult(n_ctx, chunk_nll, ppl, err, count, time.perf_counter() - t0)
