"""The step functions of the tensor-parallel graph ops, for every backend (plan.py calls them).

They are plain torch on whatever device the tensors live on, plus the communicator's
collectives, so the cpu and cuda backends run the same code; under a CUDA-graph capture they
are captured with the kernels around them (no host synchronization in any of them).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..errors import ModelError
from ..graph.ir import Graph, Node, Op


def compile_parallel(node: Node, graph: Graph, comm) -> tuple[Callable, str]:
    """(fn(values, state) -> tensor, kernel label) for one tensor-parallel node."""
    if comm is None:
        raise ModelError(f"graph node {node.name!r} ({node.op}) is a tensor-parallel op, but the backend has no "
                         "communicator (this graph is one rank's: load it with its ranks)")
    p = node.params
    if node.op == Op.ALL_REDUCE:
        (i,) = node.inputs
        readers = sum(i in n.inputs for n in graph.nodes)
        if readers != 1:  # the sum is taken in place: its input must be read by nothing else
            raise ModelError(f"graph node {node.name!r}: its input has {readers} readers; AllReduce needs the only one")
        return (lambda vals, st: comm.all_reduce(vals[i])), "dist.all_reduce"
    if node.op == Op.ALL_GATHER:
        (i,), widths = node.inputs, p["widths"]
        return (lambda vals, st: comm.all_gather(vals[i], widths)), "dist.all_gather"
    if node.op == Op.LOCAL_IDS:
        (i,), lo, hi = node.inputs, p["lo"], p["hi"]

        def local_ids(vals, st) -> torch.Tensor:
            ids = vals[i]
            return (ids - lo).masked_fill_((ids < lo) | (ids >= hi), 0)

        return local_ids, "torch.local_ids"
    if node.op == Op.MASK_ROWS:
        (x, i), lo, hi = node.inputs, p["lo"], p["hi"]

        def mask_rows(vals, st) -> torch.Tensor:
            ids = vals[i]
            return vals[x].masked_fill(((ids < lo) | (ids >= hi)).unsqueeze(-1), 0.0)

        return mask_rows, "torch.mask_rows"
    raise ModelError(f"graph node {node.name!r}: {node.op} is not a tensor-parallel op")
