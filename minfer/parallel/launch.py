"""Where this process sits among the ranks, and starting the others.

Two ways to get N ranks:

- `minfer run/bench/serve --tp N` (or `minfer.load(..., tp=N)`): this process becomes rank 0
  and starts ranks 1..N-1 itself: `python -m minfer.engine.tp MODEL CONFIG_JSON`, with torchrun's
  variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT=a free port) and
  this process's environment otherwise (NCCL_* variables pass through untouched).
- `torchrun --nproc-per-node N -m minfer ...`: every process finds its place in torchrun's
  variables (config.dist_env); rank 0 runs the command, the others follow it.

Either way every rank ends up in `join`, and the ranks other than 0 in engine/tp.py's `follow`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from ..config import EngineConfig, child_env, dist_env
from ..errors import ParallelError

FOLLOWER_MODULE = "minfer.engine.tp"  # what a started rank runs (its `main`)
STOP_WAIT_S = 30  # how long close() waits for started ranks to exit before it kills them


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the rendezvous binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_devices(config: EngineConfig, world: int) -> None:
    """ParallelError when the host has fewer devices than ranks (cuda: one GPU per rank)."""
    if config.device == "cuda":
        import torch

        from .comm import _interpreting

        if _interpreting():  # the cuda backend on host tensors (tests): no GPU per rank needed
            return
        n = torch.cuda.device_count()
        if world > n:
            raise ParallelError(f"--tp {world} needs {world} GPUs (one per rank); this host shows {n}")
    elif config.device != "cpu":
        raise ParallelError(f"tensor parallelism runs on cpu or cuda, not {config.device!r}")


class Group:
    """This process's communicator and the ranks it started (rank 0 of `--tp N`), which `close`
    waits for."""

    def __init__(self, comm, procs: list[subprocess.Popen]):
        self.comm, self.procs = comm, procs

    @property
    def rank(self) -> int:
        return self.comm.rank

    def close(self) -> None:
        """Leave the group; wait for the ranks this process started, and end those that do not
        exit in time (by their own pid)."""
        self.comm.close()
        for p in self.procs:
            try:
                p.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


def join(config: EngineConfig, model: Path) -> Group:
    """This process's place: torchrun's (config.dist_env), or rank 0 of config.tp ranks whose
    others it starts now. Sets the cpu threads per rank (the cores shared out) when not chosen."""
    from .comm import Communicator  # torch: only once a group is wanted

    env = dist_env()
    procs: list[subprocess.Popen] = []
    if env is not None:
        if config.tp not in (1, env.world):
            raise ParallelError(f"--tp {config.tp} but torchrun started WORLD_SIZE={env.world} ranks")
        rank, world, local, addr, port = env.rank, env.world, env.local_rank, env.addr, env.port
    else:
        rank, world, local, addr, port = 0, config.tp, 0, "127.0.0.1", free_port()
    check_devices(config, world)
    if config.device == "cpu" and config.threads is None:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if env is None:
        procs = start_ranks(config, model, world, port)
    try:
        comm = Communicator(rank, world, device=config.device, local_rank=local, addr=addr, port=port)
    except BaseException:
        for p in procs:
            p.kill()
            p.wait()
        raise
    return Group(comm, procs)


def start_ranks(config: EngineConfig, model: Path, world: int, port: int) -> list[subprocess.Popen]:
    """Ranks 1..world-1 of `model` under `config`, as child processes (stdout discarded: what a
    command prints comes from rank 0; stderr shared, so their errors show)."""
    follower = replace(config, tp=world, trace_path=None)
    cmd = [sys.executable, "-m", FOLLOWER_MODULE, os.fspath(model), json.dumps(follower.as_dict())]
    procs = []
    for r in range(1, world):
        env = child_env(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port))
        procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
    return procs
