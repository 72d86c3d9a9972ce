"""RMSNorm: out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w.

One program per row (a transformer row is at most a few thousand floats: it fits one program's
registers), the whole row loaded once, the mean of squares reduced in f32 in the program, the
row scaled and stored. The input may be a row-strided view (a column slice of a wider tensor),
the output is contiguous f32. Memory-bound: 8 bytes per element plus the weight.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import UnsupportedError
from ._common import check_device, check_grid, check_tensor, make_out, rows_view

MAX_D = 1 << 16  # one program holds a row


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, D, stride_x, eps, BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * D + cols, x * rstd * w, mask=mask)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """out [rows, d] f32 = RMSNorm of each row of x (f32 [rows, d] or [d], rows may be strided)."""
    what = "rms_norm"
    check_tensor(what, "w", w, (torch.float32,), ndim=1)
    d = w.numel()
    if not 1 <= d <= MAX_D:
        raise UnsupportedError(f"{what}: d must be in 1..{MAX_D}, got {d}")
    x2 = rows_view(what, "x", x, d)
    if x2.dtype != torch.float32:
        raise UnsupportedError(f"{what}: x must be float32, got {x2.dtype}")
    if not (isinstance(eps, float | int) and eps >= 0):
        raise UnsupportedError(f"{what}: eps must be a number >= 0, got {eps!r}")
    device = check_device(what, x=x2, w=w, out=out)
    out = make_out(what, out, x2.shape, torch.float32, device)
    rows = x2.shape[0]
    if rows:
        block = triton.next_power_of_2(d)
        _rms_norm_kernel[check_grid(what, (rows,))](x2, w, out, d, x2.stride(0), float(eps), BLOCK_D=block,
                                                    num_warps=4 if block <= 2048 else 8)
    return out
