"""Per-step logits changes before sampling: grammar masks (engine/grammar.py) and logit biases.

`Masks.rows(matchers)` computes the bitmasks of a decode step whose tokens the backend picks on the
device (`Backend.masked_pick`): one row per sequence, every token allowed where a row has no
grammar; the engine calls it while the step's forward runs and hands the result to the launched
step's `pick(bits)`.
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

from ..kernels.sample import apply_bitmask
from .grammar import Matcher, llguidance


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

    def rows(self, matchers: list[Matcher | None], n_vocab: int) -> torch.Tensor:
        """int32 [len(matchers), ceil(n_vocab / 32)] (pinned on cuda): each row's allowed tokens
        under its matcher, all ones where the matcher is None. Computed now, one matcher after
        another in this thread (each call releases the GIL): on the H200's host 16 rows of a
        length-bounded-string grammar take 1.7-1.9 ms with the tokenizer view's slices
        (engine/grammar.py), under a 7B's 16-row forward (4.9 ms); split over 2-8 threads, or
        through llguidance's parallel executor, they were no faster (bench/NOTES.md, stops 37, 43)."""
        bits = self._bits(len(matchers), (n_vocab + 31) // 32)
        bits.fill_(-1)
        row_bytes = bits.shape[1] * 4
        for i, m in enumerate(matchers):
            if m is not None:
                m.inner.unsafe_compute_mask_ptr(bits.data_ptr() + i * row_bytes, row_bytes)
        return bits

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
