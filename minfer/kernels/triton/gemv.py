"""The decode GEMV (M == 1) every quantized weight layout runs: its kernel, configs and launch.

    out[n] = sum_k x[k] * W[n, k],  W in one of the layouts of q4_0.py, int4.py or planes.py

The three layouts share this kernel, its tile and K loop; a layout's launcher (`launch_q4_0`,
`launch_int4`, `launch_planes`) passes its planes and scale form (MODE, PLANES) to `_launch_gemv`.
Shared by the layouts too: the nibble words (`_pack_words`, Q4_0Packed's word order), the split-K
scratch (`_gemv_scratch`, `_split_scratch`) and the load-time sync (`_settled`).

Nibble -> float. A plain shift/mask/int-to-float conversion costs ~5 instructions per weight,
one of them the quarter-rate I2F; at H200 bandwidth (~7.6e12 Q4_0 weights/s) that is
compute-bound far below the roofline. The kernels use the magic-number form instead: OR-ing
a nibble that sits at bit b (b <= 12) into the mantissa of 2^23 gives the f32 2^23 + n * 2^b
exactly, and subtracting 2^23 + 8 * 2^b leaves (n - 8) * 2^b exactly: one LOP3 and one FADD
per weight. Slots 4..7 are first moved down by one 16-bit shift per word. The 2^b factor is
undone for free by scaling the other operand by 2^-b (exact, a power of two).

GEMV (M == 1, decode; memory-bound). A program owns BLOCK_N = R * LR rows and walks K in steps of
BLOCK_KB = LK * WK blocks over a [LK, LR, WK, R, 4] word tile: a warp's 32 lanes are LK blocks
along K by LR rows, its WK warps take further K blocks, and each lane holds R rows, so each x
value a lane loads serves R rows and lanes of other rows read the same x addresses. The nibble
at bit b is ORed into 2^(23 - b) (a per-slot magic number whose mantissa unit at bit b is 1), so
no per-slot x scaling is needed: per weight LOP3 + FADD + FFMA; the f16 scale multiplies each
block's partial sum once. Rows and K are clamped for loads (the store and the scales are
masked), so the hot loop has no predicated loads. f32 throughout. Down projections (few rows,
long K) split K across programs; the last program of a row tile to finish adds the partial
sums in a fixed order (deterministic). The default tile (32 rows x 16 blocks per step, 4 warps)
is the best an H200 measured (bench/NOTES.md); `gemv_config` picks the split.

The planes types (planes.py, PLANES=True): `_code` assembles a code exactly in f32 from its
two fields with two magic numbers (2 LOP3 + 2 FADD per weight); `_planes_block` applies the
scale of each 16-element half-block (Q6_K / Q3_K / Q2_K sub-blocks) or of the whole block.

The lookup types (lut4.py, LUT=True: IQ4_NL, IQ4_XS, MXFP4): nibble words whose codes index a
16-entry table of int8 values; `_lut_bytes` turns a word's 8 codes into two words of 4 table
bytes (value + 128) with byte permutes (`prmt`: 3 per 4 codes, the table in 4 registers), which
then run as Q8_0's byte codes (`_code`, center 128) on f32 activations or through the dp4a dots
of the int8 activations (`_dp4a_block`, offset -128 a per block).

Configs: `gemv_config(n, k)` (cached: the launcher's host time matters at decode sizes); a
launcher's `config=` pins one (tests pin one so the interpreter runs one small config).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from ...errors import UnsupportedError
from ...quant.types import QUANT_TABLE, GGMLType
from ._common import (
    INTERPRETING,
    cdiv,
    check_device,
    check_grid,
    check_int,
    check_tensor,
    e8m0_half,
    gelu_tanh,
    make_out,
    pdl_args,
    release_late,
    release_next,
    swiglu_oai_f32,
    wait_prior,
)
from .quantize import quantize_act_q8

Q4_0 = QUANT_TABLE[GGMLType.Q4_0]
_REPACK_CHUNK = 1 << 20  # blocks repacked per step (bounds the int64 temporaries to ~128 MB)


def _split_scratch(w, splits: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A packed weight's split-K scratch (see Q4_0Packed.scratch)."""
    partials = w.partials
    if partials is None or partials.numel() < splits * w.n:
        partials = torch.empty(splits * w.n, dtype=torch.float32, device=w.qs.device)
    counters = w.counters
    if counters is None or counters.numel() < tiles:
        counters = torch.zeros(tiles, dtype=torch.int32, device=w.qs.device)
    return partials, counters


def _settled(packed):
    """The packed weight once the kernels that wrote it have finished: a GEMV launched with PDL
    loads its first weight tile before waiting for the kernel before it (weights are no step's
    output), so a weight must be complete before any GEMV reads it. Load time only."""
    if packed.qs.device.type == "cuda":
        torch.cuda.current_stream().synchronize()
    return packed


def _check_nk(what: str, n: int, k: int) -> None:
    check_int(what, "n", n, 1)
    check_int(what, "k", k, 1)
    if k % Q4_0.block_elems:
        raise UnsupportedError(f"{what}: k must be a multiple of 32 (Q4_0 blocks), got k={k}")


def _pack_words(nibble_bytes, n_blocks: int, device) -> torch.Tensor:
    """int32 [n_blocks, 4]: the kernels' word layout of 32-element blocks whose 16 nibble bytes
    `nibble_bytes(a, b)` gives for blocks a..b (byte j: element j low, element j + 16 high)."""
    qs = torch.empty(n_blocks, 4, dtype=torch.int32, device=device)
    shifts = torch.tensor([0, 4, 8, 12], dtype=torch.int64, device=device).view(1, 4, 1)
    for start in range(0, n_blocks, _REPACK_CHUNK):
        # b[blk, s, j] = byte 4s + j. Slot s < 4 (element 4s + j) is that byte's low nibble;
        # slot s + 4 (element 16 + 4s + j) its high nibble.
        stop = min(start + _REPACK_CHUNK, n_blocks)
        b = nibble_bytes(start, stop).to(torch.int64).view(-1, 4, 4)
        low = ((b & 0xF) << shifts).sum(1)
        high = ((b >> 4) << shifts).sum(1)
        word = low | (high << 16)
        qs[start:stop] = (word - ((word >> 31) << 32)).to(torch.int32)
    return qs


