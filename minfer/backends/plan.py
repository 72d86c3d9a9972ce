"""The compiled plan every backend shares: a graph turned into lists of step functions.

A backend runs a graph in a few ways (its `kinds`: e.g. a decode row, a decode batch, a prompt
chunk), and compiles each node once, at load, into a `Step`: per way of running a function
`fn(values, state)` that reads its inputs from the list of computed values by node id and
returns the node's output, and the name of the kernel(s) it launches. The plan adds what is
generic: the execution order per way, which values die after which node (a long prefill does
not keep every intermediate), and the traced run that times each node for the trace recorder.
`state` is the backend's own per-step object; `state.kind` names the way the step runs. The plan
knows no device, and no op but the tensor-parallel ones (AllReduce, AllGather, LocalIds,
MaskRows: parallel/steps.py), which every backend shares.
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
    """A compiled node: per way of running, its function and the kernel(s) it launches."""

    fns: dict[str, StepFn]
    kernels: dict[str, str]

    @classmethod
    def same(cls, fn: StepFn, kernel: str, kinds) -> Step:
        """A step that runs the same way in every way of running (a view, an input, a collective)."""
        return cls(dict.fromkeys(kinds, fn), dict.fromkeys(kinds, kernel))


class Plan:
    def __init__(self, graph: Graph, compile_node: Callable[[Node], Step], kinds, progress: bool = False,
                 sync: Callable[[], None] | None = None, comm=None):
        """Compile every node for every way of running in `kinds` (a progress bar over the nodes
        with weights when `progress` and it takes more than half a second). `sync` waits for the
        device before a node's time is read. Tensor-parallel ops (one rank's graph) compile here,
        the same for every backend, through `comm` (parallel/comm.py); the backend compiles the
        others."""
        self.graph = graph
        self.sync = sync
        self.kinds = tuple(kinds)
        steps = []
        with progress_bar(total=sum(1 for n in graph.nodes if n.weights), desc="preparing weights", unit="node",
                          delay=0.5, show=progress, leave=False) as bar:
            for node in graph.nodes:
                steps.append(Step.same(*compile_parallel(node, graph, comm), self.kinds) if node.op in PARALLEL_OPS
                             else compile_node(node))
                bar.update(bool(node.weights))
        last = graph.consumers_last_use()
        frees: dict[int, list[int]] = {}
        for vid, reader_id in last.items():
            if reader_id < len(graph.nodes) and graph.nodes[vid].op != Op.INPUT:
                frees.setdefault(reader_id, []).append(vid)
        self.steps = steps
        # per way: (node id, step function, values whose last reader it is: dropped right after it runs)
        self._orders = {kind: [(n.id, s.fns[kind], tuple(frees.get(n.id, ())))
                               for n, s in zip(graph.nodes, steps, strict=True)] for kind in self.kinds}

    def kernel(self, node_id: int, kind: str) -> str:
        return self.steps[node_id].kernels[kind]

    def run(self, state: Any, recorder=None, until: int | None = None) -> torch.Tensor:
        """Execute every node for one step, the way `state.kind` says; the graph output's value.
        With a recorder, each node is timed (after `sync`) and reported with its output (a node
        of several values: its first). `until`: stop after that node and return its value (its
        first, if several): the final hidden state for embeddings (graph.hidden_id)."""
        order = self._orders[state.kind]
        vals: list = [None] * len(order)
        if until is not None:
            for nid, fn, dead in order:
                vals[nid] = fn(vals, state)
                if nid == until:
                    out = vals[nid]
                    return out[0] if isinstance(out, tuple) else out
                for d in dead:
                    vals[d] = None
            raise ValueError(f"plan: no node {until}")
        if recorder is None:
            for nid, fn, dead in order:
                vals[nid] = fn(vals, state)
                for d in dead:
                    vals[d] = None
        else:
            sync = self.sync or (lambda: None)
            for nid, fn, dead in order:
                sync()
                t0 = time.perf_counter()
                out = vals[nid] = fn(vals, state)
                sync()
                recorder.node(nid, out[0] if isinstance(out, tuple) else out, time.perf_counter() - t0,
                              self.kernel(nid, state.kind))
                for d in dead:
                    vals[d] = None
        return vals[self.graph.output]

    def trace_nodes(self, kind: str) -> list[dict]:
        """The graph's nodes for TraceRecorder.set_graph, each with its kernel for way `kind`."""
        return self.graph.trace_nodes({nid: self.kernel(nid, kind) for nid in range(len(self.steps))})
