"""The vulkan backend's steps: the per-pass state, and decode steps captured once and replayed.

A decode step of B rows (up to MAX_REPLAY_ROWS) is recorded once (Device.capture: the
dispatches with their buffers and params) and replayed every step after; the host writes the
positions and slots, the tokens come from the step before on the device, and no Python runs per
kernel. Its picked tokens go to one of two staging buffers, so the step after may run before the
host reads them.
"""

from __future__ import annotations

import torch

from ...kernels.wgpu.device import VkTensor
from ..base import Batch

MAX_REPLAY_ROWS = 64  # decode steps of up to this many rows are captured once and replayed


class State:
    """One pass of the plan: the step's device inputs, the way it runs, its row count, and `aux`:
    the side values nodes hand each other during the pass (bindings.py)."""

    __slots__ = ("inputs", "kind", "rows", "aux")
    spans = tiles = None  # (the attention kernels read the step's spans on the device)

    def __init__(self, inputs: dict[str, VkTensor], rows: int):
        self.inputs, self.rows = inputs, rows
        self.kind = "row" if rows == 1 else "chunk"
        self.aux: dict = {}


class VkPicked:
    """A launched decode step (`WGPUBackend.decode_pick`): its picked tokens on the device (or,
    for sampled rows, on the host)."""

    __slots__ = ("rows", "picked", "host")

    def __init__(self, rows: int, picked: VkTensor | None, host: list[int] | None = None):
        self.rows, self.picked, self.host = rows, picked, host

    def tokens(self) -> list[int]:
        """The picked token of every row, in row order (waits for the step)."""
        if self.host is None:  # read before the deferred next step is submitted: no wait for it
            self.host = self.picked.dev.download(self.picked, now=True)[:self.rows].tolist()
        return self.host


class Replay:
    """The decode step of `rows` rows, captured once (Device.capture) and replayed: the host
    writes the step's positions and slots (and tokens, unless they come on the device from the
    step before), and the recorded dispatches are submitted as they are. The picked tokens are
    copied out to one of two staging buffers, so the step after may run before the host reads
    them (the engine keeps at most one step in flight). A launched step is encoded at once and
    submitted at the next device call; reading the step before's tokens submits it right after
    their read, so the host encodes step N+1 while the device runs step N."""

    def __init__(self, be, rows: int):
        dev = self.dev = be.dev
        self.rows = rows
        self.io = {n: dev.empty((rows,), "I32") for n in ("tokens", "positions", "row_slots", "out_rows")}
        dev.write(self.io["out_rows"], torch.arange(rows, dtype=torch.int32))

        def step():
            logits = be.plan.run(State(self.io, rows))
            return logits, be.argmax(x=logits)

        self.rec, (self.logits, self.picked) = dev.capture(step)
        self.stages = [dev.empty((rows,), "I32") for _ in range(2)]
        self.turn = 0

    def launch(self, batch: Batch, after: VkPicked | None = None) -> VkPicked:
        dev, io = self.dev, self.io
        dev.write(io["positions"], batch.positions.to(torch.int32))
        dev.write(io["row_slots"], batch.row_slots.to(torch.int32))
        before = ()
        if after is None or after.picked is None:
            toks = batch.tokens if after is None else torch.tensor(after.host, dtype=torch.int32)
            dev.write(io["tokens"], toks.to(torch.int32))
        else:
            before = ((after.picked, io["tokens"]),)  # device to device: the host never saw them
        stage = self.stages[self.turn]
        self.turn ^= 1
        dev.replay(self.rec, before, ((self.picked, stage),), defer=True)
        return VkPicked(self.rows, stage)
