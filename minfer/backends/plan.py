"""The compiled plan every backend shares: a graph turned into a list of step functions.

A backend compiles each node once, at load, into a `Step`: a function `fn(values, state)` that
reads its inputs from the list of computed values by node id and returns the node's output, plus
the name of the kernel that runs it. The plan adds what is generic: the execution order, which
values die after which node (a long prefill does not keep every intermediate), and the traced
run that times each node for the trace recorder. `state` is the backend's own per-step object
(the batch, its cache views...). The plan knows no device, and no op but the tensor-parallel
ones (AllReduce, AllGather, LocalIds, MaskRows: parallel/steps.py), which every backend shares.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..graph.ir import PARALLEL_OPS, Graph, Node, Op
from ..parallel.steps import compile_parallel
from ..progress import bar as progress_bar

StepFn = Callable[[list, Any], torch.Tensor]


@dataclass(frozen=True)
class Step:
    fn: StepFn
    kernel: str | Callable[[Any], str]  # a name, or state -> name when the kernel depends on the step


class Plan:
    def __init__(self, graph: Graph, compile_node: Callable[[Node], Step], progress: bool = False,
                 sync: Callable[[], None] | None = None, comm=None):
        """Compile every node (a progress bar over the nodes with weights when `progress` and it
        takes more than half a second). `sync` waits for the device before a node's time is read.
        Tensor-parallel ops (one rank's graph) compile here, the same for every backend, through
        `comm` (parallel/comm.py); the backend compiles the others."""
        self.graph = graph
        self.sync = sync
        steps = []
        with progress_bar(total=sum(1 for n in graph.nodes if n.weights), desc="preparing weights", unit="node",
                          delay=0.5, show=progress, leave=False) as bar:
            for node in graph.nodes:
                steps.append(Step(*compile_parallel(node, graph, comm)) if node.op in PARALLEL_OPS
                             else compile_node(node))
                bar.update(bool(node.weights))
        last = graph.consumers_last_use()
        frees: dict[int, list[int]] = {}
        for vid, reader_id in last.items():
            if reader_id < len(graph.nodes) and graph.nodes[vid].op != Op.INPUT:
                frees.setdefault(reader_id, []).append(vid)
        self.steps = steps
        # (node id, step function, values whose last reader it is: dropped right after it runs)
        self._order = [(n.id, s.fn, tuple(frees.get(n.id, ()))) for n, s in zip(graph.nodes, steps, strict=True)]

    def kernel(self, node_id: int, state: Any = None) -> str:
        k = self.steps[node_id].kernel
        return k if isinstance(k, str) else k(state)

    def run(self, state: Any, recorder=None) -> torch.Tensor:
        """Execute every node for one step; the graph output's value. With a recorder, each node
        is timed (after `sync`) and reported with its output."""
        vals: list = [None] * len(self._order)
        if recorder is None:
            for nid, fn, dead in self._order:
                vals[nid] = fn(vals, state)
                for d in dead:
                    vals[d] = None
        else:
            sync = self.sync or (lambda: None)
            for nid, fn, dead in self._order:
                sync()
                t0 = time.perf_counter()
                out = vals[nid] = fn(vals, state)
                sync()
                recorder.node(nid, out, time.perf_counter() - t0, self.kernel(nid, state))
                for d in dead:
                    vals[d] = None
        return vals[self.graph.output]

    def trace_nodes(self, state: Any = None) -> list[dict]:
        """The graph's nodes for TraceRecorder.set_graph, each with its kernel for `state`."""
        return self.graph.trace_nodes({nid: self.kernel(nid, state) for nid in range(len(self.steps))})
