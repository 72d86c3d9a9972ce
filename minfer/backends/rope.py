"""RoPE tables, one place for every backend: which RoPE nodes share a table, and the tables of a
graph for a context length (cos / sin [n_ctx, n_rot / 2], float32 on the host; each backend
moves them where its kernels read them)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..graph.ir import Graph, Node, Op, WeightRef


def rope_key(node: Node) -> tuple:
    """What a RoPE node's cos/sin tables depend on (nodes with equal keys share one table)."""
    p, ff = node.params, node.weights.get("freq_factors")
    return (p["n_rot"], p["base"], p["freq_scale"], ff.name if ff else None)


def rope_nodes(graph: Graph):
    """Every node that rotates by RoPE: RoPE nodes and the fused nodes standing for one."""
    for n in graph.nodes:
        if n.op in (Op.ROPE, Op.MATMUL_ROPE):
            yield n


def rope_tables(graph: Graph, n_ctx: int, factors: Callable[[WeightRef], torch.Tensor]) -> dict[tuple, tuple]:
    """(cos, sin) of every distinct RoPE setting of `graph` for positions 0..n_ctx-1;
    `factors(weight)`: a rope_freqs weight as a float32 host vector."""
    from .cpu.ops import rope_table

    out: dict[tuple, tuple] = {}
    for node in rope_nodes(graph):
        key = rope_key(node)
        if key not in out:
            p, ff = node.params, node.weights.get("freq_factors")
            out[key] = rope_table(n_ctx, p["n_rot"], p["base"], p["freq_scale"], factors(ff) if ff else None)
    return out
