"""`Communicator`: torch.distributed for the ranks of one tensor-parallel model.

Two process groups. The data group runs the graph's collectives on the backend's device: NCCL
between GPUs (one process per GPU, `torch.cuda.set_device(local_rank)` before anything touches
the device), gloo between CPU processes. The control group is always gloo, on the host: rank 0
sends each step's command (engine/tp.py) through it, so a follower never waits on a GPU queue
to learn what to run, and data collectives never interleave with control messages.

CUDA graphs: `dist.all_reduce` / `all_gather` on the NCCL group are captured like kernels when
they are issued during a capture on a side stream (ProcessGroupNCCL skips its watchdog
bookkeeping while the stream captures; NCCL >= 2.9.6). cuda.py captures on a side stream, so
the decode graph holds its all-reduces and replays them. The NCCL communicator is created at
`init_process_group` (device_id given), not lazily inside a capture, and torch is asked to keep
a collective's tensors alive by reference rather than `record_stream` them
(TORCH_NCCL_AVOID_RECORD_STREAMS=1 unless the environment says otherwise: vLLM found
record_stream on graph-pool tensors to break capture). Nothing here sets an NCCL variable: the
machine's environment (e.g. NCCL_NVLS_ENABLE=0) is inherited as it is.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist

from ..config import set_process_env
from ..errors import ParallelError

TIMEOUT_S = 600  # a data collective that waits longer for a rank than this fails (a rank died or hung)
# A follower waits for rank 0's next command as long as rank 0 has nothing to do (an idle server):
# the control group's timeout is practically none. A rank that dies closes its sockets, which
# fails the others' gloo operations at once, so this does not make a dead peer hang anyone.
CONTROL_TIMEOUT_S = 365 * 24 * 3600


def _interpreting() -> bool:
    """Whether the cuda backend runs under the Triton interpreter (host tensors); DeviceError
    when triton is not installed."""
    from ..kernels import triton_interpreting  # triton: only for device "cuda"

    return triton_interpreting()


class Communicator:
    """This process's place among `world` ranks, and the collectives between them."""

    def __init__(self, rank: int, world: int, *, device: str = "cpu", local_rank: int | None = None,
                 addr: str = "127.0.0.1", port: int = 29500, timeout_s: float = TIMEOUT_S,
                 control_timeout_s: float = CONTROL_TIMEOUT_S):
        if world < 1 or not 0 <= rank < world:
            raise ParallelError(f"rank {rank} of {world}: expected 0 <= rank < world")
        self.rank, self.world, self.device = rank, world, device
        self.local_rank = rank if local_rank is None else local_rank
        # NCCL between GPUs; gloo between CPU processes, which includes the cuda backend under
        # the Triton interpreter (its tensors live on the host)
        self._nccl = device == "cuda" and not _interpreting()
        if self._nccl:
            n = torch.cuda.device_count()
            if self.local_rank >= n:
                raise ParallelError(f"rank {rank} needs GPU {self.local_rank}, but this host shows {n} GPU(s); "
                                    f"--tp must be <= {n}")
            torch.cuda.set_device(self.local_rank)
        if dist.is_initialized():
            raise ParallelError("torch.distributed is already initialized in this process")
        timeout = datetime.timedelta(seconds=timeout_s)
        if self._nccl:  # a torch setting (not NCCL's), read when the process group is made
            set_process_env("TORCH_NCCL_AVOID_RECORD_STREAMS", "1")
        dist.init_process_group("nccl" if self._nccl else "gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                                world_size=world, timeout=timeout,
                                **({"device_id": torch.device("cuda", self.local_rank)} if self._nccl else {}))
        self.control = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=control_timeout_s))
        self._gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    # ------------------------------------------------------------------ data (the graph's ops)
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The float32 sum of x over the ranks, in x's memory when x is float32 and contiguous."""
        if x.dtype != torch.float32 or not x.is_contiguous():
            x = x.float().contiguous()
        dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor, widths: tuple[int, ...]) -> torch.Tensor:
        """float32 [rows, sum(widths)]: rank r's x [rows, widths[r]] in columns of its own."""
        wmax = max(widths)
        x = x.float()
        if x.shape[-1] < wmax:  # uneven split: pad to the widest rank's width
            x = torch.nn.functional.pad(x, (0, wmax - x.shape[-1]))
        x = x.contiguous()
        rows = x.shape[0]
        out = torch.empty(self.world * rows, wmax, dtype=x.dtype, device=x.device)
        self._gather(out, x)
        parts = out.view(self.world, rows, wmax)
        if len(set(widths)) == 1:
            return parts.transpose(0, 1).reshape(rows, self.world * wmax)
        return torch.cat([parts[r, :, :w] for r, w in enumerate(widths)], dim=-1)

    # ------------------------------------------------------------------ control (host, gloo)
    def broadcast(self, obj: Any = None) -> Any:
        """Rank 0's `obj` on every rank (picklable; sent over the control group)."""
        box = [obj if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def min_int(self, v: int) -> int:
        """The smallest of every rank's v (e.g. the KV-cache budget all ranks can hold)."""
        t = torch.tensor([v], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control)
        return int(t.item())

    def close(self) -> None:
        """Leave the group. On NCCL the group is left to the process's exit: destroying a
        communicator whose collectives a CUDA graph captured can hang (pytorch issue 115388)."""
        if dist.is_initialized() and not self._nccl:
            dist.destroy_process_group()
