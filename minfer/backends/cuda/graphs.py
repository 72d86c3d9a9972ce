"""The cuda backend's captured steps: CUDA graphs of decode steps and prompt chunks.

A decode step of B rows is captured once per batch bucket (1, 2, 4 ... 64; rows padded up to the
bucket into the spare slot), greedy or sampling, and for rows under a grammar (`masked`) as two
graphs: the forward, then the pick from logits masked by a bitmask the host uploads once the
grammar's state after the step before is known (the forward is queued before that); a prompt
chunk (every span of the step at once, up to PREFILL_SPANS of them) once per row bucket
(64 ... 1024), its spans read on the device from a tile table. Each graph's inputs are one int32
device buffer filled from pinned staging memory by one copy per step, and its picked tokens
(decode) go back to pinned host memory, so the engine queues step N+1 before it reads step N.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...kernels.sample import PARAM_ROWS, apply_bitmask
from ...kernels.triton._common import as_in_graphs
from ...kernels.triton.attention import max_prefill_tiles, prefill_tiles
from ..base import Batch

BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # decode batch sizes captured as CUDA graphs
PREFILL_BUCKETS = (64, 128, 192, 256, 384, 512, 768, 1024)  # prompt-chunk row counts captured as graphs
PREFILL_SPANS = 8  # prompts one captured prompt-chunk pass holds (the tile table's capacity)
PREFILL_OUT = 16  # logits rows one captured prompt-chunk pass returns


# the ways a decode step runs by its rows: kernels are picked for each at its row count (backend.KINDS), so a
# batch of 2 or of 3-4 rows gets the GEMVs where their contracts' fast paths hold (large weights) and cuBLAS
# elsewhere; from 5 rows the batch way (picked at 16 rows)
DECODE_KINDS = (("row", 1), ("rows2", 2), ("rows4", 4))


def decode_kind(rows: int) -> str:
    """The way a decode step of `rows` rows runs (DECODE_KINDS, else "batch")."""
    return next((kind for kind, most in DECODE_KINDS if rows <= most), "batch")


class State:
    """One pass of the plan: the step's device inputs, the way it runs (`kind`: a decode row, a
    decode batch or a prompt chunk), its row count, the host's (first row, slot, start, rows) per
    sequence (None inside graphs), the attention tile table of a prompt chunk, and `aux`: the
    side values nodes hand each other during the pass (bindings.py)."""

    __slots__ = ("inputs", "rows", "kind", "spans", "tiles", "aux")

    def __init__(self, inputs: dict[str, torch.Tensor], decode: bool, rows: int, spans=None, tiles=None):
        self.inputs, self.rows, self.spans, self.tiles = inputs, rows, spans, tiles
        self.kind = decode_kind(rows) if decode else "chunk"
        self.aux: dict = {}


class CudaPicked:
    """A launched decode step (`CUDABackend.decode_pick`): its picked tokens, on the device, and
    (graphs) their pinned host copy with the event that says it has landed. A masked step
    (`decode_pick(masked=True)`) is launched without its pick: `pick(bits)` queues it, with the
    rows' grammar bitmasks, before its tokens are read or a step is launched after it."""

    __slots__ = ("rows", "picked", "host", "done", "_finish")

    def __init__(self, rows: int, picked: torch.Tensor | None, host: torch.Tensor | None = None, done=None,
                 finish: Callable[[torch.Tensor], None] | None = None):
        self.rows, self.picked, self.host, self.done, self._finish = rows, picked, host, done, finish

    @property
    def pending(self) -> bool:
        """Launched without its pick: `pick(bits)` has not been called yet."""
        return self._finish is not None

    def pick(self, bits: torch.Tensor) -> None:
        """Queue the masked pick: `bits` int32 [rows, ceil(V / 32)] (host, pinned on a GPU), bit j
        of word w allowing token 32 w + j in that row (-1: every token)."""
        if self._finish is None:
            raise RuntimeError("CudaPicked.pick: this step was not launched masked, or was picked already")
        if bits.dtype != torch.int32 or bits.dim() != 2 or bits.shape[0] != self.rows:
            raise RuntimeError(f"CudaPicked.pick: bits must be int32 [{self.rows}, words], got "
                               f"{bits.dtype} {tuple(bits.shape)}")
        finish, self._finish = self._finish, None
        finish(bits)

    def tokens(self) -> list[int]:
        """The picked token of every row, in row order (waits for the step)."""
        if self._finish is not None:
            raise RuntimeError("CudaPicked.tokens: a masked step's pick(bits) must come first")
        if self.done is None:
            return self.picked[:self.rows].tolist()
        self.done.synchronize()
        return self.host[:self.rows].tolist()


