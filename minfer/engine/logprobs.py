"""Log-probabilities of sampled tokens, for requests that ask for them (the server's `logprobs`).

`token_logprobs(row, token, n)` reads the logits row the token was sampled from and returns the
token's log-softmax value and the `n` most likely tokens with theirs. The values are the
model's own distribution (log_softmax of the raw logits): before penalties, top-k/top-p/min-p
and temperature, as OpenAI reports them. The scheduler calls it only for sequences whose
`logprobs_n` is set (Sequence), so no other request pays for it.
"""

from __future__ import annotations

import torch

MAX_TOP_LOGPROBS = 20


def token_logprobs(row: torch.Tensor, token: int, n: int) -> tuple[float, list[tuple[int, float]]]:
    """(logprob of `token`, [(id, logprob)] of the n most likely tokens, most likely first)."""
    lp = torch.log_softmax(row.detach().float().cpu(), dim=-1)
    top: list[tuple[int, float]] = []
    if n > 0:
        values, ids = torch.topk(lp, min(n, lp.shape[0]))
        top = list(zip(ids.tolist(), values.tolist(), strict=True))
    return float(lp[token]), top
