"""The one load sequence: a GGUF file to a backend ready to run, for every caller.

The API (`Engine.load`), each rank of tensor parallelism (engine/tp.py) and `minfer plan` load a
model the same way: build the architecture's graph (this rank's part of it when the model is
split), take the structural passes every backend runs (graph/fuse.py `optimize`), create the
configured backend and let it prepare its weights (the backend fuses what its contracts accept
and picks every kernel). `plan_only` picks kernels without touching a device or packing weights
(what `minfer plan` shows on a machine without the GPU).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from ..backends import Backend, create_backend
from ..config import EngineConfig
from ..gguf.reader import GGUFReader
from ..graph.fuse import optimize
from ..graph.ir import Graph
from ..models import registry
from ..models.support import check_backend


@dataclass
class Loaded:
    """A loaded model: its Args, its graph (before the backend's fusions), the backend holding its
    weights, and the file as the backend read it (split over ranks: this rank's tensors)."""

    args: Any
    graph: Graph
    backend: Backend
    view: Any


def model_graph(reader: GGUFReader, comm=None) -> tuple[Any, Graph, Any]:
    """(args, graph, view) of the model in `reader`: the whole model, or with a communicator of
    more than one rank this rank's part (models.registry.build_shard), after the structural passes."""
    if comm is None or comm.world == 1:
        args, graph = registry.build(reader)
        view = reader
    else:
        args, graph, view = registry.build_shard(reader, comm.rank, comm.world)
    return args, optimize(graph), view


def load(reader: GGUFReader, config: EngineConfig, comm=None, progress: bool = True, plan_only: bool = False) -> Loaded:
    """The model in `reader` on the backend `config` names, its weights prepared (`plan_only`:
    its kernels picked only)."""
    args, graph, view = model_graph(reader, comm)
    check_backend(graph.meta["arch"], config.device)  # a typed refusal before any device or weight is touched
    backend = create_backend(config, comm, plan_only=plan_only)
    try:
        backend.load(graph, view, progress=progress)
    except BaseException:
        with contextlib.suppress(Exception):  # release the device now: a process that goes on loading
            backend.close()  # (a server's restarts, the load fuzzer) must not run the driver out of memory
        raise
    return Loaded(args, graph, backend, view)
