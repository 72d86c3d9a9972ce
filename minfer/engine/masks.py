"""Per-step logits changes before sampling: grammar masks (engine/grammar.py) and logit biases.

`Masks.begin(rows)` starts computing the allowed-token bitmasks of the step's constrained rows
on the host (a worker thread; llguidance's executor spreads the rows over its own threads with
the GIL released) and returns at once, so the backend runs the step's forward meanwhile (on cuda
the forward only launches; on cpu it computes, in this thread, while the masks are computed in
the other). `finish` waits for them and applies them where the logits live: on cuda one int32
word per 32 tokens is uploaded (from pinned memory) and expanded on the device.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch

from .grammar import Matcher, llguidance


def apply_bitmask(logits: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """`logits` [R, V] with every token whose bit is 0 in `bits` (int32 [R, ceil(V / 32)], on
    the logits' device; bit j of word w is token 32 w + j) set to -inf. Out of place."""
    shifts = torch.arange(32, dtype=torch.int32, device=bits.device)
    allowed = ((bits.unsqueeze(-1) >> shifts) & 1).reshape(bits.shape[0], -1)[:, :logits.shape[-1]]
    return logits.masked_fill(allowed == 0, float("-inf"))


def add_logit_bias(logits: torch.Tensor, biases: list[tuple[tuple[tuple[int, float], ...], int]]) -> torch.Tensor:
    """`logits` [R, V] plus each (((token, bias), ...), row) given. Out of place."""
    out = logits.clone()
    for pairs, row in biases:
        ids = torch.tensor([t for t, _ in pairs], dtype=torch.long, device=logits.device)
        out[row, ids] += torch.tensor([b for _, b in pairs], dtype=out.dtype, device=logits.device)
    return out


Pending = tuple[Future, list[int], torch.Tensor]  # (the masks being computed, their logits rows, the bitmasks)


class Masks:
    """One engine's mask computations: a worker thread, llguidance's executor and a (pinned, on
    cuda) bitmask buffer reused from step to step (every step reads its sampled tokens back
    before the next one starts, so the buffer's upload has landed by then)."""

    def __init__(self, pinned: bool):
        self.pinned = pinned
        self._pool: ThreadPoolExecutor | None = None
        self._executor = None
        self._buffer: torch.Tensor | None = None

    def _bits(self, rows: int, words: int) -> torch.Tensor:
        if self._buffer is None or self._buffer.shape[0] < rows or self._buffer.shape[1] != words:
            self._buffer = torch.empty(max(rows, 8), words, dtype=torch.int32, pin_memory=self.pinned)
        return self._buffer[:rows]

    def begin(self, rows: list[tuple[Matcher, int]], n_vocab: int) -> Pending | None:
        """Start the masks of (matcher, logits row) pairs; None when there are none."""
        if not rows:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="minfer-masks")
            self._executor = llguidance().LLExecutor()
        bits = self._bits(len(rows), (n_vocab + 31) // 32)
        pairs = [(m.inner, i) for i, (m, _) in enumerate(rows)]

        def fill() -> None:
            self._executor.unsafe_compute_mask_ptr(pairs, bits.data_ptr(), bits.shape[1] * 4, bits.shape[0])

        return self._pool.submit(fill), [r for _, r in rows], bits

    def finish(self, pending: Pending | None, logits: torch.Tensor, biases=()) -> torch.Tensor:
        """`logits` with the biases added and the pending masks applied (out of place)."""
        if biases:
            logits = add_logit_bias(logits, list(biases))
        if pending is None:
            return logits
        done, rows, bits = pending
        done.result()
        idx = torch.tensor(rows, dtype=torch.long, device=logits.device)
        masked = apply_bitmask(logits.index_select(0, idx), bits.to(logits.device, non_blocking=True))
        return logits.index_copy(0, idx, masked)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
