"""F32 -> Q8_0 quantization on the device (KV-cache compression, seed 004 `quantize_q8_0`), and
the int8 activations of the decode GEMVs (`quantize_act_q8`).

Q8_0 block (34 bytes, 32 elements): d = max|x| / 127 stored as f16, then 32 int8 codes
q = round(x * (1/d)), round half away from zero; an all-zero block stores d = 0 and zero codes.
This is ggml's reference quantizer, and the kernel reproduces it bit for bit
(minfer.quant.reference.quantize is the oracle): d and 1/d are correctly rounded f32 divisions
(`div_rn`, not the GPU's fast approximate divide), the codes use 1/d computed from the f32 d (not
from the stored f16), and rounding is trunc(v) + trunc(2 * frac(v)), exact in f32.

Mapping: a program quantizes BLOCK blocks as a [BLOCK, 32] tile; the max is a per-row reduction
inside the tile, so no cross-program communication and every output byte has one writer
(bit-stable). Q8_0 -> f32 (reading the cache back) is `dequant(..., GGMLType.Q8_0, ...)`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import UnsupportedError
from ...quant.types import QUANT_TABLE, GGMLType
from ._common import cdiv, check_device, check_grid, check_tensor, make_out, pdl_args, release_next, wait_prior

Q8_0 = QUANT_TABLE[GGMLType.Q8_0]
BLOCK = 64  # quant blocks per program: 2048 elements, 16 per lane at 4 warps
NUM_WARPS = 4


@triton.jit
def _quantize_q8_0_kernel(x_ptr, out_ptr, n_blocks, BLOCK: tl.constexpr):
    blk = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = blk[:, None] < n_blocks
    e = tl.arange(0, 32)[None, :]
    x = tl.load(x_ptr + blk[:, None] * 32 + e, mask=mask, other=0.0)
    d = tl.math.div_rn(tl.max(tl.abs(x), axis=1), 127.0)
    inv = tl.where(d == 0.0, 0.0, tl.math.div_rn(tl.full(d.shape, 1.0, tl.float32), d))
    v = x * inv[:, None]
    whole = v.to(tl.int32)  # truncates toward zero
    q = whole + ((v - whole.to(tl.float32)) * 2.0).to(tl.int32)
    dst = out_ptr + blk * 34
    d_bits = d.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
    row_mask = blk < n_blocks
    tl.store(dst, (d_bits & 0xFF).to(tl.uint8), mask=row_mask)
    tl.store(dst + 1, ((d_bits >> 8) & 0xFF).to(tl.uint8), mask=row_mask)
    tl.store(dst[:, None] + 2 + e, (q & 0xFF).to(tl.uint8), mask=mask)


def quantize_q8_0(x_f32: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Quantize f32 rows to Q8_0 blocks: uint8 of shape (*x.shape[:-1], x.shape[-1] // 32 * 34).

    The last dimension (the row) must be a multiple of 32. Same layout as
    `minfer.quant.reference.quantize(x, Q8_0)` and as GGUF Q8_0 tensor data. Inputs must be
    finite: NaN/inf give unspecified codes, as in ggml.
    """
    what = "quantize_q8_0"
    check_tensor(what, "x_f32", x_f32, (torch.float32,))
    if x_f32.dim() == 0 or x_f32.shape[-1] % Q8_0.block_elems:
        shape = tuple(x_f32.shape)
        raise UnsupportedError(f"{what}: the last dimension must be a multiple of 32, got shape {shape}")
    device = check_device(what, x_f32=x_f32, out=out)
    shape = (*x_f32.shape[:-1], x_f32.shape[-1] // Q8_0.block_elems * Q8_0.block_bytes)
    out = make_out(what, out, shape, torch.uint8, device)
    n_blocks = x_f32.numel() // Q8_0.block_elems
    if n_blocks:
        grid = check_grid(what, (cdiv(n_blocks, BLOCK),))
        _quantize_q8_0_kernel[grid](
            x_f32, out, n_blocks, BLOCK=BLOCK, num_warps=NUM_WARPS, enable_fp_fusion=False
        )
    return out


# ---------------------------------------------------------------------------------------------
# int8 activations for the dp4a GEMVs (gemv.py, GemvConfig.q8)
#
# Each 32-element block of an activation row becomes 32 int8 codes q1 = round(x / dx1), dx1 =
# max|x| / 127 (llama.cpp's Q8_1 activations); with two passes the rounding residue r = x - dx1 q1
# is quantized the same way (q2, dx2: x = dx1 q1 + dx2 q2 to ~1/254 of the first pass's error).
# Per block: the codes of pass p in words 8 p .. 8 p + 7 (of 8 PASSES) and the f32 scales (dx1,
# dx2, s = dx1 sum(q1) + dx2 sum(q2), 0): the offset terms of Q4_0 (-8 * d) and Q4_1 / Q4_K (the
# block minimum) multiply s. The codes are stored in the order of the GEMV's nibble words
# (q4_0.py: slot s of nibble word j is element 4 s + j): code word j (j < 4) holds the codes of
# elements 8 t + j (t = 0..3, byte t), code word 4 + j those of elements 8 t + 4 + j, so `w &
# 0x0F0F0F0F` and `(w >> 4) & 0x0F0F0F0F` of nibble word j meet their codes byte for byte in one
# dp4a each.

ACT_BLOCK = 32  # activation blocks per program


@triton.jit
def _act_pass(v):
    """(codes, scale) of one int8 pass over blocks v [BLOCK, 4, 8]: round half away from zero."""
    d = tl.max(tl.max(tl.abs(v), axis=2), axis=1) / 127.0
    inv = tl.where(d == 0.0, 0.0, 1.0 / d)
    y = v * inv[:, None, None]
    whole = y.to(tl.int32)  # truncates toward zero; + trunc(2 frac)
    return whole + ((y - whole.to(tl.float32)) * 2.0).to(tl.int32), d


@triton.jit
def _act_store(q_ptr, q, blk, row, t, PASSES: tl.constexpr):
    words = tl.sum((q & 0xFF) << (t * 8), axis=1)  # the 4 bytes of each word are disjoint: sum = or
    tl.store(q_ptr + blk[:, None] * (8 * PASSES) + tl.arange(0, 8)[None, :], words, mask=row[:, None])


@triton.jit
def act_q8_blocks(v, q_ptr, s_ptr, blk, row, PASSES: tl.constexpr):
    """Quantize the blocks v [B, 4 (t), 8 (word)] (element 8 t + word of block blk) in PASSES
    passes; store their codes and scales at blk (rows where `row`). Also the fused RMSNorm's."""
    t = tl.arange(0, 4)[None, :, None]
    q, d = _act_pass(v)
    _act_store(q_ptr, q, blk, row, t, PASSES)
    s = d * tl.sum(tl.sum(q, axis=2), axis=1).to(tl.float32)
    d2 = tl.zeros_like(d)
    if PASSES == 2:
        q2, d2 = _act_pass(v - q.to(tl.float32) * d[:, None, None])
        _act_store(q_ptr + 8, q2, blk, row, t, PASSES)
        s += d2 * tl.sum(tl.sum(q2, axis=2), axis=1).to(tl.float32)
    tl.store(s_ptr + blk * 4, d, mask=row)
    tl.store(s_ptr + blk * 4 + 1, d2, mask=row)
    tl.store(s_ptr + blk * 4 + 2, s, mask=row)
    tl.store(s_ptr + blk * 4 + 3, tl.zeros_like(s), mask=row)


@triton.jit
def _quantize_act_kernel(x_ptr, q_ptr, s_ptr, n_blocks, BLOCK: tl.constexpr, PASSES: tl.constexpr,
                         PDL: tl.constexpr):
    release_next(PDL)
    blk = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    t = tl.arange(0, 4)[None, :, None]
    m = tl.arange(0, 8)[None, None, :]
    row = blk < n_blocks
    wait_prior(PDL)
    x = tl.load(x_ptr + blk[:, None, None] * 32 + t * 8 + m, mask=row[:, None, None], other=0.0)  # [BLOCK, t, word]
    act_q8_blocks(x, q_ptr, s_ptr, blk, row, PASSES)


def act_q8_out(what: str, q8, m: int, k: int, device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(codes, scales, passes) of preallocated quantize_act_q8 outputs for [m, k] (checked)."""
    if not (isinstance(q8, tuple) and len(q8) == 2):
        raise UnsupportedError(f"{what}: q8 must be (codes int32, scales f32) buffers, got {type(q8).__name__}")
    if k % 32:
        raise UnsupportedError(f"{what}: the row length must be a multiple of 32 for int8 output, got {k}")
    codes, scales = q8
    check_tensor(what, "q8 codes", codes, (torch.int32,), ndim=3)
    passes = codes.shape[-1] // 8
    make_out(what, codes, (m, k // 32, 8 * passes), torch.int32, device)
    make_out(what, scales, (m, k // 32, 4), torch.float32, device)
    if passes not in (1, 2):
        raise UnsupportedError(f"{what}: q8 codes hold 1 or 2 passes (8 or 16 words per block), got {codes.shape[-1]}")
    return codes, scales, passes


def quantize_act_q8(x: torch.Tensor, passes: int = 1, out: tuple[torch.Tensor, torch.Tensor] | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """f32 rows [m, k] -> (codes int32 [m, k / 32, 8 * passes], scales f32 [m, k / 32, 4]): the
    int8 activations of the dp4a GEMVs in 1 or 2 passes (see above); k a multiple of 32, x finite."""
    what = "quantize_act_q8"
    check_tensor(what, "x", x, (torch.float32,), ndim=2)
    m, k = x.shape
    if k % 32:
        raise UnsupportedError(f"{what}: the row length must be a multiple of 32, got {k}")
    if passes not in (1, 2):
        raise UnsupportedError(f"{what}: passes must be 1 or 2, got {passes!r}")
    device = check_device(what, x=x)
    shapes = (m, k // 32, 8 * passes), (m, k // 32, 4)
    if out is None:
        out = (torch.empty(shapes[0], dtype=torch.int32, device=device),
               torch.empty(shapes[1], dtype=torch.float32, device=device))
    codes = make_out(what, out[0], shapes[0], torch.int32, device)
    scales = make_out(what, out[1], shapes[1], torch.float32, device)
    n_blocks = m * k // 32
    if n_blocks:
        grid = check_grid(what, (cdiv(n_blocks, ACT_BLOCK),))
        _quantize_act_kernel[grid](x, codes, scales, n_blocks, BLOCK=ACT_BLOCK, PASSES=passes, num_warps=1,
                                   **pdl_args())
    return codes, scales
