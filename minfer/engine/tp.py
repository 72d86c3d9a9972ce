"""Tensor parallelism in the engine: every rank loads its part; rank 0 drives the others.

Rank 0 runs the whole engine (scheduler, sampling, the server) on a `RankDriver`: a Backend that
sends each call that runs the model (allocate, warmup, forward, decode_pick) to the other ranks
through the communicator's control channel before making it on its own backend. A follower
(`follow`) repeats every call it receives on its own part of the model, in the same order, so
every rank runs the same batch in the same step and meets the same collectives. The logits of
a step are all-gathered in the graph, so every rank holds the same full logits; only rank 0
samples from them on the host. Tokens picked on the device (decode_pick) are picked on every
rank from those same logits, by the same kernel and the same counter-based draw (rng.py), so
a follower's next step reads the token rank 0 read.

A follower is started by `minfer ... --tp N` (this module's `main`, with torchrun's variables)
or by torchrun itself (the CLI's ranks other than 0 call `run_follower`).
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

from ..backends import Backend, Batch
from ..config import EngineConfig
from ..errors import MinferError, ParallelError
from ..gguf.reader import GGUFReader
from . import loader

KEEP_LAUNCHED = 4  # launched decode steps a follower remembers (a step names the one before it)


def _wire(batch: Batch) -> tuple:
    toks = batch.tokens.tolist()
    spans = [(s.slot, s.start, toks[s.offset:s.offset + s.n_tokens]) for s in batch.spans]
    return spans, batch.out_rows.tolist(), batch.n_decode


def _unwire(w: tuple) -> Batch:
    spans, out_rows, n_decode = w
    return Batch.build(spans, out_rows, n_decode)


class Launched:
    """A decode step rank 0 launched: the backend's step, numbered as the followers know it."""

    __slots__ = ("step", "sid")

    def __init__(self, step, sid: int):
        self.step, self.sid = step, sid

    @property
    def rows(self) -> int:
        return self.step.rows

    def tokens(self) -> list[int]:
        return self.step.tokens()


class RankDriver(Backend):
    """Rank 0's backend: the calls that run the model go to every rank, then run on this rank's
    backend (`inner`); what only describes the model (the trace graph, the plan) is inner's."""

    def __init__(self, backend: Backend, comm):
        self.inner, self.comm = backend, comm
        self.name, self.kv_itemsize = backend.name, backend.kv_itemsize
        self.prefill_seqs, self.device_pick, self.graph = backend.prefill_seqs, backend.device_pick, backend.graph
        self.kv_copy = backend.kv_copy
        self._sids = itertools.count()
        self._closed = False

    def load(self, graph, reader, progress: bool = True) -> None:
        raise ParallelError("a tensor-parallel group loads on every rank at once (engine/loader.py)")

    def trace_graph(self) -> list[dict]:
        return self.inner.trace_graph()

    def plan_rows(self, rows: int = 1, prefill: bool = False) -> list[dict]:
        return self.inner.plan_rows(rows, prefill)

    def decode_weight_bytes(self) -> int | None:
        return self.inner.decode_weight_bytes()

    def _send(self, *cmd) -> None:
        if self._closed:
            raise ParallelError("the tensor-parallel group is closed")
        self.comm.broadcast(cmd)

    def kv_budget(self) -> int:
        """The budget every rank can hold: the smallest of theirs."""
        self._send("kv_budget")
        return self.comm.min_int(self.inner.kv_budget())

    def allocate(self, n_slots: int, n_ctx: int) -> None:
        self._send("allocate", n_slots, n_ctx)
        agreed(self.comm, lambda: self.inner.allocate(n_slots, n_ctx), "allocating the KV cache")

    def copy_kv(self, src: int, dst: int, n: int) -> None:
        self._send("copy_kv", src, dst, n)
        self.inner.copy_kv(src, dst, n)

    def warmup(self) -> None:
        self._send("warmup")
        self.inner.warmup()

    def forward(self, batch: Batch, recorder=None):
        self._send("forward", _wire(batch))
        return self.inner.forward(batch, recorder)

    def decode_pick(self, batch: Batch, after: Launched | None = None, params=None) -> Launched:
        sid = next(self._sids)
        self._send("pick", sid, _wire(batch), None if after is None else after.sid,
                   None if params is None else params.tolist())
        step = self.inner.decode_pick(batch, after=None if after is None else after.step, params=params)
        return Launched(step, sid)

    def close(self) -> None:
        """Tell the followers to stop (they leave the group and exit). Idempotent."""
        if not self._closed:
            self._send("stop")
            self._closed = True


