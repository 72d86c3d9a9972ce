"""Dequantize raw GGUF blocks on the device: every type of the quant table to f16, bf16 or f32.

Data: `raw` holds a [rows][cols] tensor as rows of quant blocks, row-major, exactly as in the
GGUF file (minfer.quant.types documents every block layout). Because each row is a whole number
of blocks, flat block g decodes to the flat output range [g * block_elems, (g+1) * block_elems):
the kernel never needs the row index.

Thread-to-data mapping (seed 000 §2.2 "one lane per quant block"): a program takes BLOCK
consecutive quant blocks and decodes them as one [BLOCK, NSUB, SUBLEN] tile, where a block's
elements are split into NSUB sub-blocks of SUBLEN elements that share their scale bits (Q4_0:
2 x 16, the low and the high nibbles; Q4_K: 8 x 32; Q6_K: 16 x 16). Per-block fields (d, dmin)
load once per block as [BLOCK, 1, 1], per-sub-block scales once per sub-block as
[BLOCK, NSUB, 1]; only the quant bits are loaded per element. Output writes of a program are
one contiguous run. Block offsets are int64 (rows * blocks passes 2^31 on large tensors).

Sharing: `decode_block` (one jit helper per type behind one constexpr switch) is also the
decoder of the embedding gather (embed.py). Adding a type is one helper, one branch and one
`TILES` row.

Exactness: the f32 value of every element is computed with ggml's operation order and no
fused multiply-add (kernels compile with fp fusion off), so the f32 output is bit-identical to
minfer.quant.reference and the f16/bf16 outputs are that value rounded to nearest even.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import UnsupportedError
from ..quant.types import GGMLType, QuantInfo, by_name, quant_info
from ._common import cast_for, cdiv, check_device, check_grid, check_int, check_tensor, make_out, view_as

OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# ggml type ids as jit-visible constants (the constexpr switch in decode_block)
_F32 = tl.constexpr(int(GGMLType.F32))
_F16 = tl.constexpr(int(GGMLType.F16))
_BF16 = tl.constexpr(int(GGMLType.BF16))
_Q4_0 = tl.constexpr(int(GGMLType.Q4_0))
_Q4_1 = tl.constexpr(int(GGMLType.Q4_1))
_Q5_0 = tl.constexpr(int(GGMLType.Q5_0))
_Q5_1 = tl.constexpr(int(GGMLType.Q5_1))
_Q8_0 = tl.constexpr(int(GGMLType.Q8_0))
_Q2_K = tl.constexpr(int(GGMLType.Q2_K))
_Q3_K = tl.constexpr(int(GGMLType.Q3_K))
_Q4_K = tl.constexpr(int(GGMLType.Q4_K))
_Q5_K = tl.constexpr(int(GGMLType.Q5_K))
_Q6_K = tl.constexpr(int(GGMLType.Q6_K))

# (NSUB, SUBLEN): how a block's elements are tiled. Float types are "blocks" of one element.
TILES: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 1),
    GGMLType.F16: (1, 1),
    GGMLType.BF16: (1, 1),
    GGMLType.Q4_0: (2, 16),
    GGMLType.Q4_1: (2, 16),
    GGMLType.Q5_0: (2, 16),
    GGMLType.Q5_1: (2, 16),
    GGMLType.Q8_0: (1, 32),
    GGMLType.Q2_K: (16, 16),
    GGMLType.Q3_K: (16, 16),
    GGMLType.Q4_K: (8, 32),
    GGMLType.Q5_K: (8, 32),
    GGMLType.Q6_K: (16, 16),
}

# How the launcher hands the bytes to the kernel: float types as typed elements (bf16 as its
# int16 bit pattern), quant types as bytes.
_STORAGE = {GGMLType.F32: torch.float32, GGMLType.F16: torch.float16, GGMLType.BF16: torch.int16}

ELEMS_PER_PROGRAM = 2048  # BLOCK * block_elems; 16 per lane at 4 warps
NUM_WARPS = 4


# ---------------------------------------------------------------------------------------------
# field readers: p is a [B, 1, 1] tensor of block start pointers (uint8), mask is [B, 1, 1]


@triton.jit
def _u8(p, off, mask):
    """The bytes at p + off, as int32."""
    return tl.load(p + off, mask=mask, other=0).to(tl.int32)


@triton.jit
def _f16(p, off, mask):
    """The little-endian f16 at byte p + off, widened to f32 (exact)."""
    lo = tl.load(p + off, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(p + off + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _u32(p, off, mask):
    """The little-endian u32 at byte p + off, as int32 bits."""
    lo = _u8(p, off, mask) | (_u8(p, off + 1, mask) << 8)
    return lo | (_u8(p, off + 2, mask) << 16) | (_u8(p, off + 3, mask) << 24)


@triton.jit
def _scale_min_k4(p, j, mask):
    """The 6-bit (scale, min) of sub-block j (0..7) of a Q4_K/Q5_K block (packed at bytes 4..15)."""
    c = j % 4
    lo = _u8(p, 4 + c, mask)
    mid = _u8(p, 8 + c, mask)
    hi = _u8(p, 12 + c, mask)
    sc = tl.where(j < 4, lo & 63, (hi & 0xF) | ((lo >> 2) & 0x30))
    mn = tl.where(j < 4, mid & 63, (hi >> 4) | ((mid >> 2) & 0x30))
    return sc.to(tl.float32), mn.to(tl.float32)


# ---------------------------------------------------------------------------------------------
# one decoder per type: (p [B,1,1], sub [1,NSUB,1], l [1,1,SUBLEN], mask) -> f32 [B, NSUB, SUBLEN]
# element index within the block: e = sub * SUBLEN + l


@triton.jit
def _decode_q4_0(p, sub, l, mask):
    q = (_u8(p, 2 + l, mask) >> (4 * sub)) & 0xF
    return (q - 8).to(tl.float32) * _f16(p, 0, mask)


@triton.jit
def _decode_q4_1(p, sub, l, mask):
    q = (_u8(p, 4 + l, mask) >> (4 * sub)) & 0xF
    return q.to(tl.float32) * _f16(p, 0, mask) + _f16(p, 2, mask)


@triton.jit
def _decode_q5_0(p, sub, l, mask):
    hb = (_u32(p, 2, mask) >> (sub * 16 + l)) & 1
    q = ((_u8(p, 6 + l, mask) >> (4 * sub)) & 0xF) | (hb << 4)
    return (q - 16).to(tl.float32) * _f16(p, 0, mask)


@triton.jit
def _decode_q5_1(p, sub, l, mask):
    hb = (_u32(p, 4, mask) >> (sub * 16 + l)) & 1
    q = ((_u8(p, 8 + l, mask) >> (4 * sub)) & 0xF) | (hb << 4)
    return q.to(tl.float32) * _f16(p, 0, mask) + _f16(p, 2, mask)


@triton.jit
def _decode_q8_0(p, sub, l, mask):
    q = tl.load(p + 2 + l, mask=mask, other=0).to(tl.int8, bitcast=True)
    return q.to(tl.float32) * _f16(p, 0, mask)


@triton.jit
def _decode_q2_k(p, j, l, mask):
    # 16 sub-blocks of 16; quant byte qs[(j//8)*32 + (j%2)*16 + l], 2 bits at 2 * ((j%8)//2)
    sc = _u8(p, j, mask)
    dl = _f16(p, 80, mask) * (sc & 0xF).to(tl.float32)
    ml = _f16(p, 82, mask) * (sc >> 4).to(tl.float32)
    q = (_u8(p, 16 + (j // 8) * 32 + (j % 2) * 16 + l, mask) >> (2 * ((j % 8) // 2))) & 3
    return q.to(tl.float32) * dl - ml


@triton.jit
def _decode_q3_k(p, j, l, mask):
    # 6-bit signed scale j: low 4 bits from byte j%8 (nibble j//8), high 2 from byte 8 + j%4
    low4 = (_u8(p, 96 + j % 8, mask) >> (4 * (j // 8))) & 0xF
    high2 = (_u8(p, 104 + j % 4, mask) >> (2 * (j // 4))) & 3
    dl = _f16(p, 108, mask) * ((low4 | (high2 << 4)) - 32).to(tl.float32)
    c = (j % 2) * 16 + l  # position within the 32-byte runs of qs and hmask
    low2 = (_u8(p, 32 + (j // 8) * 32 + c, mask) >> (2 * ((j % 8) // 2))) & 3
    hbit = (_u8(p, c, mask) >> (j // 2)) & 1
    q = low2 - ((hbit ^ 1) << 2)  # minus 4 where the hmask bit is clear
    return q.to(tl.float32) * dl


@triton.jit
def _decode_q4_k(p, j, l, mask):
    sc, mn = _scale_min_k4(p, j, mask)
    dl = _f16(p, 0, mask) * sc
    ml = _f16(p, 2, mask) * mn
    q = (_u8(p, 16 + (j // 2) * 32 + l, mask) >> (4 * (j % 2))) & 0xF
    return q.to(tl.float32) * dl - ml


@triton.jit
def _decode_q5_k(p, j, l, mask):
    sc, mn = _scale_min_k4(p, j, mask)
    dl = _f16(p, 0, mask) * sc
    ml = _f16(p, 2, mask) * mn
    hb = (_u8(p, 16 + l, mask) >> j) & 1
    q = ((_u8(p, 48 + (j // 2) * 32 + l, mask) >> (4 * (j % 2))) & 0xF) | (hb << 4)
    return q.to(tl.float32) * dl - ml


@triton.jit
def _decode_q6_k(p, j, l, mask):
    # 16 sub-blocks of 16: 4 low bits from ql, 2 high bits from qh, int8 scale per sub-block
    sc = tl.load(p + 192 + j, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)
    dl = _f16(p, 208, mask) * sc
    low4 = (_u8(p, (j // 8) * 64 + (j % 4) * 16 + l, mask) >> (4 * ((j % 8) // 4))) & 0xF
    high2 = (_u8(p, 128 + (j // 8) * 32 + (j % 2) * 16 + l, mask) >> (2 * ((j % 8) // 2))) & 3
    q = (low4 | (high2 << 4)) - 32
    return q.to(tl.float32) * dl


@triton.jit
def decode_block(p, sub, l, mask, QTYPE: tl.constexpr):
    """f32 values [B, NSUB, SUBLEN] of the blocks at `p` ([B, 1, 1] block pointers, masked by
    `mask`). For F32/F16/BF16, `p` points at typed elements (BF16 as int16) and the tile is
    [B, 1, 1]."""
    if QTYPE == _F32:
        return tl.load(p, mask=mask, other=0.0)
    elif QTYPE == _F16:
        return tl.load(p, mask=mask, other=0.0).to(tl.float32)
    elif QTYPE == _BF16:
        return (tl.load(p, mask=mask, other=0).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    elif QTYPE == _Q4_0:
        return _decode_q4_0(p, sub, l, mask)
    elif QTYPE == _Q4_1:
        return _decode_q4_1(p, sub, l, mask)
    elif QTYPE == _Q5_0:
        return _decode_q5_0(p, sub, l, mask)
    elif QTYPE == _Q5_1:
        return _decode_q5_1(p, sub, l, mask)
    elif QTYPE == _Q8_0:
        return _decode_q8_0(p, sub, l, mask)
    elif QTYPE == _Q2_K:
        return _decode_q2_k(p, sub, l, mask)
    elif QTYPE == _Q3_K:
        return _decode_q3_k(p, sub, l, mask)
    elif QTYPE == _Q4_K:
        return _decode_q4_k(p, sub, l, mask)
    elif QTYPE == _Q5_K:
        return _decode_q5_k(p, sub, l, mask)
    else:
        tl.static_assert(QTYPE == _Q6_K, "decode_block: unknown ggml type")
        return _decode_q6_k(p, sub, l, mask)


@triton.jit
def _dequant_kernel(
    src_ptr,
    out_ptr,
    n_blocks,
    QTYPE: tl.constexpr,
    BLOCK_BYTES: tl.constexpr,
    NSUB: tl.constexpr,
    SUBLEN: tl.constexpr,
    BLOCK: tl.constexpr,
    EVEN: tl.constexpr,
):
    blk = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    blk3 = blk[:, None, None]
    if EVEN:  # no partial program: a constant mask folds away and the accesses vectorize
        mask = tl.full([BLOCK, 1, 1], 1, tl.int1)
    else:
        mask = blk3 < n_blocks
    sub = tl.arange(0, NSUB)[None, :, None]
    l = tl.arange(0, SUBLEN)[None, None, :]
    vals = decode_block(src_ptr + blk3 * BLOCK_BYTES, sub, l, mask, QTYPE)
    out = out_ptr + blk3 * (NSUB * SUBLEN) + sub * SUBLEN + l
    tl.store(out, cast_for(vals, out_ptr), mask=mask)


# ---------------------------------------------------------------------------------------------
# launcher helpers shared with embed.py


def resolve_qtype(what: str, qtype: GGMLType | int | str) -> QuantInfo:
    """The quant table row for a type given as GGMLType, ggml id or name; UnsupportedError if unknown."""
    if isinstance(qtype, str):
        info = by_name(qtype)
    elif isinstance(qtype, int) and not isinstance(qtype, bool):  # GGMLType is an int
        info = quant_info(qtype)
    else:
        raise UnsupportedError(f"{what}: qtype must be a GGMLType, ggml type id or name, got {qtype!r}")
    if info.type not in TILES:
        raise UnsupportedError(f"{what}: no device decoder for {info.name}")
    return info


def kernel_source(what: str, raw: torch.Tensor, info: QuantInfo) -> tuple[torch.Tensor, int]:
    """(tensor the kernel reads, stride of one block in its elements) for raw bytes of `info`."""
    storage = _STORAGE.get(info.type)
    if storage is None:
        return raw, info.block_bytes
    return view_as(what, raw, storage), 1


def tile_meta(info: QuantInfo) -> dict:
    """The constexpr kernel arguments that select and shape the decoder of `info`."""
    nsub, sublen = TILES[info.type]
    return dict(QTYPE=int(info.type), NSUB=nsub, SUBLEN=sublen)


def blocks_per_program(info: QuantInfo) -> int:
    """Quant blocks one program decodes: ELEMS_PER_PROGRAM elements' worth (a power of two)."""
    return max(1, ELEMS_PER_PROGRAM // info.block_elems)


def dequant(
    raw_u8: torch.Tensor,
    qtype: GGMLType | int | str,
    rows: int,
    cols: int,
    out_dtype: torch.dtype = torch.float16,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode a [rows, cols] tensor stored as GGUF blocks of `qtype` into `out_dtype` [rows, cols].

    `raw_u8`: contiguous uint8 tensor of exactly rows * cols / block_elems * block_bytes bytes
    (any shape). `cols` must be a multiple of the block size. F32/F16/BF16 data must be aligned
    to its element size (GGUF tensor data always is). out_dtype: float16, bfloat16 or float32.
    """
    what = "dequant"
    info = resolve_qtype(what, qtype)
    check_tensor(what, "raw_u8", raw_u8, (torch.uint8,))
    if out_dtype not in OUT_DTYPES:
        raise UnsupportedError(f"{what}: out_dtype must be float16, bfloat16 or float32, got {out_dtype}")
    check_int(what, "rows", rows)
    check_int(what, "cols", cols)
    if cols % info.block_elems:
        raise UnsupportedError(
            f"{what}: {info.name} rows must be whole blocks: "
            f"cols={cols} is not a multiple of {info.block_elems}"
        )
    n_blocks = rows * (cols // info.block_elems)
    if raw_u8.numel() != n_blocks * info.block_bytes:
        raise UnsupportedError(
            f"{what}: {info.name} [{rows}, {cols}] needs {n_blocks * info.block_bytes} bytes, "
            f"got {raw_u8.numel()}"
        )
    device = check_device(what, raw_u8=raw_u8, out=out)
    out = make_out(what, out, (rows, cols), out_dtype, device)
    if n_blocks:
        src, block_stride = kernel_source(what, raw_u8, info)
        block = blocks_per_program(info)
        grid = check_grid(what, (cdiv(n_blocks, block),))
        _dequant_kernel[grid](
            src, out, n_blocks, BLOCK_BYTES=block_stride, BLOCK=block, EVEN=n_blocks % block == 0,
            **tile_meta(info), num_warps=NUM_WARPS, enable_fp_fusion=False,
        )
    return out
