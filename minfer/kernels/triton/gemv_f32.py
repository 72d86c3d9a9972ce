"""The GEMV of F32 weights for a few rows (contract: gemv_f32.fkc.md).

    gemv_f32: out [m, n] f32 = x [m, k] @ W^T,  W an F32 weight [n, k] (its GGUF bytes viewed as f32)

A mixture of experts' router is F32 in every published mix, and its logits choose the experts:
they are multiplied in f32, never rounded to f16 (llama.cpp does the same). For decode rows and
batches (m <= 32) cuBLAS took two launches (its GEMV and the copy into the step's buffer) outside
the chain of programmatic dependent launches; this kernel is one launch inside it. Program (j, r)
sums BLOCK_N rows of W against x row r: each lane accumulates its columns over the K steps in
f32, then the tile reduces along K. The order of every sum is fixed by (n, k) alone, so a row's
logits do not depend on the rows beside it (batch invariance: the same experts at B=1 and B=16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import UnsupportedError
from ._common import (
    cdiv,
    check_device,
    check_grid,
    check_int,
    check_tensor,
    make_out,
    pdl_args,
    release_next,
    wait_prior,
)
from .torch_ops import f32_weight

BLOCK_K = 256  # columns a step (a lane's 2 values a row at 4 warps)
MAX_ROWS = 32  # the rows it is for (the contract's fast path); more run too, one program column each


@triton.jit
def _gemv_f32_kernel(x_ptr, w_ptr, out_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     EVEN_K: tl.constexpr, PDL: tl.constexpr):
    release_next(PDL)
    pid_n = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w_rows = w_ptr + tl.minimum(rows, N - 1).to(tl.int64)[:, None] * K  # clamped loads, masked store
    cols = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    wait_prior(PDL)  # x is the kernel before's output
    for k0 in range(0, K, BLOCK_K):
        c = k0 + cols
        if EVEN_K:
            w = tl.load(w_rows + c[None, :])
            x = tl.load(x_ptr + row * K + c)
        else:
            w = tl.load(w_rows + c[None, :], mask=(c < K)[None, :], other=0.0)
            x = tl.load(x_ptr + row * K + c, mask=c < K, other=0.0)
        acc += w * x[None, :]
    tl.store(out_ptr + row * N + rows, tl.sum(acc, axis=1), mask=rows < N)


def gemv_block_n(n: int) -> int:
    """Rows of W a program: 4, or 2 where that keeps >= 64 programs a row (a router of 32-128 experts)."""
    return 2 if n < 256 else 4


def gemv_f32(x: torch.Tensor, w: torch.Tensor, n: int, k: int, qtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """out [m, n] f32 = x [m, k] (or [k]) @ W^T in f32 for an F32 weight (raw GGUF bytes, or the
    [n, k] float32 view `f32_weight` makes, which is its load layout: no copy)."""
    what = "gemv_f32"
    check_int(what, "n", n, 1)
    check_int(what, "k", k, 1)
    w = f32_weight(w, n, k, qtype)
    x2 = x.reshape(1, -1) if x.dim() == 1 else x
    check_tensor(what, "x", x2, (torch.float32,), ndim=2)
    if x2.shape[1] != k or not x2.is_contiguous():
        raise UnsupportedError(f"{what}: x must be contiguous [m, {k}], got {tuple(x.shape)}")
    device = check_device(what, x=x2, w=w, out=out)
    m = x2.shape[0]
    out = make_out(what, out, (m, n), torch.float32, device)
    if m:
        bn = gemv_block_n(n)
        _gemv_f32_kernel[check_grid(what, (cdiv(n, bn), m))](x2, w, out, n, k, BLOCK_N=bn, BLOCK_K=BLOCK_K,
                                                             EVEN_K=k % BLOCK_K == 0, num_warps=4, **pdl_args())
    return out
