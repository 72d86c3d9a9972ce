"""F32 -> Q8_0 quantization on the device (KV-cache compression, seed 004 `quantize_q8_0`).

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

from ..errors import UnsupportedError
from ..quant.types import QUANT_TABLE, GGMLType
from ._common import cdiv, check_device, check_grid, check_tensor, make_out

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