def capture(backend, step: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph, object]:
    """`step` run twice eagerly on a side stream (Triton compiles and autotunes outside the
    capture), then captured into a graph on the backend's shared memory pool; (graph, what the
    captured call returned: its static outputs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), as_in_graphs():
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    if backend.pool is None:
        backend.pool = torch.cuda.graph_pool_handle()
    with torch.cuda.graph(graph, pool=backend.pool):
        out = step()
    return graph, out


class DecodeGraph:
    """The decode step of `bucket` rows, captured once, picking tokens by argmax or (`sampling`)
    by the Sample contract. Inputs: one int32 [3, bucket] device buffer (tokens, positions, slots;
    [3 + 7, bucket] with each row's packed sampling parameters), filled from one of two pinned
    staging buffers by one copy per step (two, so the host stages step N+1 while step N's copy may
    still be queued); outputs: the logits and the picked tokens, copied to one of two pinned host
    buffers per step. Padded rows sample at temperature 0 (parameters all zero): the argmax.
    `masked`: the forward and the pick are two graphs; the pick reads the logits through a device
    bitmask (int32 [bucket, ceil(V / 32)], padded rows all ones) that `pick` fills first."""

    def __init__(self, backend, bucket: int, sampling: bool = False, masked: bool = False):
        dev = backend.device
        self.bucket, self.sampling, self.masked = bucket, sampling, masked
        width = 3 + (PARAM_ROWS if sampling else 0)
        self.io = torch.zeros(width, bucket, dtype=torch.int32, device=dev)
        self.io[2].fill_(backend.pad_slot)
        self.stages = [torch.zeros(width, bucket, dtype=torch.int32, pin_memory=True) for _ in range(2)]
        self.hosts = [torch.zeros(bucket, dtype=torch.int32, pin_memory=True) for _ in range(2)]
        self.copied = [torch.cuda.Event() for _ in range(2)]
        self.turn = 0
        self.static = {"tokens": self.io[0], "positions": self.io[1], "row_slots": self.io[2],
                       "out_rows": torch.arange(bucket, dtype=torch.int32, device=dev)}
        state = State(self.static, True, bucket)
        params = self.io[3:] if sampling else None

        if masked:
            self.graph, self.out = capture(backend, lambda: backend.plan.run(state))
            self.bits = torch.full((bucket, (self.out.shape[-1] + 31) // 32), -1, dtype=torch.int32, device=dev)
            self.pick_graph, self.picked = capture(backend, lambda: backend.pick(apply_bitmask(self.out, self.bits),
                                                                                 params))
        else:
            def step():
                out = backend.plan.run(state)
                return out, backend.pick(out, params)

            self.graph, (self.out, self.picked) = capture(backend, step)
        for e in self.copied:
            e.record()

    def launch(self, batch: Batch, pad_slot: int, after: CudaPicked | None = None,
               params: torch.Tensor | None = None) -> int:
        """Stage the batch's inputs (tokens from `after`'s picked tokens, on the device, when
        given; `params`, int32 [7, B], the rows' sampling parameters for a sampling graph), replay;
        returns the turn whose host buffer `pick_to_host` fills."""
        b, turn = batch.n_tokens, self.turn
        self.turn ^= 1
        stage, copied = self.stages[turn], self.copied[turn]
        copied.synchronize()  # this buffer's previous copy has left it
        if after is None:
            stage[0, :b].copy_(batch.tokens)
        stage[1, :b].copy_(batch.positions)
        stage[2, :b].copy_(batch.row_slots)
        if self.sampling:
            stage[3:, :b].copy_(params)
        if b < self.bucket:  # padded rows: token 0 at position 0 of the spare slot
            stage[:2, b:].zero_()
            stage[2, b:].fill_(pad_slot)
            stage[3:, b:].zero_()
        if after is None:
            self.io.copy_(stage, non_blocking=True)  # one host-to-device copy of the step's inputs
        else:
            self.io[1:].copy_(stage[1:], non_blocking=True)
            self.io[0, :b].copy_(after.picked[:b])  # device to device: the host never saw them
        copied.record()
        self.graph.replay()
        return turn

    def pick_to_host(self, turn: int, rows: int) -> CudaPicked:
        """The launched step's picked tokens; for a masked graph a pending step whose `pick(bits)`
        uploads the bitmask (pinned host memory, read before the next step's tokens are: one
        buffer is enough) and replays the pick."""
        if not self.masked:
            return self._to_host(CudaPicked(rows, self.picked), turn)

        def finish(bits: torch.Tensor) -> None:
            with torch.inference_mode():
                self.bits[:rows].copy_(bits, non_blocking=True)
                if rows < self.bucket:
                    self.bits[rows:].fill_(-1)  # (padded rows: whatever an earlier, larger step left)
                self.pick_graph.replay()
                self._to_host(picked, turn)

        picked = CudaPicked(rows, self.picked, finish=finish)  # (`finish` completes it)
        return picked

    def _to_host(self, picked: CudaPicked, turn: int) -> CudaPicked:
        host = self.hosts[turn]
        host.copy_(self.picked, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        picked.host, picked.done = host, done
        return picked


class PrefillGraph:
    """A prompt-chunk pass of `bucket` rows, captured once: up to PREFILL_SPANS spans, up to
    PREFILL_OUT logits rows. Its inputs are one int32 device buffer (tokens, positions, slots,
    the attention tile table, the output rows) filled from a pinned staging copy by one copy per
    step. Padded rows are token 0 at position 0 of the spare slot and in no tile; unused tiles
    hold 0 rows; padded output rows repeat row 0."""

    def __init__(self, backend, bucket: int):
        dev = backend.device
        self.bucket = bucket
        self.n_tiles = max_prefill_tiles(bucket, PREFILL_SPANS)
        b, t = bucket, self.n_tiles
        self.io = torch.zeros(3 * b + 4 * t + PREFILL_OUT, dtype=torch.int32, device=dev)
        self.stage = torch.zeros(self.io.shape, dtype=torch.int32, pin_memory=True)
        self.stage[2 * b:3 * b] = backend.pad_slot
        self.io.copy_(self.stage)
        self.copied = torch.cuda.Event()
        self.static = {"tokens": self.io[:b], "positions": self.io[b:2 * b], "row_slots": self.io[2 * b:3 * b],
                       "out_rows": self.io[3 * b + 4 * t:]}
        state = State(self.static, False, bucket, tiles=self.io[3 * b:3 * b + 4 * t].view(t, 4))
        self.graph, self.out = capture(backend, lambda: backend.plan.run(state))
        self.copied.record()

    @staticmethod
    def fits(batch: Batch) -> bool:
        return (batch.kind == "prefill" and batch.n_tokens <= PREFILL_BUCKETS[-1] and len(batch.spans) <= PREFILL_SPANS
                and len(batch.out_rows) <= PREFILL_OUT)

    def launch(self, batch: Batch, pad_slot: int) -> torch.Tensor:
        """Stage the batch, replay; the logits of its out_rows (the graph's own buffer: read it
        before this graph replays again)."""
        n, b, t, st = batch.n_tokens, self.bucket, self.n_tiles, self.stage
        self.copied.synchronize()  # the staging buffer's previous copy has left it
        st[:n].copy_(batch.tokens)
        st[n:b].zero_()
        st[b:b + n].copy_(batch.positions)
        st[b + n:2 * b].zero_()
        st[2 * b:2 * b + n].copy_(batch.row_slots)
        st[2 * b + n:3 * b].fill_(pad_slot)
        tiles = prefill_tiles([(s.offset, s.slot, s.start, s.n_tokens) for s in batch.spans])
        table = st[3 * b:3 * b + 4 * t].view(t, 4)
        table.zero_()
        table[:len(tiles)] = torch.tensor(tiles, dtype=torch.int32)
        rows = st[3 * b + 4 * t:]
        r = len(batch.out_rows)
        rows[:r].copy_(batch.out_rows)
        rows[r:].zero_()
        self.io.copy_(st, non_blocking=True)
        self.copied.record()
        self.graph.replay()
        return self.out[:r]
