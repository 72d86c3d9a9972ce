"""The vulkan backend's captured decode step: `_Replay` records a step of B rows once (the wgpu
device's capture) and replays it; `PickedStep`, a launched decode step's picked tokens; `_State`,
one pass's inputs (what `Plan.run` reads)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ...kernels.wgpu.device import VkTensor
from ..base import Batch

if TYPE_CHECKING:
    from .backend import WGPUBackend


class _State:
    __slots__ = ("inputs", "kind", "rows")

    def __init__(self, inputs: dict[str, VkTensor], rows: int):
        self.inputs, self.rows = inputs, rows
        self.kind = "row" if rows == 1 else "chunk"


class PickedStep:
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


class _Replay:
    """The decode step of `rows` rows, captured once (wgpu_device.Device.capture) and replayed:
    the host writes the step's positions and slots (and tokens, unless they come on the device
    from the step before), and the recorded dispatches are submitted as they are. The picked
    tokens are copied out to one of two staging buffers, so the step after may run before the
    host reads them (the engine keeps at most one step in flight). A launched step is encoded at
    once and submitted at the next device call; reading the step before's tokens submits it right
    after their read, so the host encodes step N+1 while the device runs step N, and the read of
    N's tokens does not wait for N+1 (a read waits for everything submitted before it)."""

    def __init__(self, be: WGPUBackend, rows: int):
        dev = self.dev = be.dev
        self.rows = rows
        self.io = {n: dev.empty((rows,), "I32") for n in ("tokens", "positions", "row_slots", "out_rows")}
        dev.write(self.io["out_rows"], torch.arange(rows, dtype=torch.int32))

        def step():
            logits = be.plan.run(_State(self.io, rows))
            return logits, be._pick(x=logits)

        self.rec, (self.logits, self.picked) = dev.capture(step)
        self.stages = [dev.empty((rows,), "I32") for _ in range(2)]
        self.turn = 0

    def launch(self, batch: Batch, after: PickedStep | None = None) -> PickedStep:
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
        return PickedStep(self.rows, stage)