def _gemv_scratch(n: int, k: int, device, affine: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(arrival counters, partial sums) of the default GEMV config's split K, allocated once."""
    split = gemv_config(n, k, affine).split
    partials = torch.empty(split * n if split > 1 else 0, dtype=torch.float32, device=device)
    return torch.zeros(n, dtype=torch.int32, device=device), partials


# ---------------------------------------------------------------------------------------------
# GEMV (M == 1)


@triton.jit
def _slot(w, MASK: tl.constexpr, BIAS: tl.constexpr, magic):
    """(nibble - 8) * 2^b as exact f32, for the nibble of w under MASK = 0xF << b (b <= 12).

    `magic` is the f32 bit pattern of 2^23 (0x4B000000); BIAS is 2^23 + 8 * 2^b.
    """
    return ((w & MASK) | magic).to(tl.float32, bitcast=True) - BIAS


@triton.jit
def _nibble(w, MASK: tl.constexpr, magic_b, BIAS: tl.constexpr):
    """(nibble - 8) as exact f32 for the nibble of w under MASK = 0xF << b: `magic_b` is the bit
    pattern of 2^(23 - b), whose mantissa unit at bit b is 1, and BIAS = 2^(23 - b) + 8."""
    return ((w & MASK) | magic_b).to(tl.float32, bitcast=True) - BIAS


@triton.jit
def _scales(d_rows, kbs, first, kb_hi, EVEN_K: tl.constexpr):
    """The f16 scales of blocks kbs; 0 for the blocks past the end (first + lane offset >= kb_hi)."""
    if EVEN_K:
        return tl.load(d_rows + kbs)
    else:
        return tl.load(d_rows + kbs, mask=first < kb_hi, other=0.0)


@triton.jit
def _gemv_block(acc, w, d, xp, half_shift, m0, m4, m8, m12):
    """acc + (W block . x block) * d for one block per (lane, row): words w [.., 4], f16 scales d,
    x pointers xp (x[32 kb + j]); slot s of word j multiplies x[32 kb + 4 s + j]."""
    h = w >> half_shift  # slots 4..7 moved to bits 0..15
    part = _nibble(w, 0xF, m0, 8388616.0) * tl.load(xp)
    part += _nibble(w, 0xF0, m4, 524296.0) * tl.load(xp + 4)
    part += _nibble(w, 0xF00, m8, 32776.0) * tl.load(xp + 8)
    part += _nibble(w, 0xF000, m12, 2056.0) * tl.load(xp + 12)
    part += _nibble(h, 0xF, m0, 8388616.0) * tl.load(xp + 16)
    part += _nibble(h, 0xF0, m4, 524296.0) * tl.load(xp + 20)
    part += _nibble(h, 0xF00, m8, 32776.0) * tl.load(xp + 24)
    part += _nibble(h, 0xF000, m12, 2056.0) * tl.load(xp + 28)
    return acc + tl.sum(part, axis=4, keep_dims=True) * d.to(tl.float32)


@triton.jit
def _gemv_block_affine(acc, w, a, c, xp, half_shift, m0, m4, m8, m12):
    """acc + a * (nibbles . x) + c * sum(x) for one block per (lane, row): the affine form
    w = a * n + c of Q4_1 (a = d, c = m) and Q4_K (a = d * sc, c = -dmin * m); nibbles exact."""
    h = w >> half_shift
    x0, x4, x8, x12 = tl.load(xp), tl.load(xp + 4), tl.load(xp + 8), tl.load(xp + 12)
    x16, x20, x24, x28 = tl.load(xp + 16), tl.load(xp + 20), tl.load(xp + 24), tl.load(xp + 28)
    part = _nibble(w, 0xF, m0, 8388608.0) * x0
    part += _nibble(w, 0xF0, m4, 524288.0) * x4
    part += _nibble(w, 0xF00, m8, 32768.0) * x8
    part += _nibble(w, 0xF000, m12, 2048.0) * x12
    part += _nibble(h, 0xF, m0, 8388608.0) * x16
    part += _nibble(h, 0xF0, m4, 524288.0) * x20
    part += _nibble(h, 0xF00, m8, 32768.0) * x24
    part += _nibble(h, 0xF000, m12, 2048.0) * x28
    xs = ((x0 + x4) + (x8 + x12)) + ((x16 + x20) + (x24 + x28))
    return acc + tl.sum(part, axis=4, keep_dims=True) * a + tl.sum(xs, axis=4, keep_dims=True) * c


@triton.jit
def _affine_scales(d_rows, m_rows, kbs, first, kb_hi, MODE: tl.constexpr, EVEN_K: tl.constexpr):
    """(a, c) of blocks kbs (0 past the end): Q4_1 (MODE 1): f16 d and m planes per block; Q4_K
    (MODE 2): d_rows holds sc | m << 8 per block, m_rows the super-block's (d, dmin) f16 pair."""
    ok = first < kb_hi
    if MODE == 1:
        a = tl.load(d_rows + kbs, mask=ok, other=0.0).to(tl.float32)
        c = tl.load(m_rows + kbs, mask=ok, other=0.0).to(tl.float32)
    else:
        scm = tl.load(d_rows + kbs, mask=ok, other=0).to(tl.int32)
        dd = tl.load(m_rows + kbs // 8, mask=ok, other=0)
        d = (dd & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
        dmin = ((dd >> 16) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
        a = d * (scm & 0xFF).to(tl.float32)
        c = -(dmin * ((scm >> 8) & 0xFF).to(tl.float32))
    return a, c


@triton.jit
def _code(lo, hi, S: tl.constexpr, magic, LB: tl.constexpr, HB: tl.constexpr, CENTER: tl.constexpr):
    """code - CENTER of slot S (0..3) as exact f32, for the planes types: code = lo | hi << LB with
    the LB-bit field of `lo` at bit LB * S and the HB-bit field of `hi` (HB = 0: none) at HB * S.

    Each field is ORed into the mantissa of a power of two whose unit at its bit position is its
    weight in the code (1 for lo, 2^LB for hi): f = 2^(23 - LB S) + lo, g = 2^(23 + LB - HB S) +
    2^LB hi. g - C and f + (g - C), with C = both powers + CENTER, are exact (Sterbenz: the
    operands are within a factor of 2), so the code costs 2 LOP3 + 2 FADD (HB = 0: 1 + 1)."""
    f = ((lo & (((1 << LB) - 1) << (LB * S))) | (magic - ((LB * S) << 23))).to(tl.float32, bitcast=True)
    if HB > 0:
        g = ((hi & (((1 << HB) - 1) << (HB * S))) | (magic + ((LB - HB * S) << 23))).to(tl.float32, bitcast=True)
        return f + (g - ((1 << (23 + LB - HB * S)) + (1 << (23 - LB * S)) + CENTER))
    else:
        return f - ((1 << (23 - LB * S)) + CENTER)


@triton.jit
def _planes_block(acc, w, hw, a0, a1, c0, c1, xp, half_shift, hi_shift, magic, LB: tl.constexpr,
                  HB: tl.constexpr, CENTER: tl.constexpr, AFFINE: tl.constexpr):
    """acc + one 32-element block per (lane, row) of a planes type: slot s of lane word j is
    element 4 s + j (as for the nibble words); slots 0..3 (elements 0..15) take scale a0 (and
    offset c0), slots 4..7 a1 (c1): Q6_K / Q3_K / Q2_K sub-blocks of 16, one value otherwise."""
    x0, x4, x8, x12 = tl.load(xp), tl.load(xp + 4), tl.load(xp + 8), tl.load(xp + 12)
    x16, x20, x24, x28 = tl.load(xp + 16), tl.load(xp + 20), tl.load(xp + 24), tl.load(xp + 28)
    if LB == 8:
        # byte codes (Q8_0): w holds elements 0..15 (slot s of word j = element 4 s + j at bit 8 s),
        # hw elements 16..31; slots 2, 3 are shifted down (a byte field must end below bit 23)
        h = w >> half_shift
        hh = hw >> half_shift
        low = _code(w, w, 0, magic, 8, 0, CENTER) * x0
        low += _code(w, w, 1, magic, 8, 0, CENTER) * x4
        low += _code(h, h, 0, magic, 8, 0, CENTER) * x8
        low += _code(h, h, 1, magic, 8, 0, CENTER) * x12
        up = _code(hw, hw, 0, magic, 8, 0, CENTER) * x16
        up += _code(hw, hw, 1, magic, 8, 0, CENTER) * x20
        up += _code(hh, hh, 0, magic, 8, 0, CENTER) * x24
        up += _code(hh, hh, 1, magic, 8, 0, CENTER) * x28
    else:
        h = w >> half_shift  # slots 4..7 moved to slots 0..3 (half_shift = 4 LB)
        hh = hw >> hi_shift  # and their high fields (hi_shift = 4 HB)
        low = _code(w, hw, 0, magic, LB, HB, CENTER) * x0
        low += _code(w, hw, 1, magic, LB, HB, CENTER) * x4
        low += _code(w, hw, 2, magic, LB, HB, CENTER) * x8
        low += _code(w, hw, 3, magic, LB, HB, CENTER) * x12
        up = _code(h, hh, 0, magic, LB, HB, CENTER) * x16
        up += _code(h, hh, 1, magic, LB, HB, CENTER) * x20
        up += _code(h, hh, 2, magic, LB, HB, CENTER) * x24
        up += _code(h, hh, 3, magic, LB, HB, CENTER) * x28
    acc += tl.sum(low, axis=4, keep_dims=True) * a0 + tl.sum(up, axis=4, keep_dims=True) * a1
    if AFFINE:
        xs_low = (x0 + x4) + (x8 + x12)
        xs_up = (x16 + x20) + (x24 + x28)
        acc += tl.sum(xs_low, axis=4, keep_dims=True) * c0 + tl.sum(xs_up, axis=4, keep_dims=True) * c1
    return acc


@triton.jit
def _half_f16(bits):
    """The f16 whose bit pattern is the low 16 bits of int32 `bits`, as f32."""
    return (bits & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _planes_scales(d_rows, m_rows, kbs, first, kb_hi, MODE: tl.constexpr):
    """(a0, a1, c0, c1) of blocks kbs (all 0 past the end) for a planes type's MODE:
    0 (Q8_0, Q5_0): f16 d per block; 1 (Q5_1), 2 (Q5_K): as _affine_scales; 3 (Q6_K, Q3_K): two
    signed 8-bit sub-block scales per block (sc0 | sc1 << 8) and the super-block's f16 d;
    4 (Q2_K): the file's two scale bytes per block (4-bit scale | 4-bit min << 4 each) and the
    super-block's f16 d | dmin << 16."""
    ok = first < kb_hi
    if MODE == 0:
        a0 = tl.load(d_rows + kbs, mask=ok, other=0.0).to(tl.float32)
        return a0, a0, a0, a0
    elif MODE == 3:
        scs = tl.load(d_rows + kbs, mask=ok, other=0).to(tl.int32)
        d = tl.load(m_rows + kbs // 8, mask=ok, other=0.0).to(tl.float32)
        return d * ((scs << 24) >> 24).to(tl.float32), d * ((scs << 16) >> 24).to(tl.float32), d, d
    elif MODE == 4:
        scs = tl.load(d_rows + kbs, mask=ok, other=0).to(tl.int32)
        dd = tl.load(m_rows + kbs // 8, mask=ok, other=0)
        d = _half_f16(dd)
        dmin = _half_f16(dd >> 16)
        a0 = d * (scs & 0xF).to(tl.float32)
        c0 = -(dmin * ((scs >> 4) & 0xF).to(tl.float32))
        a1 = d * ((scs >> 8) & 0xF).to(tl.float32)
        c1 = -(dmin * ((scs >> 12) & 0xF).to(tl.float32))
        return a0, a1, c0, c1
    else:
        a, c = _affine_scales(d_rows, m_rows, kbs, first, kb_hi, MODE, False)
        return a, a, c, c


@triton.jit
def _dp4a(a, b, c):
    """c + the dot product of a's 4 bytes (unsigned) with b's 4 bytes (signed): one dp4a."""
    if INTERPRETING:
        s = c
        for t in tl.static_range(4):
            s += ((a >> (8 * t)) & 0xFF) * ((b << (24 - 8 * t)) >> 24)
        return s
    else:
        return tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32,
                                         is_pure=True, pack=1)


@triton.jit
def _gemv_block_q8(acc, w, a, c, xq, xs, nib, PASSES: tl.constexpr):
    """acc + a * (dx1 * (nibbles . q1) + dx2 * (nibbles . q2)) + c * s for one block per (lane,
    row), x quantized in PASSES (1 or 2) int8 passes (`quantize.quantize_act_q8`): w the nibble
    words [.., 4]; xq points at the block's code words (pass p, word j: the codes of slots 0, 2,
    4, 6 of nibble word j; word 4 + j: slots 1, 3, 5, 7), xs at its (dx1, dx2, s). The nibble
    sums are exact int32 (dp4a)."""
    return _dp4a_block(acc, w & nib, (w >> 4) & nib, a, c, xq, xs, PASSES)


@triton.jit
def _dp4a_block(acc, lo, hi, a, c, xq, xs, PASSES: tl.constexpr):
    """acc + a * (dx1 * (codes . q1) + dx2 * (codes . q2)) + c * s for one block per (lane, row):
    `lo` [.., 4] the unsigned byte codes of elements 8 t + j (byte t of word j), `hi` those of
    elements 8 t + 4 + j: the order of x's code words at xq (see _gemv_block_q8)."""
    p = _dp4a(hi, tl.load(xq + 4), _dp4a(lo, tl.load(xq), tl.zeros_like(lo)))
    part = tl.load(xs) * tl.sum(p, axis=4, keep_dims=True).to(tl.float32)
    if PASSES == 2:
        p2 = _dp4a(hi, tl.load(xq + 12), _dp4a(lo, tl.load(xq + 8), tl.zeros_like(lo)))
        part += tl.load(xs + 1) * tl.sum(p2, axis=4, keep_dims=True).to(tl.float32)
    return acc + a * part + c * tl.load(xs + 2)


@triton.jit
def _lut_bytes(w, t0, t1, t2, t3):
    """(A, B): the table bytes of the 8 nibbles of lookup words w, A byte i = table[nibble i] (bits
    4 i), B byte i = table[nibble 4 + i] (bits 16 + 4 i); t0..t3 the 16-byte table as 4 words.
    On the GPU per word: two byte permutes pick each code's byte from the table's lower and upper
    8 bytes by its 3 low bits, a third takes the one its 4th bit names (11 instructions / 8 codes)."""
    if INTERPRETING:  # the same lookup by selects, the 8 nibbles along a new last axis (numpy runs it whole)
        e = tl.arange(0, 8)
        last: tl.constexpr = len(w.shape)
        q = (tl.expand_dims(w, last) >> (4 * e)) & 0xF
        word = tl.where(q < 8, tl.where(q < 4, t0, t1), tl.where(q < 12, t2, t3))
        byte = ((word >> ((q & 3) * 8)) & 0xFF) << ((e & 3) * 8)
        return tl.sum(tl.where(e < 4, byte, 0), axis=last), tl.sum(tl.where(e >= 4, byte, 0), axis=last)
    else:
        return tl.inline_asm_elementwise(
            """{
            .reg .b32 m, s, lo, hi;
            and.b32 m, $2, 0x77777777;
            and.b32 s, $2, 0x88888888;
            shr.b32 s, s, 1;
            or.b32 s, s, 0x32103210;
            prmt.b32 lo, $3, $4, m;
            prmt.b32 hi, $5, $6, m;
            prmt.b32 $0, lo, hi, s;
            shr.b32 m, m, 16;
            shr.b32 s, s, 16;
            prmt.b32 lo, $3, $4, m;
            prmt.b32 hi, $5, $6, m;
            prmt.b32 $1, lo, hi, s;
            }""",
            "=r,=r,r,r,r,r,r", [w, t0, t1, t2, t3], dtype=(tl.int32, tl.int32), is_pure=True, pack=1)


@triton.jit
def _lut_scale(d_rows, m_rows, kbs, first, kb_hi, MODE: tl.constexpr):
    """The scale of lookup-type blocks kbs (0 past the end): MODE 0 (IQ4_NL) f16 d per block; 5
    (IQ4_XS) the block's int8 ls - 32 times the super-block's f16 d (m_rows); 6 (MXFP4) the block's
    E8M0 byte e as 2^(e - 128) (ggml_e8m0_to_fp32_half: e < 2 the subnormals)."""
    ok = first < kb_hi
    if MODE == 0:
        return tl.load(d_rows + kbs, mask=ok, other=0.0).to(tl.float32)
    elif MODE == 5:
        sc = tl.load(d_rows + kbs, mask=ok, other=0).to(tl.float32)
        return tl.load(m_rows + kbs // 8, mask=ok, other=0.0).to(tl.float32) * sc
    else:
        return tl.where(ok, e8m0_half(tl.load(d_rows + kbs, mask=ok, other=0).to(tl.int32)), 0.0)


@triton.jit
def _lut_block(acc, wa, wb, a, xp, magic):
    """acc + a * (values . x) for one lookup block per (lane, row): wa byte t holds element 8 t + j
    (+ 128), wb byte t element 8 t + 4 + j; each byte becomes its value exactly as Q8_0's codes do."""
    ha = wa >> 16  # bytes 2, 3 moved down (a byte field must end below bit 23)
    hb = wb >> 16
    part = _code(wa, wa, 0, magic, 8, 0, 128) * tl.load(xp)
    part += _code(wa, wa, 1, magic, 8, 0, 128) * tl.load(xp + 8)
    part += _code(ha, ha, 0, magic, 8, 0, 128) * tl.load(xp + 16)
    part += _code(ha, ha, 1, magic, 8, 0, 128) * tl.load(xp + 24)
    part += _code(wb, wb, 0, magic, 8, 0, 128) * tl.load(xp + 4)
    part += _code(wb, wb, 1, magic, 8, 0, 128) * tl.load(xp + 12)
    part += _code(hb, hb, 0, magic, 8, 0, 128) * tl.load(xp + 20)
    part += _code(hb, hb, 1, magic, 8, 0, 128) * tl.load(xp + 28)
    return acc + tl.sum(part, axis=4, keep_dims=True) * a


@triton.jit
def _gemv_accumulate(acc, w, hw, kbs, first, kb_hi, d_rows, m_rows, x_base, xs_base, half_shift, hi_shift, magic,
                     m4, m8, m12, t0, t1, t2, t3, MODE: tl.constexpr, EVEN_K: tl.constexpr, PLANES: tl.constexpr,
                     LB: tl.constexpr, HB: tl.constexpr, CENTER: tl.constexpr, Q8X: tl.constexpr, LUT: tl.constexpr):
    """acc + one K step of the tile: the words w (high-bit words hw) of blocks kbs (first =
    unclamped block index). Q8X > 0: x is int8 codes of Q8X passes (x_base: their words, xs_base:
    the blocks' scales). LUT: w are lookup words, t0..t3 the table (value + 128 per byte)."""
    if LUT:
        a = _lut_scale(d_rows, m_rows, kbs, first, kb_hi, MODE)
        wa, wb = _lut_bytes(w, t0, t1, t2, t3)
        if Q8X > 0:
            return _dp4a_block(acc, wa, wb, a, -128.0 * a, x_base + kbs * (8 * Q8X), xs_base + kbs * 4, Q8X)
        else:
            return _lut_block(acc, wa, wb, a, x_base + kbs * 32, magic)
    elif Q8X > 0:
        if MODE == 0:
            a = _scales(d_rows, kbs, first, kb_hi, EVEN_K).to(tl.float32)
            c = -8.0 * a
        else:
            a, c = _affine_scales(d_rows, m_rows, kbs, first, kb_hi, MODE, EVEN_K)
        return _gemv_block_q8(acc, w, a, c, x_base + kbs * (8 * Q8X), xs_base + kbs * 4, 0x0F0F0F0F, Q8X)
    elif PLANES:
        a0, a1, c0, c1 = _planes_scales(d_rows, m_rows, kbs, first, kb_hi, MODE)
        return _planes_block(acc, w, hw, a0, a1, c0, c1, x_base + kbs * 32, half_shift, hi_shift, magic, LB, HB,
                             CENTER, MODE == 1 or MODE == 2 or MODE == 4)
    elif MODE == 0:
        d = _scales(d_rows, kbs, first, kb_hi, EVEN_K)
        return _gemv_block(acc, w, d, x_base + kbs * 32, half_shift, magic, m4, m8, m12)
    else:
        a, c = _affine_scales(d_rows, m_rows, kbs, first, kb_hi, MODE, EVEN_K)
        return _gemv_block_affine(acc, w, a, c, x_base + kbs * 32, half_shift, magic, m4, m8, m12)


@triton.jit
def _load_words(rows, kbs, PLANES: tl.constexpr):
    """A tile's words at block indices kbs (int32; the planes' int16 / int8 words widened)."""
    if PLANES:
        return tl.load(rows + kbs * 4).to(tl.int32)
    else:
        return tl.load(rows + kbs * 4)


@triton.jit
def _q4_0_gemv_kernel(
    x_ptr, qs_ptr, d_ptr, out_ptr, part_ptr, cnt_ptr, N, NKB, KB_SPLIT, NSPLIT, magic, half_shift, m_ptr, M_STRIDE,
    h_ptr, hi_shift, e_ptr, dst_ptr, fi_ptr, cos_ptr, sin_ptr, pos_ptr, HALF,
    ck_ptr, cv_ptr, slot_ptr, KSTART, VSTART, HD, LAYER_OFF, S_STRIDE, H_STRIDE, xs_ptr, t0, t1, t2, t3, ids_ptr,
    XDIV, XROWS, GLU_OFF, rs_ptr, RS_N, RS_K, RS_EPS,
    R: tl.constexpr, LR: tl.constexpr, LK: tl.constexpr, WK: tl.constexpr, SPLIT: tl.constexpr,
    EVEN_K: tl.constexpr, MODE: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr,
    PLANES: tl.constexpr, LB: tl.constexpr, HB: tl.constexpr, CENTER: tl.constexpr, EPI: tl.constexpr,
    Q8X: tl.constexpr, LUT: tl.constexpr = False, MOE: tl.constexpr = False, MOE_BIAS: tl.constexpr = False,
    ROWS: tl.constexpr = False, MOE_GLU: tl.constexpr = False, ALPHA: tl.constexpr = 0.0,
    LIMIT: tl.constexpr = 0.0, RSTD: tl.constexpr = 0,
):
    # PLANES (the 5/6/8-bit and 2/3-bit types, `repack_planes`): qs_ptr holds the codes' low LB
    # bits (LB = 4: the nibble words; LB = 2: int16 words of 8 two-bit slots), h_ptr their high
    # HB bits (int8 / int16 / int32 words of 8 slots), both indexed like the nibble words.
    # Otherwise (Q4_0, Q4_1, Q4_K; the lookup types, LUT: t0..t3 their table) h_ptr, hi_shift, LB, HB
    # and CENTER are unused.
    # EPI (the fused epilogues of gemv_fused.py; 0: store the rows): e_ptr .. HALF are theirs.
    # MOE (moe.py: the chosen experts of a 3-D expert tensor, stacked as E blocks of N rows):
    # program_id(1) is a slot s (no split K); it reads expert ids[s]'s N rows, x row s // XDIV (f32,
    # or its int8 records with Q8X) and writes out row s, so one launch runs every expert chosen for
    # every row of the step. MOE_BIAS
    # (gpt-oss's expert biases): e_ptr holds the experts' biases [E * N], row0 + rows of it added in the
    # store (EPI is 0 in MOE mode, so e_ptr is free).
    # MOE_GLU (moe.py moe_gemv_glu: an expert's gate and up projections and the GLU after them): w
    # stacks the E gate experts, then the E up experts (GLU_OFF = E * N / 2 rows further), N / 2 rows
    # each; N counts both halves, so a program's tile of BLOCK_N rows reads BLOCK_N / 2 gate rows of
    # expert ids[s] and the same up rows, laid out as gemv_fused.py's pair layout (local row l and
    # l + BLOCK_N / 2) for the GLU epilogue (EPI 1: SwiGLU; 5: gpt-oss's clamped form, ALPHA and
    # LIMIT); out row s has N / 2 columns.
    # RSTD > 0 (a deferred RMSNorm, the reader's half: x is h * w of an ADD_NORM store, not yet divided
    # by h's rms): rs_ptr holds RS_N sums of squares of h (RSTD >= RS_N, a power of two), added in
    # index order; the row's sums are scaled by 1 / sqrt(their sum / RS_K + RS_EPS) before the store.
    # ROWS (small decode batches, EPI 0, not MOE): XROWS rows of x, each the one-row GEMV of its own
    # programs: program_id(0) = tile * XROWS + row, so the rows of a weight tile run side by side and
    # read it from L2 once DRAM has given it; a row's arithmetic is the one-row kernel's (bit for bit).
    BLOCK_N: tl.constexpr = R * LR
    BLOCK_KB: tl.constexpr = LK * WK
    pid_n = tl.program_id(0)
    if ROWS:
        row = pid_n % XROWS
        pid_n = pid_n // XROWS
        x_ptr += row.to(tl.int64) * (NKB * 32 if Q8X == 0 else NKB * (8 * Q8X))
        xs_ptr += row.to(tl.int64) * (NKB * 4)
        out_ptr += row.to(tl.int64) * N
        part_ptr += row.to(tl.int64) * NSPLIT * N
        cnt_ptr += row * tl.cdiv(N, BLOCK_N)
    lk = tl.arange(0, LK)[:, None, None, None, None]
    lr = tl.arange(0, LR)[None, :, None, None, None]
    wk = tl.arange(0, WK)[None, None, :, None, None]
    r = tl.arange(0, R)[None, None, None, :, None]
    j = tl.arange(0, 4)[None, None, None, None, :]
    if MOE:  # the ids are the router's output: wait for the kernels before this one first
        wait_prior(PDL)
        slot = tl.program_id(1)
        if MOE_GLU:
            expert_rows = N // 2
        else:
            expert_rows = N
        row0 = tl.load(ids_ptr + slot).to(tl.int64) * expert_rows
        x_row = (slot // XDIV).to(tl.int64)
        x_ptr += x_row * (NKB * 32 if Q8X == 0 else NKB * (8 * Q8X))
        xs_ptr += x_row * (NKB * 4)
        out_ptr += slot.to(tl.int64) * expert_rows
    else:
        row0 = 0
    if MOE_GLU:  # local row l: gate row (l < BLOCK_N / 2) or up row of pair l mod BLOCK_N / 2
        HALF_N: tl.constexpr = BLOCK_N // 2
        lrow = r * LR + lr
        rows_ld = (tl.minimum(pid_n * HALF_N + lrow % HALF_N, N // 2 - 1).to(tl.int64) + row0
                   + (lrow // HALF_N).to(tl.int64) * GLU_OFF)
    else:
        rows_ld = tl.minimum(pid_n * BLOCK_N + r * LR + lr, N - 1).to(tl.int64) + row0  # clamped loads, masked store
    kb = wk * LK + lk
    w_rows = qs_ptr + rows_ld * (NKB * 4) + j
    h_rows = h_ptr + rows_ld * (NKB * 4) + j
    d_rows = d_ptr + rows_ld * NKB
    m_rows = m_ptr + rows_ld * M_STRIDE
    # x pointers are broadcast over the rows so the x loads take the layout of the weight tile
    # (no shuffle through shared memory); the compiler loads each x value once per lane.
    x_base = x_ptr + j + tl.zeros([1, LR, 1, R, 1], tl.int32)
    xs_base = xs_ptr + tl.zeros([1, LR, 1, R, 1], tl.int32)  # Q8X > 0: the x blocks' scales
    # per-slot magic numbers 2^(23 - b) for nibbles at bit b = 0, 4, 8, 12 (see _nibble)
    m4 = magic - 0x2000000
    m8 = magic - 0x4000000
    m12 = magic - 0x6000000
    if SPLIT:
        kb_lo = tl.program_id(1) * KB_SPLIT
        kb_hi = tl.minimum(kb_lo + KB_SPLIT, NKB)
    else:
        kb_lo = 0
        kb_hi = NKB
    release_next(PDL)
    acc = tl.zeros([LK, LR, WK, R, 1], dtype=tl.float32)
    # Past the end of K the tile re-reads the last block (in bounds, finite) with scale 0: only
    # the scale load is masked, so the x loads stay unpredicated and shared by rows.
    if PREFETCH:
        # Software-pipelined: the words of step i + 1 are loaded before step i is computed (twice
        # the bytes in flight per lane), and the first step's are loaded before waiting for the
        # kernel before this one (weights are no kernel's output), overlapping its tail.
        kbs = tl.minimum(kb_lo + kb, kb_hi - 1)
        w = _load_words(w_rows, kbs, PLANES)
        hw = _load_words(h_rows, kbs, PLANES) if HB > 0 else w
        wait_prior(PDL)
        for kb0 in range(kb_lo, kb_hi, BLOCK_KB):
            kbs_next = tl.minimum(kb0 + BLOCK_KB + kb, kb_hi - 1)
            w_next = _load_words(w_rows, kbs_next, PLANES)
            hw_next = _load_words(h_rows, kbs_next, PLANES) if HB > 0 else w_next
            acc = _gemv_accumulate(acc, w, hw, kbs, kb0 + kb, kb_hi, d_rows, m_rows, x_base, xs_base, half_shift,
                                   hi_shift, magic, m4, m8, m12, t0, t1, t2, t3, MODE, EVEN_K, PLANES, LB, HB, CENTER,
                                   Q8X, LUT)
            w = w_next
            hw = hw_next
            kbs = kbs_next
    else:
        if not MOE:
            wait_prior(PDL)
        for kb0 in range(kb_lo, kb_hi, BLOCK_KB):
            kbs = tl.minimum(kb0 + kb, kb_hi - 1)
            w = _load_words(w_rows, kbs, PLANES)
            hw = _load_words(h_rows, kbs, PLANES) if HB > 0 else w
            acc = _gemv_accumulate(acc, w, hw, kbs, kb0 + kb, kb_hi, d_rows, m_rows, x_base, xs_base, half_shift,
                                   hi_shift, magic, m4, m8, m12, t0, t1, t2, t3, MODE, EVEN_K, PLANES, LB, HB, CENTER,
                                   Q8X, LUT)
    release_late(PDL)
    tot = tl.sum(tl.sum(tl.sum(acc, axis=4), axis=2), axis=0)  # [LR, R]
    rows = pid_n * BLOCK_N + tl.arange(0, R)[None, :] * LR + tl.arange(0, LR)[:, None]
    if SPLIT:
        # Split K: each program stores its partial sums; the last of the row tile's NSPLIT programs
        # to arrive (one acq_rel atomic per program, after a barrier) adds them in split order
        # (deterministic) and resets the counter for the next call.
        tl.store(part_ptr + tl.program_id(1) * N + rows, tot, mask=rows < N)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == NSPLIT - 1:
            total = tl.zeros([LR, R], dtype=tl.float32)
            for s in range(0, NSPLIT):  # L2 reads (.cg): other SMs wrote these
                total += tl.load(part_ptr + s * N + rows, mask=rows < N, other=0.0, cache_modifier=".cg")
            if RSTD > 0:
                total = total * _rstd(rs_ptr, RS_N, RS_K, RS_EPS, RSTD)
            _gemv_store(out_ptr, total, rows, N, pid_n, e_ptr, dst_ptr, fi_ptr, cos_ptr, sin_ptr, pos_ptr, HALF,
                        ck_ptr, cv_ptr, slot_ptr, KSTART, VSTART, HD, LAYER_OFF, S_STRIDE, H_STRIDE, BLOCK_N, EPI,
                        ALPHA, LIMIT)
            tl.atomic_xchg(cnt_ptr + pid_n, 0, sem="relaxed", scope="gpu")
    else:
        if MOE_BIAS:
            if MOE_GLU:  # the bias of each local row's gate or up row
                HALF_B: tl.constexpr = BLOCK_N // 2
                lrow_b = tl.arange(0, R)[None, :] * LR + tl.arange(0, LR)[:, None]
                col = pid_n * HALF_B + lrow_b % HALF_B
                tot += tl.load(e_ptr + row0 + (lrow_b // HALF_B).to(tl.int64) * GLU_OFF + col, mask=col < N // 2,
                               other=0.0)
            else:
                tot += tl.load(e_ptr + row0 + rows, mask=rows < N, other=0.0)
        if RSTD > 0:
            tot = tot * _rstd(rs_ptr, RS_N, RS_K, RS_EPS, RSTD)
        _gemv_store(out_ptr, tot, rows, N, pid_n, e_ptr, dst_ptr, fi_ptr, cos_ptr, sin_ptr, pos_ptr, HALF,
                    ck_ptr, cv_ptr, slot_ptr, KSTART, VSTART, HD, LAYER_OFF, S_STRIDE, H_STRIDE, BLOCK_N, EPI,
                    ALPHA, LIMIT)


@triton.jit
def _rstd(rs_ptr, RS_N, RS_K, RS_EPS, RSTD: tl.constexpr):
    """A deferred RMSNorm's 1 / rms: its RS_N row tiles' sums of squares (ADD_NORM stores) in index order."""
    i = tl.arange(0, RSTD)
    ss = tl.sum(tl.load(rs_ptr + i, mask=i < RS_N, other=0.0, cache_modifier=".cg"), axis=0)
    return 1.0 / tl.sqrt(ss / RS_K + RS_EPS)


@triton.jit
def _gemv_store(out_ptr, tot, rows, N, pid_n, e_ptr, dst_ptr, fi_ptr, cos_ptr, sin_ptr, pos_ptr, HALF,
                ck_ptr, cv_ptr, slot_ptr, KSTART, VSTART, HD, LAYER_OFF, S_STRIDE, H_STRIDE,
                BLOCK_N: tl.constexpr, EPI: tl.constexpr, ALPHA: tl.constexpr = 0.0, LIMIT: tl.constexpr = 0.0):
    """Store a row tile's sums `tot` [LR, R] (tile-local row l = r * LR + lr, rows = its global
    rows). EPI 0: as they are. EPI 1 to 5 (a pair layout, gemv_fused.py: the tile's row l and
    row l + BLOCK_N / 2 form pair l of the tile; N a multiple of BLOCK_N): 1 (SwiGLU) stores
    silu(a) * b at column pid_n * BLOCK_N / 2 + l (columns past N / 2 masked), 4 (GeGLU) gelu_tanh(a) * b
    there, 5 gpt-oss's clamped SwiGLU g sigmoid(ALPHA g) (clamp(b, -LIMIT, LIMIT) + 1), g = min(a, LIMIT)
    (elementwise.py's order); 2 (RoPE) adds
    the bias e[col] to both, rotates the pair by the angle of frequency fi (cos/sin row of the
    position pos_ptr[0], HALF columns; fi < 0: no rotation) and stores each at its column dst[row];
    3: 2, and the columns from KSTART (keys) and VSTART (values) also into the f16 KV cache at
    (slot_ptr[0], the position): head (col - start) // HD, dim (col - start) % HD. 6 (ADD_NORM, a
    deferred RMSNorm's writer half): h = e + y stored over e (the residual), h * w (w at cos_ptr, the
    next norm's weight) to out, and the tile's sum of h^2 to sin_ptr[pid_n] (the reader, RSTD, divides
    by the rms)."""
    if EPI == 0:
        tl.store(out_ptr + rows, tot, mask=rows < N)
    elif EPI == 6:  # ADD_NORM: h = res + y over res (e_ptr), h * w (cos_ptr) to out, sum(h^2) of the tile (sin_ptr)
        m = rows < N
        h = tl.where(m, tl.load(e_ptr + rows, mask=m, other=0.0) + tot, 0.0)
        tl.store(e_ptr + rows, h, mask=m)
        tl.store(out_ptr + rows, h * tl.load(cos_ptr + rows, mask=m, other=0.0), mask=m)
        tl.store(sin_ptr + pid_n, tl.sum(tl.sum(h * h, axis=1), axis=0))
    else:
        HB2: tl.constexpr = BLOCK_N // 2
        flat = tl.reshape(tl.permute(tot, (1, 0)), (2, HB2))  # [half, l]: local row half * HB2 + l
        a, b = tl.split(tl.permute(flat, (1, 0)))
        pair = pid_n * HB2 + tl.arange(0, HB2)
        if EPI == 1:
            tl.store(out_ptr + pair, a * tl.sigmoid(a) * b, mask=pair < N // 2)
        elif EPI == 4:
            tl.store(out_ptr + pair, gelu_tanh(a) * b, mask=pair < N // 2)
        elif EPI == 5:
            tl.store(out_ptr + pair, swiglu_oai_f32(a, b, ALPHA, LIMIT), mask=pair < N // 2)
        else:
            ra = pid_n * BLOCK_N + tl.arange(0, HB2)
            da = tl.load(dst_ptr + ra)
            db = tl.load(dst_ptr + ra + HB2)
            a += tl.load(e_ptr + da)
            b += tl.load(e_ptr + db)
            f = tl.load(fi_ptr + pair)
            rot = f >= 0
            pos = tl.load(pos_ptr).to(tl.int64)
            at = pos * HALF + tl.maximum(f, 0)
            c = tl.where(rot, tl.load(cos_ptr + at, mask=rot, other=1.0), 1.0)
            s = tl.where(rot, tl.load(sin_ptr + at, mask=rot, other=0.0), 0.0)
            ya = a * c - b * s
            yb = a * s + b * c
            tl.store(out_ptr + da, ya)
            tl.store(out_ptr + db, yb)
            if EPI == 3:
                base = LAYER_OFF + tl.load(slot_ptr).to(tl.int64) * S_STRIDE + pos * HD
                _kv_cache_store(ck_ptr, cv_ptr, base, da, ya, KSTART, VSTART, HD, H_STRIDE)
                _kv_cache_store(ck_ptr, cv_ptr, base, db, yb, KSTART, VSTART, HD, H_STRIDE)


@triton.jit
def _kv_cache_store(ck_ptr, cv_ptr, base, col, y, KSTART, VSTART, HD, H_STRIDE):
    """The key (KSTART <= col < VSTART) and value (col >= VSTART) columns of one step's q+k+v row
    into the f16 cache rows at `base` (layer, slot and position applied) of their heads."""
    is_v = col >= VSTART
    rel = tl.where(is_v, col - VSTART, col - KSTART)
    off = base + (rel // HD).to(tl.int64) * H_STRIDE + rel % HD
    yh = y.to(tl.float16)
    tl.store(ck_ptr + off, yh, mask=(col >= KSTART) & (col < VSTART))
    tl.store(cv_ptr + off, yh, mask=is_v)


# The 2^23 bit pattern and the 16-bit shift reach the kernel as run-time arguments on purpose:
# as immediates, the compiler cannot fuse `(w & mask) | magic` into one LOP3 (one immediate per
# instruction) and rewrites `(w >> 16) & mask` into a two-instruction bitfield extract.
_MAGIC_BITS = 0x4B000000
_HALF_SHIFT = 16


@dataclass(frozen=True)
class GemvConfig:
    """One launch shape of the GEMV kernel (see its tile comment).

    r: rows per lane; lr: lanes along rows (32 / lr along K); wk: warps, all along K; split:
    programs along K per row tile (1: none); maxnreg: the register cap (the default tile needs
    95; left alone, ptxas chose 80 and spilled into the loop for a larger variant).
    """

    r: int = 4
    lr: int = 8
    wk: int = 4
    split: int = 1
    maxnreg: int | None = 96
    prefetch: bool = False  # load step i + 1's words before computing step i (needs ~16 more registers)
    q8: int = 0  # Q4_0 / Q4_1 / Q4_K: x quantized to int8 per 32 in q8 passes (quantize_act_q8), dp4a dots

    @property
    def block_n(self) -> int:
        return self.r * self.lr

    @property
    def block_kb(self) -> int:
        return (32 // self.lr) * self.wk


PREFETCH_REGS = {0: 128, 1: 168, 2: 168}  # register caps of prefetching tiles without spills (sm_90 compile check)
MIN_PROGRAMS = 528  # 4 per H200 SM: fewer row tiles than this and K is split across programs
SMALL_WEIGHTS = 1 << 22  # n * k at or below which a GEMV is latency-bound (SmolLM2, 0.5B attention)
WIDE_ROWS = 16384  # rows from which the row tiles alone fill the GPU (gate+up, vocab projections)


SMALL_ROWS = 8  # the most rows of x one GEMV launch takes (small decode batches: the kernel's ROWS mode)
Q8_MIN_WEIGHTS = 1 << 24  # at or below, f32 activations: the quantize launch costs more than dp4a saves
ACT_Q8_PASSES = 2  # the default: two passes (one leaves ~5e-3 of error per dot: bench/NOTES.md)


def check_act_q8(passes: int) -> int:
    """`passes` when it is a number of int8 activation passes the GEMVs run (0: f32 activations)."""
    if passes not in (0, 1, 2):
        raise UnsupportedError(f"int8 activation passes must be 0, 1 or 2 (EngineConfig.gemv_q8), got {passes!r}")
    return passes


@functools.lru_cache(maxsize=256)
def gemv_config(n: int, k: int, affine: bool = False, act_q8: int = ACT_Q8_PASSES) -> GemvConfig:
    """`_gemv_config`, with `act_q8` int8 activation passes (EngineConfig.gemv_q8, carried by the
    packed weight from its load layout) above Q8_MIN_WEIGHTS weights
    (smaller GEMVs are latency-bound: SmolLM2 tg128 1,335 with int8 activations everywhere against
    1,705 without, H200 run 39). Two passes load step i + 1's
    words in step i only without prefetching: the second pass's codes beside the prefetched words
    cost registers, so fewer warps (H200 run 38: Q4_K down 22.1 -> 16.1 µs, Q4_0 o 8.1 -> 7.8)."""
    return with_act_q8(_gemv_config(n, k, affine), check_act_q8(act_q8) if n * k > Q8_MIN_WEIGHTS else 0)


def with_act_q8(cfg: GemvConfig, passes: int) -> GemvConfig:
    """An f32-activation tile `cfg` on `passes` int8 activation passes (see gemv_config)."""
    cfg = replace(cfg, q8=passes)
    if passes == 2 and cfg.prefetch:
        cfg = replace(cfg, prefetch=False, maxnreg=96)
    return cfg


def _gemv_config(n: int, k: int, affine: bool = False) -> GemvConfig:
    """The config for an [n, k] weight (`affine`: Q4_1 / Q4_K's scale and offset per block), from
    the H200 sweeps of bench/gemv_sweep.py (bench/NOTES.md, 2026-12-01): small weights take
    smaller, more numerous programs (16 rows, 8 lanes along K); wide ones (>= 16384 rows) 2 warps
    per program and no split; the rest split K across programs so the row tiles x splits reach
    about 2 (k <= 4096: 2 warps, up to 8 splits) or 1.5 (long K: 4 warps, up to 6 splits) times
    MIN_PROGRAMS. Prefetching (run 13, with PDL) pays where a program has few K steps (k <= 4096:
    the attention projections, 7.5-7.0 vs 8.6-8.3 µs at 7B) and everywhere for the affine types
    (Q4_K at 8B: gate+up 33.5 vs 41.6 µs, down 18.0 vs 23.6 with 2 warps and 8 splits)."""
    if n * k <= SMALL_WEIGHTS:
        return GemvConfig(r=2, lr=4, wk=4)
    pf = {"prefetch": True, "maxnreg": PREFETCH_REGS[1 if affine else 0]}
    if n >= WIDE_ROWS:
        return GemvConfig(wk=2, **pf) if affine else GemvConfig(wk=2)
    long_k = k > 4096
    wk = 2 if 2048 <= k <= 4096 or (affine and long_k) else 4
    cfg = GemvConfig(wk=wk)
    tiles = cdiv(n, cfg.block_n)
    max_split = (k // Q4_0.block_elems) // (2 * cfg.block_kb)  # each split >= 2 K steps
    if affine and long_k:
        return GemvConfig(wk=wk, split=max(1, min(8, max_split)), **pf)
    target = (3 * MIN_PROGRAMS // 2 if long_k else 2 * MIN_PROGRAMS) // tiles
    split = min(6 if long_k else 8, target, max_split if long_k else max_split + 1)
    extra = pf if (affine or not long_k) else {}
    return GemvConfig(wk=wk, split=split, **extra) if split >= 2 else GemvConfig(wk=wk, **extra)


def _split_plan(cfg: GemvConfig, n: int, k: int) -> tuple[int, int, int]:
    """(K blocks per split, number of splits, row tiles) of `cfg` on an [n, k] weight."""
    nkb = k // Q4_0.block_elems
    kb_split = cdiv(cdiv(nkb, cfg.split), cfg.block_kb) * cfg.block_kb
    return kb_split, cdiv(nkb, kb_split), cdiv(n, cfg.block_n)


def glu_epilogue(epi: int, out: torch.Tensor, filler: torch.Tensor) -> tuple:
    """`_launch_gemv`'s epilogue tuple for a GLU store (EPI 1, 4 or 5): only EPI and out matter;
    `filler` (any int32 tensor) stands in for the RoPE / KV operands it does not read."""
    return (epi, out, filler, filler, out, out, filler, 0, out, out, filler, 0, 0, 1, 0, 0, 0)


@dataclass(frozen=True)
class MoeLaunch:
    """The expert mode of a GEMV launch (moe.py): w stacks experts of `rows` rows each, and one
    program column per slot (of `slots`) reads expert ids[s]'s rows and x row s // xdiv (no split).
    `bias` (f32 [E * rows]): each slot's expert's bias added in the store. `glu_off` > 0: the MOE_GLU
    mode (`rows` counts the gate and up rows of an expert, the up experts glu_off rows after the gate
    ones; the epilogue EPI 1 or 5, `alpha` and `limit` the latter's)."""

    ids: torch.Tensor
    slots: int
    xdiv: int
    rows: int
    bias: torch.Tensor | None = None
    glu_off: int = 0
    alpha: float = 0.0
    limit: float = 0.0


def add_norm_epilogue(res: torch.Tensor, w: torch.Tensor, ss: torch.Tensor, out: torch.Tensor,
                      filler: torch.Tensor) -> tuple:
    """`_launch_gemv`'s epilogue tuple for EPI 6 (ADD_NORM): the residual `res` (the sum written over
    it), the next norm's weight `w`, `ss` the row tiles' sums of squares; `filler` (any int32 tensor)
    stands in for the operands it does not read."""
    return (6, res, filler, filler, w, ss, filler, 0, out, out, filler, 0, 0, 1, 0, 0, 0)


def tiles_of(n: int, cfg: GemvConfig) -> int:
    """Row tiles of `cfg` on n rows: the sums of squares an ADD_NORM store writes."""
    return cdiv(n, cfg.block_n)


def _launch_gemv(what, x, w, d_plane, m_plane, m_stride: int, mode: int, out, n: int, k: int, cfg: GemvConfig,
                 planes: tuple | None = None, epilogue: tuple | None = None, xq: tuple | None = None,
                 lut: tuple[int, int, int, int] | None = None, moe: MoeLaunch | None = None,
                 rstd: tuple[torch.Tensor, float] | None = None):
    """Launch the GEMV kernel; `planes` = (hi plane, LB, HB, CENTER) for the planes types; `lut` =
    the 4 table words of a lookup type (lut4.py);
    `epilogue` = (EPI, e, dst, fi, cos, sin, positions, HALF, cache_k, cache_v, slots, KSTART, VSTART, HD,
    LAYER_OFF, S_STRIDE, H_STRIDE) for gemv_fused.py's fused stores; `moe`: the expert mode (MoeLaunch;
    `n` = its rows). `rstd` = (ss, eps): x is h * w of an ADD_NORM store (a deferred RMSNorm) whose
    row tiles' sums of squares of h are ss (f32, 1-D): the sums are divided by h's rms before the store."""
    rows = 1 if moe is not None or x.dim() == 1 else x.shape[0]  # x rows (MOE: one per slot, its own mode)
    if moe is not None:
        cfg = replace(cfg, split=1)  # (the slots are the second program axis)
    elif rows > 1 and (epilogue is not None or rstd is not None):
        raise UnsupportedError(f"{what}: a fused epilogue or a deferred norm runs on one row, got {rows}")
    if rstd is not None:
        if moe is not None:
            raise UnsupportedError(f"{what}: a deferred norm does not run in the expert mode")
        if not (isinstance(rstd, tuple) and len(rstd) == 2):
            raise UnsupportedError(f"{what}: rstd must be (the row tiles' sums of squares, eps), got {rstd!r}")
        check_tensor(what, "rstd sums", rstd[0], (torch.float32,), ndim=(1,))
        check_device(what, x=x, rstd_sums=rstd[0])
        if not (isinstance(rstd[1], float | int) and rstd[1] >= 0):
            raise UnsupportedError(f"{what}: rstd's eps must be a number >= 0, got {rstd[1]!r}")
    rs, rs_eps = rstd if rstd is not None else (out, 0.0)
    kb_split, nsplit, tiles = _split_plan(cfg, n, k)
    part, counters = out, out  # unused without a split
    if nsplit > 1:
        part, counters = w.scratch(nsplit * rows, tiles * rows)
    nkb = k // Q4_0.block_elems
    hi, lb, hb, center = planes if planes is not None else (w.qs, 4, 0, 0)
    q8 = cfg.q8 if planes is None else 0  # the planes types keep f32 activations
    xs = x
    x_rows = rows if moe is None else x.numel() // k  # (MOE: the rows the slots read, T or T x k used)
    if q8 and xq is not None:
        x, xs = _check_xq(what, xq, x_rows, k, q8, x.device)
    elif q8:
        x, xs = quantize_act_q8(x.reshape(x_rows, k), q8)
    epi, *eargs = epilogue if epilogue is not None else (0, out, counters, counters, out, out, counters, 0,
                                                         out, out, counters, 0, 0, 1, 0, 0, 0)
    m = moe if moe is not None else MoeLaunch(counters, nsplit, 1, n)
    if m.bias is not None:  # (MOE mode has no epilogue: its pointer carries the biases)
        eargs[0] = m.bias
    _q4_0_gemv_kernel[check_grid(what, (tiles * rows, m.slots))](
        x, w.qs, d_plane, out, part, counters, n, nkb, kb_split, nsplit, _MAGIC_BITS, min(4 * lb, 16), m_plane,
        m_stride, hi, min(4 * hb, 16),  # the shifts to a word's upper slots (byte codes: to slots 2, 3)
        *eargs, xs, *(lut or (0, 0, 0, 0)), m.ids, m.xdiv, rows, m.glu_off, rs, rs.numel() if rstd else 0,
        k if rstd else 0, float(rs_eps),
        RSTD=0 if rstd is None else triton.next_power_of_2(rs.numel()), ROWS=rows > 1, MOE=moe is not None,
        MOE_BIAS=m.bias is not None, MOE_GLU=m.glu_off > 0, ALPHA=float(m.alpha), LIMIT=float(m.limit), EPI=epi,
        Q8X=q8,
        R=cfg.r, LR=cfg.lr,
        LK=32 // cfg.lr, WK=cfg.wk, SPLIT=nsplit > 1, EVEN_K=nkb % cfg.block_kb == 0 and nkb % kb_split == 0,
        MODE=mode, PREFETCH=cfg.prefetch, num_warps=cfg.wk, maxnreg=cfg.maxnreg, PLANES=planes is not None, LB=lb,
        HB=hb, CENTER=center, LUT=lut is not None, **pdl_args("gemv"),
    )


def gemv_operands(what: str, x: torch.Tensor, words: torch.Tensor, n: int, k: int, out: torch.Tensor | None,
                  config: GemvConfig | dict | None,
                  default: Callable[[], GemvConfig]) -> tuple[torch.Tensor, GemvConfig]:
    """The decode GEMV launchers' shared checks: x f32 [k] or [m, k] (1 <= m <= SMALL_ROWS) on the
    weight's (`words`) device; (out [m, n] f32, made when None, and the launch config: `config` as a
    GemvConfig or its fields, else `default()`)."""
    check_tensor(what, "x", x, (torch.float32,), ndim=(1, 2))
    rows = x.shape[0] if x.dim() == 2 else 1
    if x.shape[-1] != k or not 1 <= rows <= SMALL_ROWS:
        raise UnsupportedError(f"{what}: x must be [{k}] or [m, {k}] with 1 <= m <= {SMALL_ROWS}, got "
                               f"{tuple(x.shape)}")
    device = check_device(what, x=x, qs=words, out=out)
    out = make_out(what, out, (rows, n), torch.float32, device)
    if config is None:
        return out, default()
    return out, GemvConfig(**config) if isinstance(config, dict) else config


def _check_xq(what: str, xq, rows: int, k: int, passes: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """x's int8 form made before the call: quantize_act_q8's (codes, scales) of x's `rows` rows, `passes` passes."""
    if not (isinstance(xq, tuple) and len(xq) == 2):
        raise UnsupportedError(f"{what}: xq must be quantize_act_q8's (codes, scales), got {type(xq).__name__}")
    codes, scales = xq
    check_tensor(what, "xq codes", codes, (torch.int32,))
    check_tensor(what, "xq scales", scales, (torch.float32,))
    if codes.shape != (rows, k // 32, 8 * passes) or scales.shape != (rows, k // 32, 4):
        want = f"codes [{rows}, {k // 32}, {8 * passes}], scales [{rows}, {k // 32}, 4]"
        raise UnsupportedError(f"{what}: xq must hold x's {rows} rows of {k} in {passes} passes: {want}; got "
                               f"{tuple(codes.shape)}, {tuple(scales.shape)}")
    check_device(what, x=codes, xq_scales=scales)
    if codes.device != device:
        raise UnsupportedError(f"{what}: xq is on {codes.device}, x on {device}")
    return codes, scales
