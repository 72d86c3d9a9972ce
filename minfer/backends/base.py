"""What every backend offers, and the per-step input it runs a graph on.

A backend is created for one model (`backends.create_backend`), prepares the graph's weights
once (`load`), allocates its KV cache once at fixed addresses (`allocate`), and runs one step
(`forward`), returning the logits of the batch's output rows. There is no fallback from one
backend to another.

A `Batch` is one step of many sequences: their new tokens concatenated token-major. Decode rows
(one token of a sequence that is generating) come first, then at most a few prefill spans.
Everything a kernel needs is in int32 tensors on the backend's device, so a GPU reads it with no
host work: token ids, positions, the slot of every row, per sequence its slot, first position
and token count, and the rows whose logits the step returns. The same facts are kept on the host
as `spans` for backends that loop over sequences.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol

import torch

from ..errors import ContextOverflowError, MinferError, UnsupportedError
from ..gguf.reader import GGUFReader
from ..graph.ir import Graph, WeightRef
from ..quant.reference import dequantize


@dataclass(frozen=True)
class SeqSpan:
    """Rows [offset, offset + n_tokens) of a batch are one sequence's tokens at positions
    start.. in its KV-cache `slot` (start = how many tokens the slot already holds)."""

    slot: int
    start: int
    offset: int
    n_tokens: int

    @property
    def end(self) -> int:
        """Position after the span's last token: the sequence's cached length after the step."""
        return self.start + self.n_tokens


@dataclass(frozen=True)
class Batch:
    tokens: torch.Tensor  # int32 [T]
    positions: torch.Tensor  # int32 [T]
    row_slots: torch.Tensor  # int32 [T]: the KV-cache slot of each row
    seq_slots: torch.Tensor  # int32 [S]
    seq_starts: torch.Tensor  # int32 [S]: first position of each sequence's tokens in this step
    seq_lens: torch.Tensor  # int32 [S]: tokens of each sequence in this step
    out_rows: torch.Tensor  # int32 [R]: rows whose logits forward() returns, in this order
    spans: tuple[SeqSpan, ...]
    n_decode: int  # spans[:n_decode] are one-token decode steps, rows 0..n_decode-1

    @classmethod
    def build(cls, spans: list[tuple[int, int, list[int]]], out_rows: list[int], n_decode: int = 0,
              device: str | torch.device = "cpu") -> Batch:
        """From (slot, start, tokens) per sequence, in row order, and the rows to return."""
        tokens: list[int] = []
        positions: list[int] = []
        row_slots: list[int] = []
        made = []
        for slot, start, toks in spans:
            if not toks:
                raise MinferError(f"batch: the span of slot {slot} has no tokens")
            made.append(SeqSpan(slot, start, len(tokens), len(toks)))
            tokens += toks
            positions += range(start, start + len(toks))
            row_slots += [slot] * len(toks)
        if not 0 <= n_decode <= len(made) or any(s.n_tokens != 1 for s in made[:n_decode]):
            raise MinferError(f"batch: n_decode {n_decode} must count leading one-token spans")
        if any(not 0 <= r < len(tokens) for r in out_rows):
            raise MinferError(f"batch: output rows {out_rows} outside 0..{len(tokens) - 1}")

        cols = (tokens, positions, row_slots, [s.slot for s in made], [s.start for s in made],
                [s.n_tokens for s in made], out_rows)
        # one tensor made, the seven fields its slices (a decode step's host work: one construction, not seven)
        flat = torch.tensor([v for c in cols for v in c], dtype=torch.int32, device=device)
        return cls(*flat.split([len(c) for c in cols]), tuple(made), n_decode)

    @classmethod
    def single(cls, tokens: list[int], start: int, slot: int = 0, rows: range | None = None,
               device: str | torch.device = "cpu") -> Batch:
        """One sequence's `tokens` at positions start..; logits of `rows` (default: the last)."""
        rows = range(len(tokens) - 1, len(tokens)) if rows is None else rows
        return cls.build([(slot, start, list(tokens))], list(rows), device=device)

    def check(self, n_slots: int, n_ctx: int) -> None:
        """Typed errors for a span outside the cache: a slot past n_slots, positions past n_ctx."""
        for s in self.spans:
            if not 0 <= s.slot < n_slots:
                raise MinferError(f"batch: slot {s.slot} outside 0..{n_slots - 1}")
            if s.start < 0 or s.end > n_ctx:
                raise ContextOverflowError(f"positions {s.start}..{s.end - 1} do not fit the context of {n_ctx} "
                                           "tokens")

    @property
    def n_tokens(self) -> int:
        return self.tokens.shape[0]

    @property
    def kind(self) -> str:
        """"decode" (only decode rows), "prefill" (none) or "mixed"."""
        if self.n_decode == len(self.spans):
            return "decode"
        return "mixed" if self.n_decode else "prefill"

    def split(self) -> tuple[tuple[Batch, list[int]], ...]:
        """The decode rows and the prefill rows as two batches, each with the positions in this
        batch's out_rows that its logits fill. A backend that keeps the decode path for decode
        rows whatever else the step carries runs the two parts separately."""
        if self.kind != "mixed":
            return ((self, list(range(len(self.out_rows)))),)
        rows, toks = self.out_rows.tolist(), self.tokens.tolist()
        nd = self.n_decode
        parts = []
        for spans, lo, hi in ((self.spans[:nd], 0, nd), (self.spans[nd:], nd, self.n_tokens)):
            idx = [i for i, r in enumerate(rows) if lo <= r < hi]
            sub = [(s.slot, s.start, toks[s.offset:s.offset + s.n_tokens]) for s in spans]
            parts.append((Batch.build(sub, [rows[i] - lo for i in idx], len(spans) if lo == 0 else 0,
                                      self.tokens.device), idx))
        return tuple(parts)