def agreed(comm, fn, what: str) -> None:
    """Run fn on this rank; every rank learns whether all succeeded (no rank is left waiting in a
    collective for one that failed). This rank's error is raised; another's, a ParallelError."""
    err = None
    try:
        fn()
    except Exception as e:  # noqa: BLE001 (any failure: out of memory too; raised below once all know)
        err = e
    if comm.min_int(0 if err else 1) == 0:
        if err is not None:
            raise err
        raise ParallelError(f"another rank failed while {what} (its error is on its stderr)")


def follow(backend: Backend, comm) -> None:
    """Repeat rank 0's calls on this rank's backend until it says stop. An input error (a
    MinferError: rank 0 checks the same input the same way and raises it too) skips the call; a
    ParallelError (this rank out of step with rank 0) ends the loop with it."""
    import torch

    launched: dict[int, object] = {}
    while True:
        cmd = comm.broadcast()
        op = cmd[0]
        if op == "stop":
            return
        try:
            if op == "forward":
                backend.forward(_unwire(cmd[1]))
            elif op == "pick":
                sid, wire, after, params = cmd[1:]
                p = None if params is None else torch.tensor(params, dtype=torch.int32)
                if after is not None and after not in launched:  # its input tokens are gone: never guess
                    raise ParallelError(f"rank {comm.rank}: decode step {sid} follows step {after}, which this "
                                        f"rank no longer holds (it keeps the last {KEEP_LAUNCHED})")
                launched[sid] = backend.decode_pick(_unwire(wire), after=launched.get(after), params=p)
                for old in [k for k in launched if k <= sid - KEEP_LAUNCHED]:
                    del launched[old]
            elif op == "kv_budget":
                comm.min_int(backend.kv_budget())
            elif op == "allocate":
                agreed(comm, lambda c=cmd: backend.allocate(c[1], c[2]), "allocating the KV cache")
            elif op == "copy_kv":
                backend.copy_kv(*cmd[1:])
            elif op == "warmup":
                backend.warmup()
            else:
                raise ParallelError(f"rank {comm.rank}: unknown command {op!r} from rank 0")
        except Exception as e:
            if op == "allocate":
                continue  # every rank already knows (agreed): rank 0 raises it and stops us
            if not isinstance(e, MinferError) or isinstance(e, ParallelError):
                raise  # this rank can no longer run what rank 0 runs: leave (rank 0's collectives fail)
            print(f"minfer: rank {comm.rank}: {e}", file=sys.stderr)


def run_follower(model: Path, config: EngineConfig, group) -> None:
    """A rank other than 0, from start to end: load this rank's part, tell the others whether
    that worked, follow rank 0 until it stops, leave the group."""
    comm = group.comm
    try:
        with GGUFReader(model) as reader:
            backend = None

            def load():
                nonlocal backend
                backend = loader.load(reader, config, comm, progress=False).backend

            agreed(comm, load, "loading the model")
            follow(backend, comm)
    finally:
        group.close()


def main(argv: list[str] | None = None) -> int:
    """`python -m minfer.engine.tp MODEL CONFIG_JSON`: a rank minfer started (parallel/launch.py)."""
    from ..parallel.launch import join

    argv = sys.argv[1:] if argv is None else argv
    model, config = Path(argv[0]), EngineConfig(**json.loads(argv[1]))
    group = join(config, model)
    if group.rank == 0:
        group.close()
        raise ParallelError("minfer.engine.tp runs the ranks other than 0; rank 0 is the command")
    try:
        run_follower(model, config, group)
    except MinferError as e:
        print(f"minfer: rank {group.rank}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
