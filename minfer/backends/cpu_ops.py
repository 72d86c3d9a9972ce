"""The cpu backend's ops as plain torch functions on float32 tensors.

These are the numerical reference of every graph op: GPU kernels are tested against them.
Activations are token-major [T, width]; heads are contiguous runs of `head_dim` in a row.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class RMSNorm:
    """x / sqrt(mean(x^2) + eps) * w over the last dimension of [T, d].

    The mean of squares is one matmul with a column of 1/d, eps added by the same addmm: four
    ops, about half the cost of F.rms_norm on a decode step's single row."""

    def __init__(self, w: torch.Tensor, eps: float):
        d = w.shape[0]
        self.w = w
        self.eps = torch.full((1, 1), float(eps))
        self.inv_d = torch.full((d, 1), 1.0 / d)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.eps, x * x, self.inv_d).rsqrt_().mul(x).mul_(self.w)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return RMSNorm(w, eps)(x)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, in the inputs' dtype (bfloat16 on the decode path: the next int4 matmul's input)."""
    return F.silu(gate).mul_(up)


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


def rope_pairs(head_dim: int, n_rot: int, style: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (a_i, b_i) of the pairs RoPE rotates by angle i: "normal": (2i, 2i+1) as llama.cpp's
    rope mode 0; "neox": (i, i + n_rot/2) as its NEOX mode. Dims from n_rot on are not rotated."""
    i = torch.arange(n_rot // 2)
    if style == "normal":
        return 2 * i, 2 * i + 1
    return i, i + n_rot // 2


def rope_matrix(cos: torch.Tensor, sin: torch.Tensor, head_dim: int, n_rot: int, style: str) -> torch.Tensor:
    """Per-token rotation matrices R [T, head_dim, head_dim] from cos/sin [T, n_rot/2], so that a
    head row x becomes x @ R: y[a] = x[a] cos - x[b] sin, y[b] = x[a] sin + x[b] cos; identity
    on the dims past n_rot. Built once per step and shared by every layer; one batched matmul
    then rotates all heads of a layer."""
    t = cos.shape[0]
    a, b = rope_pairs(head_dim, n_rot, style)
    r = torch.zeros(t, head_dim, head_dim)
    r[:, a, a] = cos
    r[:, b, b] = cos
    r[:, a, b] = sin
    r[:, b, a] = -sin
    rest = torch.arange(n_rot, head_dim)
    r[:, rest, rest] = 1.0
    return r


def apply_rope(x: torch.Tensor, rot: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    """Rotate [T, n_heads * head_dim] (a column view is fine; bfloat16 is promoted) by
    rope_matrix's R [T, hd, hd], or for one token by its R [hd, hd] (a plain 2-D matmul: the row
    is contiguous even in a view); returns a new contiguous float32 [T, n_heads * head_dim]."""
    if rot.dim() == 2:
        return torch.mm(x.view(n_heads, head_dim).float(), rot).view(1, n_heads * head_dim)
    return torch.matmul(x.unflatten(-1, (n_heads, head_dim)).float(), rot).flatten(-2)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, head_dim: int, n_rot: int,
         style: str) -> torch.Tensor:
    """Rotate [T, n_heads * head_dim] by per-token cos/sin [T, n_rot/2] (see rope_matrix)."""
    return apply_rope(x, rope_matrix(cos, sin, head_dim, n_rot, style), n_heads, head_dim)


def attention_one(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """attention() for one query that sees every cached position: q [n_head, hd] against
    keys/values [n_head_kv, L, hd]. Returns [1, n_head * hd].

    With one query there is no causal mask: one SDPA call on views, no repeated keys (measured
    on 2 AVX2 cores: ~25% faster than baddbmm + softmax + bmm at L = 32..512)."""
    n_head, hd = q.shape
    out = F.scaled_dot_product_attention(q.view(1, n_head, 1, hd), keys.unsqueeze(0), values.unsqueeze(0),
                                         scale=scale, enable_gqa=keys.shape[0] != n_head)
    return out.view(1, n_head * hd)


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: int,
              scale: float) -> torch.Tensor:
    """Causal attention of one sequence's queries q [n, n_head, hd] at positions start..start+n-1
    over its cache k/v [n_head_kv, >= start+n, hd] (already holding this step's keys).
    Returns [n, n_head * hd]."""
    n, n_head, hd = q.shape
    length = start + n
    qh = q.transpose(0, 1).unsqueeze(0)
    k = k_cache[:, :length].unsqueeze(0)
    v = v_cache[:, :length].unsqueeze(0)
    mask = None
    if n > 1 and start > 0:  # query i sees keys 0..start+i: a causal mask offset by `start`
        mask = torch.ones(n, length, dtype=torch.bool).tril_(diagonal=start)
    out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, is_causal=(n > 1 and start == 0),
                                         scale=scale, enable_gqa=k.shape[1] != n_head)
    return out[0].transpose(0, 1).reshape(n, n_head * hd)