class Picked(Protocol):
    """A decode step launched by `Backend.decode_pick`: its rows and (waiting for it) their tokens."""

    rows: int

    def tokens(self) -> list[int]: ...


class HostPicked:
    """A step whose tokens were picked on the host (the default `decode_pick`)."""

    __slots__ = ("rows", "_tokens")

    def __init__(self, tokens: list[int]):
        self.rows, self._tokens = len(tokens), tokens

    def tokens(self) -> list[int]:
        return self._tokens


class Backend(ABC):
    """Everything the engine, tensor parallelism, the server, `minfer plan` and the benchmarks
    call on a backend. A backend is a runtime: memory, launches, and (GPUs) capture and replay;
    which kernel runs a node is the contracts' business (compile.py), the graph's fusions
    graph/fuse.py's. Methods with a body are defaults for a backend that has nothing to do."""

    name: str
    kv_itemsize: float  # bytes per cached key/value element (17/16 for a Q8_0 cache)
    prefill_seqs: int  # prompts the scheduler may chunk into one step (1: rows independent of the batch)
    device_pick: bool = False  # decode_pick picks the tokens in the backend (and, with queues_ahead, on the device)
    masked_pick: bool = False  # decode_pick(masked=True): the pick waits for the rows' grammar bitmasks (`pick(bits)`)
    queues_ahead: bool = True  # with device_pick: step N+1 queued before N is read (False: each step read at once)
    kv_copy: bool = False  # copy_kv works: the engine's prefix cache may reuse blocks across slots
    graph: Graph | None = None

    @abstractmethod
    def kv_budget(self) -> int:
        """Bytes the KV cache may take when the caller lets the engine choose the slot count."""

    @abstractmethod
    def load(self, graph: Graph, reader: GGUFReader, progress: bool = True) -> None:
        """Prepare every weight the graph reads (once) and compile the graph into a plan."""

    @abstractmethod
    def allocate(self, n_slots: int, n_ctx: int) -> None:
        """Allocate the KV cache: n_slots sequences of up to n_ctx tokens (typed error if it does
        not fit the device)."""

    @abstractmethod
    def forward(self, batch: Batch, recorder=None) -> torch.Tensor:
        """float32 logits [R, n_vocab] of the batch's out_rows; writes the step's keys/values."""

    def hidden(self, batch: Batch) -> torch.Tensor:
        """float32 [R, n_embd]: the final hidden state (after the output norm) of the batch's
        out_rows, for embeddings; writes the step's keys/values like `forward`."""
        self.check_hidden()
        raise AssertionError("unreachable: check_hidden raises where hidden is not overridden")

    def check_hidden(self) -> None:
        """UnsupportedError unless this backend computes `hidden` (overrides it): the engine asks
        when an embedding is queued, so that request fails alone, not the step it would share."""
        if type(self).hidden is Backend.hidden:
            raise UnsupportedError(f"the {self.name} backend does not compute embeddings (cpu and cuda do)")

    @abstractmethod
    def trace_graph(self) -> list[dict]:
        """The graph's nodes for TraceRecorder.set_graph, each with the kernel that runs it."""

    @abstractmethod
    def plan_rows(self, rows: int = 1, prefill: bool = False) -> list[dict]:
        """Per node with a kernel: what a step of `rows` decode rows (or, `prefill`, a prompt
        chunk of `rows` tokens) runs for it and the cost the picker predicts (`minfer plan`)."""

    def greedy_tokens(self, logits: torch.Tensor) -> list[int]:
        """Each row's greedy token of logits [R, V] this backend returned (the first of equal maxima,
        a NaN the largest: torch.argmax's rule); the cpu backend's runs in C."""
        return torch.argmax(logits, dim=-1).tolist()

    def decode_pick(self, batch: Batch, after: Picked | None = None, params: torch.Tensor | None = None) -> Picked:
        """Run a decode step (one token per sequence, out_rows 0..B-1) and pick each row's next
        token: the argmax, or with `params` (int32 [7, B], kernels/sample.py pack_params) the
        row's draw. `after`: the step before, whose picked tokens are this step's inputs. This
        default runs `forward` and picks on the host; `device_pick` backends launch and return."""
        from ..kernels.sample import sample_rows

        if after is not None:
            toks = after.tokens()
            batch = Batch.build([(s.slot, s.start, [t]) for s, t in zip(batch.spans, toks, strict=True)],
                                list(range(len(toks))), n_decode=len(toks), device=batch.tokens.device)
        logits = self.forward(batch).float().cpu()
        if params is None:
            return HostPicked(self.greedy_tokens(logits))
        return HostPicked(sample_rows(logits, params.cpu()).tolist())

    def copy_kv(self, src: int, dst: int, n: int) -> None:
        """Copy the cached keys/values of positions 0..n from slot `src` to slot `dst` (every
        layer), ordered before the next step. Backends with `kv_copy` implement it."""
        raise UnsupportedError(f"the {self.name} backend cannot copy KV rows between slots (cpu and cuda can)")

    def warmup(self) -> None:
        """Compile and capture what the first requests would otherwise wait for (a server calls
        this before it is ready). Nothing by default."""
        return None

    def close(self) -> None:
        """Release what the backend holds beyond memory (other ranks, devices). Nothing by default."""
        return None

    def decode_weight_bytes(self) -> int | None:
        """Bytes of weights one decode row reads in the backend's own layouts (None: the file's)."""
        return None

    def copy_bandwidth(self) -> float | None:
        """The device's copy bandwidth in bytes/s, measured now (None: the benchmark measures it)."""
        return None


def read_vector(reader: GGUFReader, w: WeightRef) -> torch.Tensor:
    """A 1-D weight (a norm's gain, a bias; a fused one is its parts end to end) as float32 on the
    host, dequantized from the file: what a GPU backend uploads once. A 2-D one (gpt-oss's expert
    biases (n, E)) comes flat, in memory order: expert e's n values at e * n."""
    parts = []
    for t in w.tensors:
        info, host = reader.tensors[t.name], torch.from_numpy(reader.tensor_bytes(t.name))
        parts.append(dequantize(host, info.ggml_type, (math.prod(info.shape),)).float())
    return torch.cat(parts)
