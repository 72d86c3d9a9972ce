"""Dequantize raw GGUF blocks on the device: every type of the quant table to f16, bf16 or f32.

Data: `raw` holds a [rows][cols] tensor as rows of quant blocks, row-major, exactly as in the
GGUF file (minfer.quant.types documents every block layout). Because each row is a whole number
of blocks, flat block g decodes to the flat output range [g * block_elems, (g+1) * block_elems):
the kernel never needs the row index. The embedding gather (embed.py) runs the same kernel with
GATHER on: there output block g (of row t = g // blocks_per_row) reads the same block of table
row ids[t]; float tables are then read in blocks of up to 32 elements (`gather_tile`).

Two decoder shapes, one per family, both behind `decode_store` (a constexpr switch on the type;
the lookup types IQ4_NL, MXFP4 and IQ4_XS take the legacy tile, IQ4_XS as 16 x 16 per super-block,
their codes looked up in the table's 4 words by selects: `_lut`):

- Legacy 32-element types and floats: a program decodes BLOCK blocks as one
  [BLOCK, NSUB, SUBLEN] tile (Q4_0: 2 x 16, the low and the high nibbles; floats are blocks of
  one element). Per-block fields load once per block as [BLOCK, 1, 1]; only the quant bits load
  per element.
- K-quants (256-element super-blocks): every quant byte carries bits of 2 to 4 elements, so
  reading bytes per element cost 20-24 instructions per element (run 1: 51-62% of copy
  bandwidth). Instead each decoder walks the block's bit groups with a compile-time loop
  (`tl.static_range`): for group g it holds a [32, BLOCK] tile (element l = 0..31 of the group
  along the first axis), reads the 32-bit words holding bytes l (four elements share a word, so
  the compiler issues one load per word), assembles the codes with word-wide shifts and masks
  and turns each into a float with one LOP3 and one FADD (`_emit`: the magic-number trick, exact,
  with no per-element shift and no int->float conversion, which runs at a quarter of the FP32
  rate). Because the group index is a compile-time constant, every sub-block scale is decoded
  with constant shifts once per thread: 6.5-8 instructions per element in all.

Alignment: words are read through 32-bit pointers where the block size is a multiple of 4 (Q2_K,
Q4_K, Q5_K) and as two 16-bit halves where it is only even (Q3_K, Q6_K); f16 fields load as
f16. So the launcher requires the raw data 4-byte aligned (GGUF tensor data always is).

Exactness: the f32 value of every element is computed with ggml's operation order and no
fused multiply-add (kernels compile with fp fusion off), so the f32 output is bit-identical to
minfer.quant.reference and the f16/bf16 outputs are that value rounded to nearest even.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import UnsupportedError
from ...quant.types import KVALUES_IQ4NL, KVALUES_MXFP4, GGMLType, QuantInfo, by_name, quant_info
from ._common import cast_for, cdiv, check_device, check_grid, check_int, check_tensor, e8m0_half, make_out, view_as

OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# ggml type ids as jit-visible constants (the constexpr switch in decode_store)
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
_IQ4_NL = tl.constexpr(int(GGMLType.IQ4_NL))
_IQ4_XS = tl.constexpr(int(GGMLType.IQ4_XS))
_MXFP4 = tl.constexpr(int(GGMLType.MXFP4))


def _words(table) -> tuple[tl.constexpr, ...]:
    """A 16-entry int8 table as 4 int32 words of its bytes (byte b of word w: entry 4 w + b)."""
    words = [sum((table[4 * w + b] & 0xFF) << (8 * b) for b in range(4)) for w in range(4)]
    return tuple(tl.constexpr(w - (1 << 32) if w >= 1 << 31 else w) for w in words)


_IQ4_W0, _IQ4_W1, _IQ4_W2, _IQ4_W3 = _words(KVALUES_IQ4NL)
_MX_W0, _MX_W1, _MX_W2, _MX_W3 = _words(KVALUES_MXFP4)

# (NSUB, SUBLEN) of the legacy tile; K-quants (None) use the word decoders.
TILES: dict[GGMLType, tuple[int, int] | None] = {
    GGMLType.F32: (1, 1),
    GGMLType.F16: (1, 1),
    GGMLType.BF16: (1, 1),
    GGMLType.Q4_0: (2, 16),
    GGMLType.Q4_1: (2, 16),
    GGMLType.Q5_0: (2, 16),
    GGMLType.Q5_1: (2, 16),
    GGMLType.Q8_0: (1, 32),
    GGMLType.Q2_K: None,
    GGMLType.Q3_K: None,
    GGMLType.Q4_K: None,
    GGMLType.Q5_K: None,
    GGMLType.Q6_K: None,
    GGMLType.IQ4_NL: (2, 16),
    GGMLType.MXFP4: (2, 16),
    GGMLType.IQ4_XS: (16, 16),  # 8 sub-blocks of 32, each as its low and high nibbles
}

# How the launcher hands the bytes to the kernel: float types as typed elements (bf16 as its
# int16 bit pattern), quant types as bytes.
_STORAGE = {GGMLType.F32: torch.float32, GGMLType.F16: torch.float16, GGMLType.BF16: torch.int16}

# Program sizes, measured on an H200 (bench/NOTES.md, 2026-11-30 run 2): 2048 elements per
# program (16 per lane at 4 warps) for the legacy types, 4096 for Q8_0 (95% of copy bandwidth
# against 90%); 16 blocks for the K-quants (a [32, 16] tile per bit group: 87-90% against 82-84%
# with 32 blocks).
ELEMS_PER_PROGRAM = 2048
LEGACY_ELEMS = {GGMLType.Q8_0: 4096}
K_BLOCKS_PER_PROGRAM = 16
NUM_WARPS = 4
ALIGN = 4  # bytes: the raw data's required alignment (32-bit word loads)
MAGIC = 0x4B000000  # f32 bits of 2^23, passed to the kernel at run time (see _emit)


# ---------------------------------------------------------------------------------------------
# field readers: p is a tensor of block start pointers (uint8), mask has p's shape (or broadcasts)


@triton.jit
def _u8(p, off, mask):
    """The bytes at p + off, as int32."""
    return tl.load(p + off, mask=mask, other=0).to(tl.int32)


@triton.jit
def _f16(p, off, mask):
    """The f16 at byte p + off (2-byte aligned), widened to f32 (exact)."""
    return tl.load((p + off).to(tl.pointer_type(tl.float16)), mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _u16(p, off, mask):
    """The u16 at byte p + off (2-byte aligned), zero-extended to int32."""
    return tl.load((p + off).to(tl.pointer_type(tl.uint16)), mask=mask, other=0).to(tl.int32)


@triton.jit
def _w32(p, off, mask):
    """The little-endian 32-bit word at byte p + off (4-byte aligned), as int32 bits."""
    return tl.load((p + off).to(tl.pointer_type(tl.int32)), mask=mask, other=0)


@triton.jit
def _w32h(p, off, mask):
    """The little-endian 32-bit word at byte p + off (only 2-byte aligned): two 16-bit loads."""
    return _u16(p, off, mask) | (_u16(p, off + 2, mask) << 16)


@triton.jit
def _byte_lanes(l):
    """For element l of a [32, B] tile, whose code sits in byte l % 4 of its word: (the right shift
    that brings the code to bit `at`, at, 2^at, 2^-at) as tensors of l's shape (see _emit)."""
    sh = (l % 4) * 8
    at = tl.minimum(sh, 16)
    two_at = ((127 + at) << 23).to(tl.float32, bitcast=True)
    return sh - at, at, two_at, ((127 - at) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _emit(
    dst, codes, scale, offset, down, at, two_at, magic, mask, ok, MASK: tl.constexpr, BIAS: tl.constexpr
):
    """Store ((this element's byte of `codes`) & MASK - BIAS) * scale - offset at `dst` (as _put),
    where `scale` already carries the factor 2^-at (down, at, two_at: from _byte_lanes).

    The code is read in place at bit at = 8 * (l % 4) (byte 3 first moves down to bit 16, the
    highest place a 6-bit code still fits the mantissa of 2^23): OR-ing it into the mantissa of
    2^23 and subtracting 2^23 + BIAS * 2^at gives (code - BIAS) * 2^at exactly (the magic-number
    int -> float conversion: one LOP3 and one FADD per element, no per-element shift, no
    quarter-rate I2F), and the 2^at cancels exactly against the scale's 2^-at (powers of two).
    `magic` is the bit pattern of 2^23 (0x4B000000) as a run-time value: as an immediate the
    compiler cannot fuse the AND and the OR into one LOP3 (one immediate per instruction).
    """
    f = (((codes >> down) & (MASK << at)) | magic).to(tl.float32, bitcast=True)
    if BIAS == 0.0:
        q = f - 8388608.0
    else:
        q = f - (8388608.0 + BIAS * two_at)
    _put(dst, q * scale - offset, mask, ok)


@triton.jit
def _put(dst, vals, mask, ok):
    """Store f32 `vals` at `dst` in its element type; NaN where `ok` is false (a bad gather id)."""
    tl.store(dst, cast_for(tl.where(ok, vals, float("nan")), dst), mask=mask)


# ---------------------------------------------------------------------------------------------
# legacy tile decoders: (p [B,1,1], sub [1,NSUB,1], l [1,1,SUBLEN], mask) -> f32 [B, NSUB, SUBLEN]
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
    hb = (_w32h(p, 2, mask) >> (sub * 16 + l)) & 1
    q = ((_u8(p, 6 + l, mask) >> (4 * sub)) & 0xF) | (hb << 4)
    return (q - 16).to(tl.float32) * _f16(p, 0, mask)


@triton.jit
def _decode_q5_1(p, sub, l, mask):
    hb = (_w32(p, 4, mask) >> (sub * 16 + l)) & 1
    q = ((_u8(p, 8 + l, mask) >> (4 * sub)) & 0xF) | (hb << 4)
    return q.to(tl.float32) * _f16(p, 0, mask) + _f16(p, 2, mask)


@triton.jit
def _decode_q8_0(p, sub, l, mask):
    q = tl.load(p + 2 + l, mask=mask, other=0).to(tl.int8, bitcast=True)
    return q.to(tl.float32) * _f16(p, 0, mask)


@triton.jit
def _lut(q, W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr):
    """The int8 table value (as f32) of codes q (int32 0..15); the table's 16 bytes in words W0..W3."""
    word = tl.where(q < 8, tl.where(q < 4, W0, W1), tl.where(q < 12, W2, W3))
    return ((word << (24 - 8 * (q & 3))) >> 24).to(tl.float32)


@triton.jit
def _decode_iq4_nl(p, sub, l, mask):
    q = (_u8(p, 2 + l, mask) >> (4 * sub)) & 0xF
    return _lut(q, _IQ4_W0, _IQ4_W1, _IQ4_W2, _IQ4_W3) * _f16(p, 0, mask)


@triton.jit
def _decode_mxfp4(p, sub, l, mask):
    q = (_u8(p, 1 + l, mask) >> (4 * sub)) & 0xF
    return _lut(q, _MX_W0, _MX_W1, _MX_W2, _MX_W3) * e8m0_half(_u8(p, 0, mask))


@triton.jit
def _decode_iq4_xs(p, sub, l, mask):
    # sub = 2 ib + h: sub-block ib's low (h = 0: elements 32 ib + l) or high (32 ib + 16 + l) nibbles
    ib = sub // 2
    q = (_u8(p, 8 + 16 * ib + l, mask) >> (4 * (sub % 2))) & 0xF
    ls = ((_u8(p, 4 + ib // 2, mask) >> (4 * (ib % 2))) & 0xF) | (((_u16(p, 2, mask) >> (2 * ib)) & 3) << 4)
    dl = _f16(p, 0, mask) * (ls - 32).to(tl.float32)
    return _lut(q, _IQ4_W0, _IQ4_W1, _IQ4_W2, _IQ4_W3) * dl


@triton.jit
def _decode_tile(p, sub, l, mask, QTYPE: tl.constexpr):
    """f32 values [B, NSUB, SUBLEN] of the legacy-type blocks at `p`. For F32/F16/BF16, `p` points
    at typed elements (BF16 as int16) and a "block" is SUBLEN consecutive elements (NSUB = 1)."""
    if QTYPE == _F32:
        return tl.load(p + l, mask=mask, other=0.0)
    elif QTYPE == _F16:
        return tl.load(p + l, mask=mask, other=0.0).to(tl.float32)
    elif QTYPE == _BF16:
        return (tl.load(p + l, mask=mask, other=0).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    elif QTYPE == _Q4_0:
        return _decode_q4_0(p, sub, l, mask)
    elif QTYPE == _Q4_1:
        return _decode_q4_1(p, sub, l, mask)
    elif QTYPE == _Q5_0:
        return _decode_q5_0(p, sub, l, mask)
    elif QTYPE == _Q5_1:
        return _decode_q5_1(p, sub, l, mask)
    elif QTYPE == _IQ4_NL:
        return _decode_iq4_nl(p, sub, l, mask)
    elif QTYPE == _MXFP4:
        return _decode_mxfp4(p, sub, l, mask)
    elif QTYPE == _IQ4_XS:
        return _decode_iq4_xs(p, sub, l, mask)
    else:
        tl.static_assert(QTYPE == _Q8_0, "_decode_tile: not a legacy ggml type")
        return _decode_q8_0(p, sub, l, mask)


# ---------------------------------------------------------------------------------------------
# K-quant word decoders: (p [1,B] block pointers, o [1,B] output block pointers, mask, ok [1,B]).
# Tiles are [32, B], element l of the group along axis 0: with the contiguous axis first, the
# loads' default order matches the stores', so the compiler keeps one layout (no shared-memory
# conversion before each store).
# l = 0..31 is the element within a 32-element group; its byte sits at bit 8 * (l % 4) of the
# word holding bytes 4 * (l // 4) .. + 3 of the group's byte run.


@triton.jit
def _store_q2_k(p, o, mask, ok, magic):
    # half n (128 elements): qs[n*32 + l] holds 4 elements, 2 bits each (group s at bit 2s);
    # element n*128 + s*32 + l is sub-block n*8 + 2s + l//16 (scale byte: low 4 scale, high 4 min)
    l = tl.arange(0, 32)[:, None]
    down, at, two_at, unit = _byte_lanes(l)
    d = _f16(p, 80, mask)
    dmin = _f16(p, 82, mask)
    for n in tl.static_range(2):
        qw = _w32(p, 16 + n * 32 + (l // 4) * 4, mask)
        for s in tl.static_range(4):
            sc = tl.load(p + n * 8 + 2 * s + l // 16, mask=mask, other=0).to(tl.int32)
            dl = d * (sc & 0xF).to(tl.float32)
            ml = dmin * (sc >> 4).to(tl.float32)
            dst = o + n * 128 + s * 32 + l
            _emit(dst, qw >> (2 * s), dl * unit, ml, down, at, two_at, magic, mask, ok, 3, 0.0)


@triton.jit
def _store_q3_k(p, o, mask, ok, magic):
    # as Q2_K's 2-bit codes (qs at 32), plus hmask[l] bit 4n + s as the third bit (clear: -4);
    # 6-bit scale of sub-block j = n*8 + 2s + l//16: low 4 bits from byte j%8 (nibble n), high 2
    # from byte 8 + j%4 (bits 2 * (j//4)); scale bytes at 96, d at 108
    l = tl.arange(0, 32)[:, None]
    down, at, two_at, unit = _byte_lanes(l)
    lh = l // 16
    d = _f16(p, 108, mask)
    hw = _w32h(p, (l // 4) * 4, mask)
    for n in tl.static_range(2):
        qw = _w32h(p, 32 + n * 32 + (l // 4) * 4, mask)
        for s in tl.static_range(4):
            low4 = tl.load(p + 96 + 2 * s + lh, mask=mask, other=0).to(tl.int32) >> (4 * n)
            high2 = tl.load(p + 104 + 2 * (s % 2) + lh, mask=mask, other=0).to(tl.int32)
            high2 = high2 >> (2 * (2 * n + s // 2))
            dl = d * (((low4 & 0xF) | ((high2 & 3) << 4)) - 32).to(tl.float32)
            codes = ((qw >> (2 * s)) & 0x03030303) | (((hw >> (4 * n + s)) << 2) & 0x04040404)
            _emit(o + n * 128 + s * 32 + l, codes, dl * unit, 0.0, down, at, two_at, magic, mask, ok, 7, 4.0)


@triton.jit
def _scale_min_k4(s0, s1, s2, j: tl.constexpr):
    """The 6-bit (scale, min) of sub-block j (0..7) of a Q4_K/Q5_K block, as f32; s0, s1, s2 are
    the packed scale bytes 4..15 as three words (ggml's get_scale_min_k4)."""
    if j < 4:
        sc = (s0 >> (8 * j)) & 63
        mn = (s1 >> (8 * j)) & 63
    else:
        sc = ((s2 >> (8 * (j - 4))) & 0xF) | ((s0 >> (8 * (j - 4) + 2)) & 0x30)
        mn = ((s2 >> (8 * (j - 4) + 4)) & 0xF) | ((s1 >> (8 * (j - 4) + 2)) & 0x30)
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _store_q4_k_q5_k(p, o, mask, ok, magic, FIFTH_BIT: tl.constexpr):
    # chunk c (64 elements): qs[c*32 + l] low nibble = element c*64 + l (sub-block 2c), high
    # nibble = element c*64 + 32 + l (sub-block 2c + 1); Q5_K adds bit 2c + h of qh[l] as 16
    l = tl.arange(0, 32)[:, None]
    down, at, two_at, unit = _byte_lanes(l)
    d = _f16(p, 0, mask)
    dmin = _f16(p, 2, mask)
    s0 = _w32(p, 4, mask)
    s1 = _w32(p, 8, mask)
    s2 = _w32(p, 12, mask)
    if FIFTH_BIT:
        hw = _w32(p, 16 + (l // 4) * 4, mask)
    for c in tl.static_range(4):
        qw = _w32(p, (48 if FIFTH_BIT else 16) + c * 32 + (l // 4) * 4, mask)
        for h in tl.static_range(2):
            sc, mn = _scale_min_k4(s0, s1, s2, 2 * c + h)
            dl = d * sc
            ml = dmin * mn
            codes = (qw >> (4 * h)) & 0x0F0F0F0F
            if FIFTH_BIT:
                codes |= ((hw >> (2 * c + h)) << 4) & 0x10101010
            _emit(o + c * 64 + h * 32 + l, codes, dl * unit, ml, down, at, two_at, magic, mask, ok, 31, 0.0)


@triton.jit
def _store_q6_k(p, o, mask, ok, magic):
    # half n (128 elements): element n*128 + g*32 + l takes 4 low bits from ql[n*64 + (g%2)*32 + l]
    # (nibble g//2) and 2 high bits from qh[n*32 + l] (bits 2g); int8 scale of sub-block
    # n*8 + 2g + l//16 at 192; d at 208
    l = tl.arange(0, 32)[:, None]
    down, at, two_at, unit = _byte_lanes(l)
    d = _f16(p, 208, mask)
    for n in tl.static_range(2):
        qa = _w32h(p, n * 64 + (l // 4) * 4, mask)
        qb = _w32h(p, n * 64 + 32 + (l // 4) * 4, mask)
        qh = _w32h(p, 128 + n * 32 + (l // 4) * 4, mask)
        for g in tl.static_range(4):
            sc = tl.load(p + 192 + n * 8 + 2 * g + l // 16, mask=mask, other=0).to(tl.int8, bitcast=True)
            dl = d * sc.to(tl.float32)
            low = qa if g % 2 == 0 else qb
            codes = ((low >> (4 * (g // 2))) & 0x0F0F0F0F) | (((qh >> (2 * g)) << 4) & 0x30303030)
            dst = o + n * 128 + g * 32 + l
            _emit(dst, codes, dl * unit, 0.0, down, at, two_at, magic, mask, ok, 63, 32.0)


# ---------------------------------------------------------------------------------------------
# the kernel (dequant and embedding gather)


@triton.jit
def decode_store(p, o, mask, ok, magic, QTYPE: tl.constexpr, NSUB: tl.constexpr, SUBLEN: tl.constexpr):
    """Decode the blocks at `p` ([B] block pointers; typed element pointers for float types) and
    store them at `o` ([B] output block pointers) in o's element type; `mask` / `ok` ([B]) skip
    blocks / turn them into NaN; `magic` is 0x4B000000 as a run-time value (see _emit)."""
    if QTYPE == _Q2_K:
        _store_q2_k(p[None, :], o[None, :], mask[None, :], ok[None, :], magic)
    elif QTYPE == _Q3_K:
        _store_q3_k(p[None, :], o[None, :], mask[None, :], ok[None, :], magic)
    elif QTYPE == _Q4_K:
        _store_q4_k_q5_k(p[None, :], o[None, :], mask[None, :], ok[None, :], magic, False)
    elif QTYPE == _Q5_K:
        _store_q4_k_q5_k(p[None, :], o[None, :], mask[None, :], ok[None, :], magic, True)
    elif QTYPE == _Q6_K:
        _store_q6_k(p[None, :], o[None, :], mask[None, :], ok[None, :], magic)
    else:
        sub = tl.arange(0, NSUB)[None, :, None]
        l = tl.arange(0, SUBLEN)[None, None, :]
        mask3 = mask[:, None, None]
        vals = _decode_tile(p[:, None, None], sub, l, mask3, QTYPE)
        _put(o[:, None, None] + sub * SUBLEN + l, vals, mask3, ok[:, None, None])


@triton.jit
def _dequant_kernel(
    src_ptr,
    out_ptr,
    ids_ptr,
    n_blocks,
    blocks_per_row,
    n_vocab,
    magic,
    QTYPE: tl.constexpr,
    BLOCK_BYTES: tl.constexpr,
    NSUB: tl.constexpr,
    SUBLEN: tl.constexpr,
    BLOCK: tl.constexpr,
    EVEN: tl.constexpr,
    GATHER: tl.constexpr,
):
    """Program i decodes flat output blocks [i*BLOCK, (i+1)*BLOCK) of n_blocks. Dequant: output
    block g is source block g. Gather: output block g is block g % blocks_per_row of table row
    ids[g // blocks_per_row] (n_blocks < 2^31, so the division is 32-bit); a row outside
    [0, n_vocab) reads row 0 (in bounds) and is written as NaN."""
    out_blk = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:  # no partial program: a constant mask folds away and the accesses vectorize
        mask = tl.full([BLOCK], 1, tl.int1)
    else:
        mask = out_blk < n_blocks
    if GATHER:
        t = out_blk.to(tl.int32) // blocks_per_row
        tok = tl.load(ids_ptr + t, mask=mask, other=0).to(tl.int64)
        ok = (tok >= 0) & (tok < n_vocab)
        src_blk = tl.where(ok, tok, 0) * blocks_per_row + (out_blk - t * blocks_per_row)
    else:
        ok = tl.full([BLOCK], 1, tl.int1)
        src_blk = out_blk
    decode_store(src_ptr + src_blk * BLOCK_BYTES, out_ptr + out_blk * (NSUB * SUBLEN), mask, ok, magic,
                 QTYPE, NSUB, SUBLEN)


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
    """(tensor the kernel reads, stride of one block in its elements) for raw bytes of `info`.

    Quant blocks are read with 16- and 32-bit loads, so their bytes must start 4-byte aligned."""
    storage = _STORAGE.get(info.type)
    if storage is not None:
        return view_as(what, raw, storage), 1
    if raw.data_ptr() % ALIGN:
        raise UnsupportedError(f"{what}: {info.name} data must start {ALIGN}-byte aligned (got address "
                               f"{raw.data_ptr():#x}); GGUF tensor data always is")
    return raw, info.block_bytes


def tile_meta(info: QuantInfo) -> dict:
    """The constexpr kernel arguments that select and shape the decoder of `info`."""
    nsub, sublen = TILES[info.type] or (1, info.block_elems)
    return dict(QTYPE=int(info.type), NSUB=nsub, SUBLEN=sublen)


def gather_tile(info: QuantInfo, row_elems: int) -> tuple[int, dict]:
    """(elements per gather block, tile_meta) for rows of `row_elems` elements: a quant type's own
    block; for float types the largest power of two <= 32 dividing the row, so that the gather's
    per-block work (one division, one id load) is shared by up to 32 elements."""
    if info.type not in _STORAGE:
        return info.block_elems, tile_meta(info)
    run = min(32, row_elems & -row_elems)
    return run, dict(QTYPE=int(info.type), NSUB=1, SUBLEN=run)


def blocks_per_program(info: QuantInfo) -> int:
    """Quant blocks one dequant program decodes (a power of two)."""
    if TILES[info.type] is None:
        return K_BLOCKS_PER_PROGRAM
    return max(1, LEGACY_ELEMS.get(info.type, ELEMS_PER_PROGRAM) // info.block_elems)


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
    (any shape), 4-byte aligned. `cols` must be a multiple of the block size. F32/F16/BF16 data
    must be aligned to its element size (GGUF tensor data always is). out_dtype: float16,
    bfloat16 or float32.
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
            src, out, src, n_blocks, 0, 0, MAGIC, BLOCK_BYTES=block_stride, BLOCK=block,
            EVEN=n_blocks % block == 0, GATHER=False, **tile_meta(info), num_warps=NUM_WARPS,
            enable_fp_fusion=False,
        )
    return out
