"""RoPE tables, one place for every backend: which RoPE nodes share a table, and the tables of a
graph for a context length (cos / sin [n_ctx, n_rot / 2], float32 on the host; each backend
moves them where its kernels read them)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..graph.ir import Graph, Node, Op, WeightRef

# the params a table depends on (graph/ir.py RoPE), and the weights of its frequency factors
TABLE_PARAMS = ("n_rot", "base", "freq_scale", "attn_factor", "yarn", "n_ctx_orig")
FACTOR_ROLES = ("freq_factors", "freq_factors_long")


def rope_table(n_ctx: int, n_rot: int, base: float, freq_scale: float,
               freq_factors: torch.Tensor | None = None, attn_factor: float = 1.0,
               yarn: tuple[float, int, float, float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [n_ctx, n_rot/2] of angle p * freq_scale * base^(-2i/n_rot) / factor_i, times
    attn_factor. With `yarn` = (ext_factor, n_ctx_orig, beta_fast, beta_slow), ggml's rope_yarn:
    pair i's angle mixes the scaled and unscaled ones, theta = theta_interp (1 - r_i) +
    theta_extrap r_i with r_i = ext_factor * ramp_i, and cos / sin gain 1 + 0.1 ln(1/freq_scale).

    Computed in float64 and rounded once, so tables of any length agree on shared positions.
    """
    i = torch.arange(0, n_rot, 2, dtype=torch.float64)
    inv = torch.exp(-math.log(base) * i / n_rot)  # theta_extrap per position
    if freq_factors is not None:
        inv = inv / freq_factors.to(torch.float64)
    mscale = attn_factor
    if yarn is not None and yarn[0] != 0.0:
        ext, orig, fast, slow = yarn
        low, high = yarn_corr_dims(n_rot, orig, base, fast, slow)
        ramp = 1 - ((torch.arange(n_rot // 2, dtype=torch.float64) - low) / max(0.001, high - low)).clamp(0, 1)
        mix = ramp * ext
        inv = freq_scale * inv * (1 - mix) + inv * mix
        mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    else:
        inv = freq_scale * inv
    ang = torch.arange(n_ctx, dtype=torch.float64)[:, None] * inv[None, :]
    return (torch.cos(ang) * mscale).to(torch.float32), (torch.sin(ang) * mscale).to(torch.float32)


def yarn_corr_dims(n_rot: int, n_ctx_orig: int, base: float, beta_fast: float,
                   beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the pair indices where YaRN's ramp starts and ends (the dims
    that turn beta_fast resp. beta_slow times over the original context), clamped to 0..n_rot-1."""

    def dim(n: float) -> float:
        return n_rot * math.log(n_ctx_orig / (n * 2 * math.pi)) / (2 * math.log(base))

    return max(0.0, math.floor(dim(beta_fast))), min(n_rot - 1.0, math.ceil(dim(beta_slow)))


def rope_key(node: Node) -> tuple:
    """What a RoPE node's cos/sin tables depend on (nodes with equal keys share one table): every
    param but the head layout (and the fused nodes' matmul and KV params), and its factor weights."""
    p = {k: v for k, v in node.params.items() if k in TABLE_PARAMS}
    return (*sorted(p.items()), *sorted((r, w.name) for r, w in node.weights.items() if r in FACTOR_ROLES))


def rope_nodes(graph: Graph):
    """Every node that rotates by RoPE: RoPE nodes and the fused nodes standing for one."""
    for n in graph.nodes:
        if n.op in (Op.ROPE, Op.MATMUL_ROPE, Op.NORM_ROPE):
            yield n


def rope_tables(graph: Graph, n_ctx: int, factors: Callable[[WeightRef], torch.Tensor]) -> dict[tuple, tuple]:
    """(cos, sin) of every distinct RoPE setting of `graph` for positions 0..n_ctx-1;
    `factors(weight)`: a rope_freqs weight as a float32 host vector. LongRoPE (`n_ctx_orig` and a
    "freq_factors_long" weight): the long factors when n_ctx exceeds n_ctx_orig, as llama.cpp
    picks them by the context allocated."""
    out: dict[tuple, tuple] = {}
    for node in rope_nodes(graph):
        key = rope_key(node)
        if key not in out:
            p, ff = node.params, node.weights.get("freq_factors")
            if "n_ctx_orig" in p and n_ctx > p["n_ctx_orig"]:
                ff = node.weights["freq_factors_long"]
            out[key] = rope_table(n_ctx, p["n_rot"], p["base"], p["freq_scale"], factors(ff) if ff else None,
                                  p.get("attn_factor", 1.0), p.get("yarn"))
    return out
