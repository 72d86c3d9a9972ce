"""What every backend offers, and the per-step input it executes a graph on.

A backend is chosen when a model is loaded (`create_backend`); it prepares the graph's weights
once (`load`), owns device memory (`new_cache`), and runs one step (`forward`) returning the
logits of the batch's output rows. There is no fallback from one backend to another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..config import EngineConfig
from ..engine.kv_cache import KVCache
from ..errors import DeviceError
from ..gguf.reader import GGUFReader
from ..graph.ir import Graph


@dataclass(frozen=True)
class SeqSpan:
    """Tokens [offset, offset + n_tokens) of a batch are one sequence's positions start.. in `slot`."""

    slot: int
    start: int
    offset: int
    n_tokens: int


@dataclass(frozen=True)
class Batch:
    """One step: tokens of one or more sequences, concatenated (token-major).

    `out_rows` are the token rows whose logits the step returns (e.g. each sequence's last
    token while generating, every row for perplexity).
    """

    tokens: torch.Tensor  # int32 [T]
    positions: torch.Tensor  # int32 [T]
    spans: tuple[SeqSpan, ...]
    out_rows: torch.Tensor  # int32 [R]

    @classmethod
    def single(cls, tokens: list[int], start: int, slot: int = 0, rows: range | None = None,
               device: str | torch.device = "cpu") -> Batch:
        """One sequence's next `tokens` at positions start..; logits of `rows` (default: the last)."""
        n = len(tokens)
        rows = range(n - 1, n) if rows is None else rows
        return cls(
            tokens=torch.tensor(tokens, dtype=torch.int32, device=device),
            positions=torch.arange(start, start + n, dtype=torch.int32, device=device),
            spans=(SeqSpan(slot, start, 0, n),),
            out_rows=torch.tensor(list(rows), dtype=torch.int32, device=device),
        )

    @property
    def n_tokens(self) -> int:
        return self.tokens.shape[0]


class Backend(Protocol):
    name: str

    def load(self, graph: Graph, reader: GGUFReader, progress: bool = True) -> None: ...

    def new_cache(self, n_slots: int, n_ctx: int) -> KVCache: ...

    def forward(self, batch: Batch, cache: KVCache, recorder=None) -> torch.Tensor: ...

    def trace_graph(self) -> list[dict]: ...


def create_backend(device: str, config: EngineConfig) -> Backend:
    """The backend for `device`: "cpu" now; "cuda" is where the Triton backend will plug in."""
    if device == "cpu":
        from .cpu import CPUBackend

        return CPUBackend(config)
    if device == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError("device 'cuda' requested but no CUDA GPU is visible to torch; use device='cpu'")
        raise DeviceError("device 'cuda': the cuda backend is not part of this build yet; use device='cpu'")
    raise DeviceError(f"unknown device {device!r}; available: cpu")
