"""RMSNorm: out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w, alone or fused with the
residual add before it (`add_rms_norm`: h = x + y, out = RMSNorm(h), and h written back where
the caller asks, e.g. into x: one pass instead of an add kernel and a norm kernel), or with
gemma's post-norm of y as well (`norm_add_rms_norm`: h = x + RMSNorm(y): three ops, one pass).

One program per row (a transformer row is at most a few thousand floats: it fits one program's
registers), the whole row loaded once, the mean of squares reduced in f32 in the program, the
row scaled and stored. The input may be a row-strided view (a column slice of a wider tensor),
the output is contiguous f32. Memory-bound: 8 bytes per element plus the weight. On request the
normed row is also stored in the int8 form of the GEMVs after it (`q8=`: quantize_act_q8's
blocks, computed from the same f32 values: the GEMV reads them instead of a quantize launch).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import UnsupportedError
from ._common import (
    check_device,
    check_grid,
    check_tensor,
    make_out,
    pdl_args,
    release_late,
    release_next,
    rows_view,
    wait_prior,
)
from .quantize import act_q8_blocks, act_q8_out

MAX_D = 1 << 16  # one program holds a row


@triton.jit
def _store_row(out_ptr, y, row, cols, mask, D, q_ptr, s_ptr, BLOCK_D: tl.constexpr, Q8: tl.constexpr):
    """The normed row y, and with Q8 > 0 its int8 form in Q8 passes (quantize.quantize_act_q8's)."""
    tl.store(out_ptr + row * D + cols, y, mask=mask)
    if Q8 > 0:
        NB: tl.constexpr = BLOCK_D // 32
        nb = D // 32
        blk = tl.arange(0, NB)
        act_q8_blocks(tl.reshape(y, (NB, 4, 8)), q_ptr + row * nb * (8 * Q8), s_ptr + row * nb * 4, blk, blk < nb, Q8)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, D, stride_x, eps, q_ptr, s_ptr, GROUPS, BLOCK_D: tl.constexpr,
                     Q8: tl.constexpr, PDL: tl.constexpr):
    """Program `row` normalises run row % GROUPS (of D values) of x's row row // GROUPS (GROUPS = 1:
    whole rows); the output is [rows * GROUPS, D], contiguous."""
    release_next(PDL)
    wait_prior(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    x = tl.load(x_ptr + (row // GROUPS) * stride_x + (row % GROUPS) * D + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    release_late(PDL)
    _store_row(out_ptr, x * rstd * w, row, cols, mask, D, q_ptr, s_ptr, BLOCK_D, Q8)


@triton.jit
def _add_rms_norm_kernel(x_ptr, y_ptr, w_ptr, out_ptr, sum_ptr, D, eps, q_ptr, s_ptr, wy_ptr,
                         BLOCK_D: tl.constexpr, WRITE_SUM: tl.constexpr, Q8: tl.constexpr, NORM_Y: tl.constexpr,
                         PDL: tl.constexpr):
    release_next(PDL)
    wait_prior(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    y = tl.load(y_ptr + row * D + cols, mask=mask, other=0.0)
    if NORM_Y:  # gemma's post-norm of the block's output, before the residual add
        y = y * (1.0 / tl.sqrt(tl.sum(y * y, axis=0) / D + eps)) * tl.load(wy_ptr + cols, mask=mask, other=0.0)
    h = tl.load(x_ptr + row * D + cols, mask=mask, other=0.0) + y
    release_late(PDL)
    if WRITE_SUM:
        tl.store(sum_ptr + row * D + cols, h, mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / D + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    _store_row(out_ptr, h * rstd * w, row, cols, mask, D, q_ptr, s_ptr, BLOCK_D, Q8)


def add_rms_norm(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, eps: float, out: torch.Tensor | None = None,
                 sum_out: torch.Tensor | None = None, q8: tuple | None = None) -> torch.Tensor:
    """out [rows, d] f32 = RMSNorm(x + y) for contiguous f32 x, y [rows, d] (or [d]); with
    `sum_out` (which may be x itself: the residual updated in place) x + y is stored there too;
    with `q8` = (codes, scales) buffers of quantize_act_q8's shapes, out's int8 form as well (the
    values quantize_act_q8(out) computes: the GEMV after it reads them, one launch fewer)."""
    return _add_rms_norm("add_rms_norm", x, y, None, w, eps, out, sum_out, q8)


def norm_add_rms_norm(x: torch.Tensor, y: torch.Tensor, w_y: torch.Tensor, w: torch.Tensor, eps: float,
                      out: torch.Tensor | None = None, sum_out: torch.Tensor | None = None,
                      q8: tuple | None = None) -> torch.Tensor:
    """out = RMSNorm(x + RMSNorm(y) with w_y) with w, both norms with `eps`: gemma's post-norm of a
    block's output, the residual add and the next block's norm, in one pass; `sum_out` and `q8`
    as for add_rms_norm (the sum is x + RMSNorm(y))."""
    what = "norm_add_rms_norm"
    check_tensor(what, "w_y", w_y, (torch.float32,), ndim=1)
    if w_y.shape != w.shape:
        raise UnsupportedError(f"{what}: w_y and w must both be [d], got {tuple(w_y.shape)} and {tuple(w.shape)}")
    return _add_rms_norm(what, x, y, w_y, w, eps, out, sum_out, q8)


def _add_rms_norm(what: str, x: torch.Tensor, y: torch.Tensor, w_y: torch.Tensor | None, w: torch.Tensor, eps: float,
                  out: torch.Tensor | None, sum_out: torch.Tensor | None, q8: tuple | None) -> torch.Tensor:
    check_tensor(what, "w", w, (torch.float32,), ndim=1)
    d = w.numel()
    if not 1 <= d <= MAX_D:
        raise UnsupportedError(f"{what}: d must be in 1..{MAX_D}, got {d}")
    check_tensor(what, "x", x, (torch.float32,), ndim=(1, 2))
    check_tensor(what, "y", y, (torch.float32,), ndim=(1, 2))
    if x.shape != y.shape or x.shape[-1] != d:
        raise UnsupportedError(f"{what}: x and y must both be [rows, {d}], got {tuple(x.shape)} and {tuple(y.shape)}")
    if not (isinstance(eps, float | int) and eps >= 0):
        raise UnsupportedError(f"{what}: eps must be a number >= 0, got {eps!r}")
    device = check_device(what, x=x, y=y, w=w, w_y=w_y, out=out, sum_out=sum_out)
    out = make_out(what, out, x.shape, torch.float32, device)
    if sum_out is not None:
        make_out(what, sum_out, x.shape, torch.float32, device)
    rows = x.numel() // d
    codes, scales, passes = (out, out, 0) if q8 is None else act_q8_out(what, q8, rows, d, device)
    if rows:
        block = triton.next_power_of_2(d)
        _add_rms_norm_kernel[check_grid(what, (rows,))](
            x, y, w, out, sum_out if sum_out is not None else out, d, float(eps), codes, scales,
            w if w_y is None else w_y, BLOCK_D=block, WRITE_SUM=sum_out is not None, Q8=passes,
            NORM_Y=w_y is not None, num_warps=4 if block <= 2048 else 8, **pdl_args())
    return out


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, out: torch.Tensor | None = None,
             q8: tuple | None = None, group: int | None = None) -> torch.Tensor:
    """out [rows, d] f32 = RMSNorm of each row of x (f32 [rows, d] or [d], rows may be strided);
    `q8` as for add_rms_norm. `group`: each run of `group` values of a row normed on its own, w
    [group] shared by the runs (qwen3's / gemma3's per-head q and k norms; rows may be strided,
    the runs of a row are contiguous); out keeps x's shape."""
    what = "rms_norm"
    check_tensor(what, "w", w, (torch.float32,), ndim=1)
    d = w.numel()
    if not 1 <= d <= MAX_D:
        raise UnsupportedError(f"{what}: d must be in 1..{MAX_D}, got {d}")
    width = x.shape[-1] if x.dim() and group is not None else d
    if group is not None and (group != d or width % d or q8 is not None):
        raise UnsupportedError(f"{what}: group {group} must be w's length {d} and divide x's width {width} "
                               "(and a grouped norm writes no int8 records)")
    x2 = rows_view(what, "x", x, width)
    if x2.dtype != torch.float32:
        raise UnsupportedError(f"{what}: x must be float32, got {x2.dtype}")
    if not (isinstance(eps, float | int) and eps >= 0):
        raise UnsupportedError(f"{what}: eps must be a number >= 0, got {eps!r}")
    device = check_device(what, x=x2, w=w, out=out)
    out = make_out(what, out, x2.shape if group is None else x.shape, torch.float32, device)
    rows, groups = x2.shape[0], width // d
    codes, scales, passes = (out, out, 0) if q8 is None else act_q8_out(what, q8, rows, d, device)
    if rows:
        block = triton.next_power_of_2(d)
        _rms_norm_kernel[check_grid(what, (rows * groups,))](
            x2, w, out, d, x2.stride(0), float(eps), codes, scales, groups, BLOCK_D=block, Q8=passes,
            num_warps=4 if block <= 2048 else 8, **pdl_args())
    return out
