"""RoPE: rotate each head of x [rows, n_heads * head_dim] by the angles of its row's position;
and `norm_rope`, the per-head RMSNorm of q and k (qwen3's, gemma3's) with their RoPE in one launch.

Pair i of a head, (a_i, b_i), turns by angle_i(p): y_a = x_a cos - x_b sin, y_b = x_a sin + x_b cos,
with cos/sin read from tables [n_ctx, n_rot / 2] (made once per model, float64 rounded to f32, the
same tables the cpu backend uses). "normal" pairs adjacent dims (2i, 2i+1) (llama.cpp rope mode
0), neox pairs (i, i + n_rot/2); dims from n_rot on pass through. One program per (row, head):
the row's position is read on the device, so the kernel replays in a CUDA graph. The input may be
a row-strided view (the q/k columns of a fused qkv output); the output is contiguous f32.

norm_rope: q's heads then k's, side by side in x's first (n_heads + n_heads_k) * head_dim
columns (the q+k+v projection's output), each head normed on its own (its weight: w_q for q's
heads, w_k for k's), then rotated. A decode step of qwen3 or gemma3 ran four launches there (q
norm, k norm, q RoPE, k RoPE); the head is loaded once as its rotation pairs (a, b) and the dims
past n_rot, so the norm's sum of squares and the rotation need no reshuffle in registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import UnsupportedError
from ._common import (
    check_device,
    check_grid,
    check_int,
    check_tensor,
    make_out,
    pdl_args,
    release_late,
    release_next,
    rows_view,
    wait_prior,
)


@triton.jit
def _rope_kernel(x_ptr, pos_ptr, cos_ptr, sin_ptr, out_ptr, stride_x, N, HD, HALF, NEOX: tl.constexpr,
                 BLOCK_HALF: tl.constexpr, BLOCK_HD: tl.constexpr, PDL: tl.constexpr):
    release_next(PDL)
    wait_prior(PDL)
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    p = tl.load(pos_ptr + row).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)
    mi = i < HALF
    c = tl.load(cos_ptr + p * HALF + i, mask=mi, other=0.0)
    s = tl.load(sin_ptr + p * HALF + i, mask=mi, other=0.0)
    src = x_ptr + row * stride_x + head * HD
    dst = out_ptr + row * N + head * HD
    if NEOX:
        ia = i
        ib = i + HALF
    else:
        ia = 2 * i
        ib = 2 * i + 1
    a = tl.load(src + ia, mask=mi, other=0.0).to(tl.float32)
    b = tl.load(src + ib, mask=mi, other=0.0).to(tl.float32)
    release_late(PDL)
    tl.store(dst + ia, a * c - b * s, mask=mi)
    tl.store(dst + ib, a * s + b * c, mask=mi)
    j = tl.arange(0, BLOCK_HD)
    mj = (j >= 2 * HALF) & (j < HD)  # dims past n_rot: copied
    tl.store(dst + j, tl.load(src + j, mask=mj, other=0.0), mask=mj)


def _check_rotation(what: str, head_dim: int, n_rot: int, rows: int, positions: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor) -> None:
    """The checks rope and norm_rope share: n_rot, the positions of `rows` rows, the cos/sin tables."""
    if n_rot > head_dim or n_rot % 2:
        raise UnsupportedError(f"{what}: n_rot must be even and <= head_dim ({head_dim}), got {n_rot}")
    check_tensor(what, "positions", positions, (torch.int32,), ndim=1)
    check_tensor(what, "cos", cos, (torch.float32,), ndim=2)
    check_tensor(what, "sin", sin, (torch.float32,), ndim=2)
    if cos.shape != sin.shape or cos.shape[1] != n_rot // 2:
        raise UnsupportedError(f"{what}: cos and sin must both be [n_ctx, {n_rot // 2}], got "
                               f"{tuple(cos.shape)} and {tuple(sin.shape)}")
    if positions.numel() != rows:
        raise UnsupportedError(f"{what}: {rows} rows but {positions.numel()} positions")


def rope(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int,
         head_dim: int, n_rot: int, neox: bool, out: torch.Tensor | None = None) -> torch.Tensor:
    """out [rows, n_heads * head_dim] f32 = x rotated at `positions` (int32 [rows]); cos/sin f32
    [n_ctx, n_rot / 2]. A position outside the tables is the caller's error: the tables must hold
    n_ctx >= every position (the backend sizes them for its context)."""
    what = "rope"
    for name, v in (("n_heads", n_heads), ("head_dim", head_dim), ("n_rot", n_rot)):
        check_int(what, name, v, 1)
    n = n_heads * head_dim
    x2 = rows_view(what, "x", x, n)
    if x2.dtype != torch.float32:
        raise UnsupportedError(f"{what}: x must be float32, got {x2.dtype}")
    rows = x2.shape[0]
    _check_rotation(what, head_dim, n_rot, rows, positions, cos, sin)
    device = check_device(what, x=x2, positions=positions, cos=cos, sin=sin, out=out)
    out = make_out(what, out, (rows, n), torch.float32, device)
    if rows:
        half = n_rot // 2
        _rope_kernel[check_grid(what, (rows, n_heads))](
            x2, positions, cos, sin, out, x2.stride(0), n, head_dim, half, NEOX=bool(neox),
            BLOCK_HALF=triton.next_power_of_2(half), BLOCK_HD=triton.next_power_of_2(head_dim), num_warps=1,
            **pdl_args())
    return out


@triton.jit
def _norm_rope_kernel(x_ptr, wq_ptr, wk_ptr, pos_ptr, cos_ptr, sin_ptr, out_ptr, stride_x, N, NQ, HD, HALF, eps,
                      NEOX: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_HD: tl.constexpr, PDL: tl.constexpr):
    release_next(PDL)
    wait_prior(PDL)
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    p = tl.load(pos_ptr + row).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)
    mi = i < HALF
    j = tl.arange(0, BLOCK_HD)
    mj = (j >= 2 * HALF) & (j < HD)  # dims past n_rot: normed, not rotated
    if NEOX:
        ia = i
        ib = i + HALF
    else:
        ia = 2 * i
        ib = 2 * i + 1
    src = x_ptr + row * stride_x + head * HD
    a = tl.load(src + ia, mask=mi, other=0.0).to(tl.float32)
    b = tl.load(src + ib, mask=mi, other=0.0).to(tl.float32)
    t = tl.load(src + j, mask=mj, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt((tl.sum(a * a, axis=0) + tl.sum(b * b, axis=0) + tl.sum(t * t, axis=0)) / HD + eps)
    w_ptr = tl.where(head < NQ, wq_ptr, wk_ptr)
    a = a * rstd * tl.load(w_ptr + ia, mask=mi, other=0.0)
    b = b * rstd * tl.load(w_ptr + ib, mask=mi, other=0.0)
    t = t * rstd * tl.load(w_ptr + j, mask=mj, other=0.0)
    c = tl.load(cos_ptr + p * HALF + i, mask=mi, other=0.0)
    s = tl.load(sin_ptr + p * HALF + i, mask=mi, other=0.0)
    release_late(PDL)
    dst = out_ptr + row * N + head * HD
    tl.store(dst + ia, a * c - b * s, mask=mi)
    tl.store(dst + ib, a * s + b * c, mask=mi)
    tl.store(dst + j, t, mask=mj)


def norm_rope(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor, n_heads: int, n_heads_k: int, head_dim: int, n_rot: int, neox: bool, eps: float,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """out [rows, (n_heads + n_heads_k) * head_dim] f32: x's first n_heads heads (q) and the
    n_heads_k after them (k), each RMS-normed over its head_dim values with w_q (q) or w_k (k)
    [head_dim], then rotated at `positions` as `rope` does. x: f32 [rows, >= that width], rows
    may be strided (the q+k+v projection's output, v's columns after them untouched)."""
    what = "norm_rope"
    for name, v in (("n_heads", n_heads), ("n_heads_k", n_heads_k), ("head_dim", head_dim), ("n_rot", n_rot)):
        check_int(what, name, v, 1)
    if not (isinstance(eps, float | int) and eps >= 0):
        raise UnsupportedError(f"{what}: eps must be a number >= 0, got {eps!r}")
    n = (n_heads + n_heads_k) * head_dim
    if x.dim() != 2 or x.shape[-1] < n or x.stride(-1) != 1:
        raise UnsupportedError(f"{what}: x must be [rows, >= {n}] with contiguous rows, got {tuple(x.shape)} "
                               f"strides {tuple(x.stride())}")
    if x.dtype != torch.float32:
        raise UnsupportedError(f"{what}: x must be float32, got {x.dtype}")
    for name, w in (("w_q", w_q), ("w_k", w_k)):
        check_tensor(what, name, w, (torch.float32,), ndim=1)
        if w.numel() != head_dim:
            raise UnsupportedError(f"{what}: {name} must be [{head_dim}], got {tuple(w.shape)}")
    rows = x.shape[0]
    _check_rotation(what, head_dim, n_rot, rows, positions, cos, sin)
    device = check_device(what, x=x, w_q=w_q, w_k=w_k, positions=positions, cos=cos, sin=sin, out=out)
    out = make_out(what, out, (rows, n), torch.float32, device)
    if rows:
        half = n_rot // 2
        _norm_rope_kernel[check_grid(what, (rows, n_heads + n_heads_k))](
            x, w_q, w_k, positions, cos, sin, out, x.stride(0), n, n_heads, head_dim, half, float(eps),
            NEOX=bool(neox), BLOCK_HALF=triton.next_power_of_2(half), BLOCK_HD=triton.next_power_of_2(head_dim),
            num_warps=1 if head_dim <= 128 else 2, **pdl_args())
    return out
