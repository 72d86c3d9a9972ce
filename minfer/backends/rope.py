"""RoPE tables, one place for every backend: which RoPE nodes share a table, and the tables of a
graph for a context length (cos / sin [n_ctx, n_rot / 2], float32 on the host; each backend
moves them where its kernels read them)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..graph.ir import Graph, Node, Op, WeightRef


def rope_table(n_ctx: int, n_rot: int, base: float, freq_scale: float,
               freq_factors: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [n_ctx, n_rot/2] of angle p * freq_scale * base^(-2i/n_rot) / factor_i.

    Computed in float64 and rounded once, so tables of any length agree on shared positions.
    """
    i = torch.arange(0, n_rot, 2, dtype=torch.float64)
    inv = freq_scale * torch.exp(-math.log(base) * i / n_rot)
    if freq_factors is not None:
        inv = inv / freq_factors.to(torch.float64)
    ang = torch.arange(n_ctx, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).to(torch.float32), torch.sin(ang).to(torch.float32)


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
    out: dict[tuple, tuple] = {}
    for node in rope_nodes(graph):
        key = rope_key(node)
        if key not in out:
            p, ff = node.params, node.weights.get("freq_factors")
            out[key] = rope_table(n_ctx, p["n_rot"], p["base"], p["freq_scale"], factors(ff) if ff else None)
    return out
