"""Quantized weight x f32 activation matmuls (seed 004 QMATMUL pair): decode GEMVs for every
quant type and the Q4_0 prefill matmul.

    out[m, n] = sum_k x[m, k] * W[n, k],  W stored as Q4_0 (d:f16 + 16 nibble bytes per 32 values)

Layout. Weights are repacked once at load (`repack_q4_0`) into two aligned arrays: `qs` int32
[N, K/8] (block b of row n is the 16-byte run of words 4b..4b+3) and `d` f16 [N, K/32]. Same
byte count as the GGUF blocks (0.5625 per weight), but the file's 18-byte block stride is only
2-byte aligned, while here every lane fetches a block's nibbles with one 16-byte load. Inside a
block the nibbles are reordered: bits 4s..4s+3 of word j hold element 4s + j ("slot" s), so the
four words' slot-s values multiply four consecutive elements of x (one vector load).

Nibble -> float. A plain shift/mask/int-to-float conversion costs ~5 instructions per weight,
one of them the quarter-rate I2F; at H200 bandwidth (~7.6e12 Q4_0 weights/s) that is
compute-bound far below the roofline. Both kernels use the magic-number form instead: OR-ing
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

Matmul (M > 1, prefill). Per K step of BLOCK_K values (BW = BLOCK_K / 8 words per row of W),
each of the 8 slots is one `tl.dot` of depth BW: x[:, slot] [BLOCK_M, BW] (f32 -> f16/bf16) by
the slot's values (n - 8) * d [BW, BLOCK_N] (same conversion), accumulating in f32. W's words
are loaded once per step; programs are grouped along M so W tiles are reused from L2.

The other types (Q8_0, Q5_0, Q5_1, Q5_K, Q6_K, Q3_K, Q2_K) run the same GEMV kernel on a second
layout, `repack_planes` ("planes", PLANES=True): each weight's unsigned code split into a low
plane (these nibble words, or int16 words of eight 2-bit slots) and a high plane of its other
bits (int8 / int16 words of eight slots, indexed like the nibble words; Q8_0: whole byte codes,
a block's first and last 16 in the two planes), scales in planes of their own: about the file's
bytes per weight. `_code` assembles a code exactly in f32 from its
two fields with two magic numbers (2 LOP3 + 2 FADD per weight); `_planes_block` applies the
scale of each 16-element half-block (Q6_K / Q3_K / Q2_K sub-blocks) or of the whole block.

Configs: the GEMV's comes from `gemv_config(n, k)` (cached: the launcher's host time matters at
decode sizes); the matmul carries a small `@triton.autotune` list pruned by shape; a
launcher's `config=` pins one (tests pin one so the interpreter runs one small config). Raw GGUF
bytes are accepted too and repacked on the fly: correct, but an extra pass over W per call, so
the backend repacks once at load.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from ..config import env
from ..errors import UnsupportedError
from ..quant.types import QUANT_TABLE, GGMLType, by_name
from ._common import (
    INTERPRETING,
    cdiv,
    check_device,
    check_grid,
    check_int,
    check_tensor,
    f32_to_bf16_rne,
    grouped_tile,
    interpreting,
    make_out,
    pdl_args,
    release_late,
    release_next,
    wait_prior,
)
from .quantize import quantize_act_q8

Q4_0 = QUANT_TABLE[GGMLType.Q4_0]
_REPACK_CHUNK = 1 << 20  # blocks repacked per step (bounds the int64 temporaries to ~128 MB)


@dataclass(frozen=True)
class Q4_0Packed:
    """A Q4_0 [n, k] weight in the kernels' layout (see the module doc); made by `repack_q4_0`.

    Checked once, here, so the per-call launcher path stays short. `counters` (int32 [n], zero)
    and `partials` (f32, or empty) are the split-K GEMV's scratch (`scratch`)."""

    qs: torch.Tensor  # int32 [n, k // 8]
    d: torch.Tensor  # float16 [n, k // 32]
    n: int
    k: int
    counters: torch.Tensor | None = None  # int32 [n], zero: split-K arrival counters (self-resetting)
    partials: torch.Tensor | None = None  # f32 [splits * n]: split-K partial sums of the default config

    def __post_init__(self):
        what = "Q4_0Packed"
        _check_nk(what, self.n, self.k)
        check_tensor(what, "qs", self.qs, (torch.int32,))
        check_tensor(what, "d", self.d, (torch.float16,))
        if self.qs.numel() != self.n * self.k // 8 or self.d.numel() != self.n * self.k // 32:
            raise UnsupportedError(f"{what}: qs/d sizes do not match [{self.n}, {self.k}]")
        if self.qs.device != self.d.device:
            found = f"{self.qs.device} and {self.d.device}"
            raise UnsupportedError(f"{what}: qs and d must be on one device, got {found}")

    def scratch(self, splits: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(partial sums f32 [splits * n], zeroed arrival counters >= tiles) for a split-K launch:
        the weight's own when they fit, else fresh ones."""
        return _split_scratch(self, splits, tiles)


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


def _check_q4_0(what: str, qtype) -> None:
    """These kernels read Q4_0 only: a weight of another type is a typed error, never misread."""
    try:
        t = by_name(qtype).type if isinstance(qtype, str) else GGMLType(qtype)
    except (UnsupportedError, ValueError):
        t = None
    if t != GGMLType.Q4_0:
        raise UnsupportedError(f"{what}: reads Q4_0 weights, got qtype {qtype!r}")


def repack_q4_0(raw: torch.Tensor, n: int, k: int) -> Q4_0Packed:
    """Split raw GGUF Q4_0 bytes of an [n, k] weight into the kernels' (qs, d) layout, on raw's device."""
    what = "repack_q4_0"
    _check_nk(what, n, k)
    check_tensor(what, "raw", raw, (torch.uint8,))
    nkb = k // Q4_0.block_elems
    if raw.numel() != n * nkb * Q4_0.block_bytes:
        need = n * nkb * Q4_0.block_bytes
        raise UnsupportedError(f"{what}: Q4_0 [{n}, {k}] needs {need} bytes, got {raw.numel()}")
    blocks = raw.reshape(n * nkb, Q4_0.block_bytes)
    d = blocks[:, :2].contiguous().view(torch.float16).reshape(n, nkb)
    qs = _pack_words(lambda a, b: blocks[a:b, 2:], n * nkb, raw.device)
    counters, partials = _gemv_scratch(n, k, raw.device)
    return _settled(Q4_0Packed(qs=qs.view(n, nkb * 4), d=d, n=n, k=k, counters=counters, partials=partials))


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


def _launch_kwargs(config: triton.Config) -> dict:
    """A config as launch keyword arguments (what a launcher's `config=` takes)."""
    return dict(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)


def _packed(what: str, w: Q4_0Packed | torch.Tensor, n: int, k: int) -> Q4_0Packed:
    if isinstance(w, Q4_0Packed):
        if (w.n, w.k) != (n, k):
            raise UnsupportedError(f"{what}: w is a packed [{w.n}, {w.k}] weight, the call says [{n}, {k}]")
        return w
    if isinstance(w, torch.Tensor):
        return repack_q4_0(w, n, k)
    raise UnsupportedError(f"{what}: w must be a Q4_0Packed or raw Q4_0 bytes, got {type(w).__name__}")


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
    lo = w & nib
    hi = (w >> 4) & nib
    p = _dp4a(hi, tl.load(xq + 4), _dp4a(lo, tl.load(xq), tl.zeros_like(w)))
    part = tl.load(xs) * tl.sum(p, axis=4, keep_dims=True).to(tl.float32)
    if PASSES == 2:
        p2 = _dp4a(hi, tl.load(xq + 12), _dp4a(lo, tl.load(xq + 8), tl.zeros_like(w)))
        part += tl.load(xs + 1) * tl.sum(p2, axis=4, keep_dims=True).to(tl.float32)
    return acc + a * part + c * tl.load(xs + 2)


@triton.jit
def _gemv_accumulate(acc, w, hw, kbs, first, kb_hi, d_rows, m_rows, x_base, xs_base, half_shift, hi_shift, magic,
                     m4, m8, m12, MODE: tl.constexpr, EVEN_K: tl.constexpr, PLANES: tl.constexpr, LB: tl.constexpr,
                     HB: tl.constexpr, CENTER: tl.constexpr, Q8X: tl.constexpr):
    """acc + one K step of the tile: the words w (high-bit words hw) of blocks kbs (first =
    unclamped block index). Q8X > 0: x is int8 codes of Q8X passes (x_base: their words, xs_base:
    the blocks' scales)."""
    if Q8X > 0:
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
    ck_ptr, cv_ptr, slot_ptr, KSTART, VSTART, HD, LAYER_OFF, S_STRIDE, H_STRIDE, xs_ptr,
    R: tl.constexpr, LR: tl.constexpr, LK: tl.constexpr, WK: tl.constexpr, SPLIT: tl.constexpr,
    EVEN_K: tl.constexpr, MODE: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr,
    PLANES: tl.constexpr, LB: tl.constexpr, HB: tl.constexpr, CENTER: tl.constexpr, EPI: tl.constexpr,
    Q8X: tl.constexpr,
):
    # PLANES (the 5/6/8-bit and 2/3-bit types, `repack_planes`): qs_ptr holds the codes' low LB
    # bits (LB = 4: the nibble words; LB = 2: int16 words of 8 two-bit slots), h_ptr their high
    # HB bits (int8 / int16 / int32 words of 8 slots), both indexed like the nibble words.
    # Otherwise (Q4_0, Q4_1, Q4_K) h_ptr, hi_shift, LB, HB and CENTER are unused.
    # EPI (the fused epilogues of gemv_fused.py; 0: store the rows): e_ptr .. HALF are theirs.
    BLOCK_N: tl.constexpr = R * LR
    BLOCK_KB: tl.constexpr = LK * WK
    pid_n = tl.program_id(0)
    lk = tl.arange(0, LK)[:, None, None, None, None]
    lr = tl.arange(0, LR)[None, :, None, None, None]
    wk = tl.arange(0, WK)[None, None, :, None, None]
    r = tl.arange(0, R)[None, None, None, :, None]
    j = tl.arange(0, 4)[None, None, None, None, :]
    rows_ld = tl.minimum(pid_n * BLOCK_N + r * LR + lr, N - 1).to(tl.int64)  # clamped loads, masked store
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
                                   hi_shift, magic, m4, m8, m12, MODE, EVEN_K, PLANES, LB, HB, CENTER, Q8X)
            w = w_next
            hw = hw_next
            kbs = kbs_next
    else:
        wait_prior(PDL)
        for kb0 in range(kb_lo, kb_hi, BLOCK_KB):
            kbs = tl.minimum(kb0 + kb, kb_hi - 1)
            w = _load_words(w_rows, kbs, PLANES)
            hw = _load_words(h_rows, kbs, PLANES) if HB > 0 else w
            acc = _gemv_accumulate(acc, w, hw, kbs, kb0 + kb, kb_hi, d_rows, m_rows, x_base, xs_base, half_shift,
                                   hi_shift, magic, m4, m8, m12, MODE, EVEN_K, PLANES, LB, HB, CENTER, Q8X)
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
            _gemv_store(out_ptr, total, rows, N, pid_n, e_ptr, dst_ptr, fi_ptr, cos_ptr, sin_ptr, pos_ptr, HALF,
                        ck_ptr, cv_ptr, slot_ptr, KSTART, VSTART, HD, LAYER_OFF, S_STRIDE, H_STRIDE, BLOCK_N, EPI)
            tl.atomic_xchg(cnt_ptr + pid_n, 0, sem="relaxed", scope="gpu")
    else:
        _gemv_store(out_ptr, tot, rows, N, pid_n, e_ptr, dst_ptr, fi_ptr, cos_ptr, sin_ptr, pos_ptr, HALF,
                    ck_ptr, cv_ptr, slot_ptr, KSTART, VSTART, HD, LAYER_OFF, S_STRIDE, H_STRIDE, BLOCK_N, EPI)


@triton.jit
def _gemv_store(out_ptr, tot, rows, N, pid_n, e_ptr, dst_ptr, fi_ptr, cos_ptr, sin_ptr, pos_ptr, HALF,
                ck_ptr, cv_ptr, slot_ptr, KSTART, VSTART, HD, LAYER_OFF, S_STRIDE, H_STRIDE,
                BLOCK_N: tl.constexpr, EPI: tl.constexpr):
    """Store a row tile's sums `tot` [LR, R] (tile-local row l = r * LR + lr, rows = its global
    rows). EPI 0: as they are. EPI 1, 2, 3 (a pair layout, gemv_fused.py: the tile's row l and
    row l + BLOCK_N / 2 form pair l of the tile; N a multiple of BLOCK_N): 1 (SwiGLU) stores
    silu(a) * b at column pid_n * BLOCK_N / 2 + l; 2 (RoPE) adds the bias e[col] to both, rotates
    the pair by the angle of frequency fi (cos/sin row of the position pos_ptr[0], HALF columns;
    fi < 0: no rotation) and stores each at its column dst[row]; 3: 2, and the columns from KSTART
    (keys) and VSTART (values) also into the f16 KV cache at (slot_ptr[0], the position): head
    (col - start) // HD, dim (col - start) % HD."""
    if EPI == 0:
        tl.store(out_ptr + rows, tot, mask=rows < N)
    else:
        HB2: tl.constexpr = BLOCK_N // 2
        flat = tl.reshape(tl.permute(tot, (1, 0)), (2, HB2))  # [half, l]: local row half * HB2 + l
        a, b = tl.split(tl.permute(flat, (1, 0)))
        pair = pid_n * HB2 + tl.arange(0, HB2)
        if EPI == 1:
            tl.store(out_ptr + pair, a * tl.sigmoid(a) * b)
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


Q8_MIN_WEIGHTS = 1 << 24  # at or below, f32 activations: the quantize launch costs more than dp4a saves
ACT_Q8_PASSES = 2  # the default: two passes (one leaves ~5e-3 of error per dot: bench/NOTES.md)


def act_q8() -> int:
    """The int8 activation passes of the Q4_0 / Q4_1 / Q4_K GEMVs' default configs (MINFER_GEMV_Q8:
    0 = f32 activations, 1 or 2 passes)."""
    passes = env("MINFER_GEMV_Q8", ACT_Q8_PASSES)
    if passes not in (0, 1, 2):
        raise UnsupportedError(f"MINFER_GEMV_Q8={passes}: expected 0, 1 or 2")
    return passes


@functools.lru_cache(maxsize=256)
def gemv_config(n: int, k: int, affine: bool = False) -> GemvConfig:
    """`_gemv_config`, with the int8 activation passes of `act_q8` above Q8_MIN_WEIGHTS weights
    (smaller GEMVs are latency-bound: SmolLM2 tg128 1,335 with int8 activations everywhere against
    1,705 without, H200 run 39). Two passes load step i + 1's
    words in step i only without prefetching: the second pass's codes beside the prefetched words
    cost registers, so fewer warps (H200 run 38: Q4_K down 22.1 -> 16.1 µs, Q4_0 o 8.1 -> 7.8)."""
    return with_act_q8(_gemv_config(n, k, affine), act_q8() if n * k > Q8_MIN_WEIGHTS else 0)


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


def q4_0_gemv(
    x: torch.Tensor,
    w: Q4_0Packed | torch.Tensor,
    n: int,
    k: int,
    qtype: GGMLType | int | str = GGMLType.Q4_0,
    out: torch.Tensor | None = None,
    config: GemvConfig | dict | None = None,
    *,
    xq: tuple | None = None,
) -> torch.Tensor:
    """out [1, n] f32 = x @ W^T for one token: x f32 [k] or [1, k], W a Q4_0 [n, k] weight.

    `w`: a `Q4_0Packed` (fast path) or raw GGUF Q4_0 bytes (repacked per call). `config`: a
    `GemvConfig` (or its fields as a dict) instead of the shape's default (`gemv_config`).
    Split-K configs use the packed weight's scratch (partial sums, arrival counters): one call
    per weight at a time (calls on one stream are). `xq`: x's int8 form, made before the call
    (quantize_act_q8 or a fused RMSNorm), used when the config takes int8 activations.
    """
    what = "q4_0_gemv"
    _check_q4_0(what, qtype)
    w = _packed(what, w, n, k)
    check_tensor(what, "x", x, (torch.float32,), ndim=(1, 2))
    if x.numel() != k or (x.dim() == 2 and x.shape[0] != 1):
        raise UnsupportedError(f"{what}: x must be [{k}] or [1, {k}] (M == 1), got {tuple(x.shape)}")
    device = check_device(what, x=x, qs=w.qs, out=out)
    out = make_out(what, out, (1, n), torch.float32, device)
    if config is None:
        cfg = gemv_config(n, k)
    else:
        cfg = GemvConfig(**config) if isinstance(config, dict) else config
    launch_packed(what, x, w, out, cfg, xq=xq)
    return out


def _launch_gemv(what, x, w, d_plane, m_plane, m_stride: int, mode: int, out, n: int, k: int, cfg: GemvConfig,
                 planes: tuple | None = None, epilogue: tuple | None = None, xq: tuple | None = None):
    """Launch the GEMV kernel; `planes` = (hi plane, LB, HB, CENTER) for the planes types;
    `epilogue` = (EPI, e, dst, fi, cos, sin, positions, HALF, cache_k, cache_v, slots, KSTART, VSTART, HD,
    LAYER_OFF, S_STRIDE, H_STRIDE) for gemv_fused.py's fused stores."""
    kb_split, nsplit, tiles = _split_plan(cfg, n, k)
    part, counters = out, out  # unused without a split
    if nsplit > 1:
        part, counters = w.scratch(nsplit, tiles)
    nkb = k // Q4_0.block_elems
    hi, lb, hb, center = planes if planes is not None else (w.qs, 4, 0, 0)
    q8 = cfg.q8 if planes is None else 0  # the planes types keep f32 activations
    xs = x
    if q8 and xq is not None:
        x, xs = _check_xq(what, xq, k, q8, x.device)
    elif q8:
        x, xs = quantize_act_q8(x.reshape(1, k), q8)
    epi, *eargs = epilogue if epilogue is not None else (0, out, counters, counters, out, out, counters, 0,
                                                         out, out, counters, 0, 0, 1, 0, 0, 0)
    _q4_0_gemv_kernel[check_grid(what, (tiles, nsplit))](
        x, w.qs, d_plane, out, part, counters, n, nkb, kb_split, nsplit, _MAGIC_BITS, min(4 * lb, 16), m_plane,
        m_stride, hi, min(4 * hb, 16),  # the shifts to a word's upper slots (byte codes: to slots 2, 3)
        *eargs, xs, EPI=epi, Q8X=q8, R=cfg.r, LR=cfg.lr, LK=32 // cfg.lr, WK=cfg.wk, SPLIT=nsplit > 1,
        EVEN_K=nkb % cfg.block_kb == 0 and nkb % kb_split == 0, MODE=mode, PREFETCH=cfg.prefetch, num_warps=cfg.wk,
        maxnreg=cfg.maxnreg, PLANES=planes is not None, LB=lb, HB=hb, CENTER=center, **pdl_args("gemv"),
    )


def _check_xq(what: str, xq, k: int, passes: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """x's int8 form made before the call: quantize_act_q8's (codes, scales) of one row, `passes` passes."""
    if not (isinstance(xq, tuple) and len(xq) == 2):
        raise UnsupportedError(f"{what}: xq must be quantize_act_q8's (codes, scales), got {type(xq).__name__}")
    codes, scales = xq
    check_tensor(what, "xq codes", codes, (torch.int32,))
    check_tensor(what, "xq scales", scales, (torch.float32,))
    if codes.shape != (1, k // 32, 8 * passes) or scales.shape != (1, k // 32, 4):
        want = f"codes [1, {k // 32}, {8 * passes}], scales [1, {k // 32}, 4]"
        raise UnsupportedError(f"{what}: xq must hold one row of {k} in {passes} passes: {want}; got "
                               f"{tuple(codes.shape)}, {tuple(scales.shape)}")
    check_device(what, x=codes, xq_scales=scales)
    if codes.device != device:
        raise UnsupportedError(f"{what}: xq is on {codes.device}, x on {device}")
    return codes, scales


@dataclass(frozen=True)
class Int4Packed:
    """A Q4_1 or Q4_K [n, k] weight in the GEMV's layout (`repack_int4`): the nibble words of
    Q4_0Packed, 32-element blocks in element order, plus the affine form w = a * n + c per
    block as planes. Q4_1: `d` f16 [n, k/32] (a) and `m` f16 [n, k/32] (c). Q4_K: `d` int16
    [n, k/32] = sc | m << 8 (6-bit scale and min of each 32-element sub-block) and `m` int32
    [n, k/256] = the super-block's f16 d | f16 dmin << 16; a = d * sc, c = -dmin * m, computed in
    the kernel (about the file's bytes per weight: 0.625 for Q4_1, 0.57 for Q4_K against 0.5625:
    the 6-bit scales take a byte each)."""

    qtype: GGMLType
    qs: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor
    n: int
    k: int
    counters: torch.Tensor
    partials: torch.Tensor

    def scratch(self, splits: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _split_scratch(self, splits, tiles)

    @property
    def mode(self) -> int:
        return 1 if self.qtype == GGMLType.Q4_1 else 2


INT4_TYPES = (GGMLType.Q4_1, GGMLType.Q4_K)


def _int4_type(what: str, qtype) -> GGMLType:
    try:
        t = by_name(qtype).type if isinstance(qtype, str) else GGMLType(qtype)
    except (UnsupportedError, ValueError):
        t = None
    if t not in INT4_TYPES:
        raise UnsupportedError(f"{what}: reads Q4_1 or Q4_K weights, got qtype {qtype!r}")
    return t


def repack_int4(raw: torch.Tensor, n: int, k: int, qtype: GGMLType | int | str) -> Int4Packed:
    """Raw GGUF Q4_1 / Q4_K bytes of an [n, k] weight -> the GEMV's Int4Packed, on raw's device."""
    from ..quant.reference import nibbles, scale_min_k4  # the reference codec's field unpackers

    what = "repack_int4"
    t = _int4_type(what, qtype)
    info = QUANT_TABLE[t]
    _check_nk(what, n, k)
    if k % info.block_elems:
        raise UnsupportedError(f"{what}: {info.name} needs k a multiple of {info.block_elems}, got {k}")
    check_tensor(what, "raw", raw, (torch.uint8,))
    need = n * k // info.block_elems * info.block_bytes
    if raw.numel() != need:
        raise UnsupportedError(f"{what}: {info.name} [{n}, {k}] needs {need} bytes, got {raw.numel()}")
    nkb = k // 32
    blocks = raw.reshape(-1, info.block_bytes)
    if t == GGMLType.Q4_1:
        d = blocks[:, 0:2].contiguous().view(torch.float16).reshape(n, nkb)
        m = blocks[:, 2:4].contiguous().view(torch.float16).reshape(n, nkb)
        qs = _pack_words(lambda a, b: blocks[a:b, 4:20], n * nkb, raw.device)
    else:
        sc, mn = scale_min_k4(blocks[:, 4:16])  # [n * k/256, 8] 6-bit values
        d = (sc.to(torch.int16) | (mn.to(torch.int16) << 8)).reshape(n, nkb)
        m = blocks[:, 0:4].contiguous().view(torch.int32).reshape(n, k // 256)

        def bytes16(a: int, b: int) -> torch.Tensor:
            # 32-element sub-blocks a..b: sub-block j of super-block s is nibble half j % 2 of
            # bytes 16 + 32 (j // 2) ..; regrouped as Q4_0's bytes (element i low, i + 16 high)
            sb = blocks[a // 8:(b + 7) // 8, 16:144].reshape(-1, 4, 32)
            q = nibbles(sb).reshape(-1, 32)[a % 8:a % 8 + (b - a)]
            return q[:, :16] | (q[:, 16:] << 4)

        qs = _pack_words(bytes16, n * nkb, raw.device)
    counters, partials = _gemv_scratch(n, k, raw.device, affine=True)
    return _settled(Int4Packed(t, qs.view(n, nkb * 4), d, m, n, k, counters, partials))


def int4_gemv(
    x: torch.Tensor,
    w: Int4Packed | torch.Tensor,
    n: int,
    k: int,
    qtype: GGMLType | int | str,
    out: torch.Tensor | None = None,
    config: GemvConfig | dict | None = None,
    *,
    xq: tuple | None = None,
) -> torch.Tensor:
    """out [1, n] f32 = x @ W^T for one token, W a Q4_1 or Q4_K [n, k] weight: q4_0_gemv's tile
    and loop with the block's affine scale (w = a * nibble + c); `w` an Int4Packed or raw bytes;
    `xq` as for q4_0_gemv."""
    what = "int4_gemv"
    t = _int4_type(what, qtype)
    if not isinstance(w, Int4Packed):
        w = repack_int4(w, n, k, t)
    if (w.n, w.k, w.qtype) != (n, k, t):
        raise UnsupportedError(f"{what}: w is a packed {w.qtype.name} [{w.n}, {w.k}], the call says {t.name} "
                               f"[{n}, {k}]")
    check_tensor(what, "x", x, (torch.float32,), ndim=(1, 2))
    if x.numel() != k or (x.dim() == 2 and x.shape[0] != 1):
        raise UnsupportedError(f"{what}: x must be [{k}] or [1, {k}] (M == 1), got {tuple(x.shape)}")
    device = check_device(what, x=x, qs=w.qs, out=out)
    out = make_out(what, out, (1, n), torch.float32, device)
    cfg = gemv_config(n, k, True) if config is None else (GemvConfig(**config) if isinstance(config, dict)
                                                          else config)
    launch_packed(what, x, w, out, cfg, xq=xq)
    return out


# ---------------------------------------------------------------------------------------------
# planes GEMV (M == 1): the 8-, 6-, 5-, 3- and 2-bit types on the same tile


@dataclass(frozen=True)
class PlaneType:
    """How a ggml type's codes and scales sit in the planes layout (see `PlanesPacked`)."""

    lb: int  # bits of each code in the low plane: 4 (nibble words, int32), 2 (int16 words), 8 (see hb)
    hb: int  # bits in the high plane: 0 (none), 1 (int8 words), 2 (int16), 4 (int32); lb = hb = 8 (Q8_0):
    # whole byte codes, the "low" plane elements 0..15 of each block, the "high" plane elements 16..31
    center: int  # subtracted from the code (symmetric types), 0 for the affine ones
    mode: int  # the scale form (_planes_scales): 0 d, 1 d + m, 2 K-quant 6-bit sc/m, 3 two int8 sc, 4 Q2_K


PLANE_TYPES = {
    GGMLType.Q8_0: PlaneType(8, 8, 128, 0),  # byte codes q + 128 (unsigned), d per 32
    GGMLType.Q5_0: PlaneType(4, 1, 16, 0),
    GGMLType.Q5_1: PlaneType(4, 1, 0, 1),
    GGMLType.Q5_K: PlaneType(4, 1, 0, 2),
    GGMLType.Q6_K: PlaneType(4, 2, 32, 3),
    GGMLType.Q3_K: PlaneType(2, 1, 4, 3),
    GGMLType.Q2_K: PlaneType(2, 0, 0, 4),
}
_WORD_DTYPES = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int32}  # bits per slot -> word dtype


@dataclass(frozen=True)
class PlanesPacked:
    """A Q8_0 / Q5_0 / Q5_1 / Q5_K / Q6_K / Q3_K / Q2_K [n, k] weight in the GEMV's planes layout
    (`repack_planes`), about the file's bytes per weight, every plane aligned for wide loads.

    Each weight's unsigned code (Q6_K: its 6 bits; Q5_x: 5; ...) is lo | hi << lb. Per
    32-element block and lane word j (j = 0..3), slot s (0..7) holds element 4 s + j: `lo` is
    [n, k/8] of 8 lb-bit slots (lb = 4: int32, the nibble words of Q4_0Packed; lb = 2: int16),
    `hi` [n, k/8] of 8 hb-bit slots (int8 / int16; absent when hb = 0), slot s at bit bits * s.
    Q8_0 (lb = hb = 8): its byte codes q + 128, `lo` word j = elements 4 s + j (s = 0..3) at
    bit 8 s, `hi` the same for elements 16 + 4 s + j.
    Scales (`d`, `m`) per PlaneType.mode: 0: d f16 [n, k/32]; 1: d, m f16 [n, k/32];
    2: d int16 [n, k/32] = sc | m << 8 and m int32 [n, k/256] = f16 d | f16 dmin << 16 (Q4_K's
    planes); 3: d int16 [n, k/32] = sc0 | sc1 << 8 (the signed scales of the block's two 16-element
    sub-blocks) and m f16 [n, k/256] (the super-block's d); 4: d int16 [n, k/32] = the file's two
    scale bytes of the block's sub-blocks, m int32 [n, k/256] = d | dmin << 16."""

    qtype: GGMLType
    lo: torch.Tensor
    hi: torch.Tensor | None
    d: torch.Tensor
    m: torch.Tensor
    n: int
    k: int
    counters: torch.Tensor
    partials: torch.Tensor

    def __post_init__(self):
        """Checked once, when made: a plane of the wrong dtype or size would be misread, not refused."""
        what = f"PlanesPacked[{self.qtype.name}]"
        pt, info = PLANE_TYPES.get(self.qtype), QUANT_TABLE[self.qtype]
        if pt is None:
            raise UnsupportedError(f"{what}: not a planes type")
        _check_nk(what, self.n, self.k)
        if self.k % info.block_elems:
            raise UnsupportedError(f"{what}: k must be a multiple of {info.block_elems}, got {self.k}")
        check_tensor(what, "lo", self.lo, (_WORD_DTYPES[pt.lb],))
        if pt.hb:
            check_tensor(what, "hi", self.hi, (_WORD_DTYPES[pt.hb],))
        elif self.hi is not None:
            raise UnsupportedError(f"{what}: has no high plane, got one")
        words = self.n * self.k // 8
        if self.lo.numel() != words or (self.hi is not None and self.hi.numel() != words):
            raise UnsupportedError(f"{what}: planes must hold {words} words for [{self.n}, {self.k}]")
        if self.d.numel() != self.n * self.k // 32:
            raise UnsupportedError(f"{what}: d must hold {self.n * self.k // 32} scales, got {self.d.numel()}")
        planes = [t for t in (self.lo, self.hi, self.d, self.m) if t is not None]
        if len({t.device for t in planes}) != 1:
            raise UnsupportedError(f"{what}: planes must be on one device")

    @property
    def qs(self) -> torch.Tensor:  # the low plane, where the shared launcher looks for the words
        return self.lo

    @property
    def nbytes(self) -> int:
        planes = (self.lo, self.hi, self.d, None if self.m is self.d else self.m)
        return sum(t.numel() * t.element_size() for t in planes if t is not None)

    def scratch(self, splits: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _split_scratch(self, splits, tiles)


def _plane_words(fields: torch.Tensor, bits: int) -> torch.Tensor:
    """[blocks, 32] codes' fields (int64, < 2^bits) -> [blocks, 4] words of `bits` * 8 bits, slot s
    of word j = element 4 s + j at bit bits * s, as the signed dtype of that width."""
    width = 8 * bits
    shifts = torch.arange(8, dtype=torch.int64, device=fields.device).view(1, 8, 1) * bits
    word = (fields.view(-1, 8, 4) << shifts).sum(1)
    return (word - ((word >> (width - 1)) << width)).to(_WORD_DTYPES[bits])


def _byte_words(codes: torch.Tensor) -> torch.Tensor:
    """[blocks, 16] byte codes (int64) -> [blocks, 4] int32 words, word j = codes 4 s + j at bit 8 s."""
    shifts = torch.arange(4, dtype=torch.int64, device=codes.device).view(1, 4, 1) * 8
    word = (codes.view(-1, 4, 4) << shifts).sum(1)
    return (word - ((word >> 31) << 32)).to(torch.int32)


def _pair16(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """int16 lo | hi << 8 of two byte values (0..255) each."""
    v = lo.to(torch.int32) | (hi.to(torch.int32) << 8)
    return (v - ((v >> 15) << 16)).to(torch.int16)


def _codes_and_scales(t: GGMLType, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """For `b` [blocks, block_bytes] of type t: (codes [blocks * block_elems / 32, 32] int64 in
    element order, the d plane's values per 32-element block, the m plane's values (per block
    for Q5_1, per super-block for the K-quants)). The fields are unpacked as the reference
    decoders (minfer.quant.reference) unpack them."""
    from ..quant.reference import _bits, _qh_bits, nibbles, scale_min_k4

    n = b.shape[0]
    if t == GGMLType.Q8_0:
        q = b[:, 2:34].view(torch.int8).to(torch.int64) + 128
        return q, b[:, 0:2].contiguous().view(torch.float16), None
    if t in (GGMLType.Q5_0, GGMLType.Q5_1):
        off = 2 if t == GGMLType.Q5_0 else 4  # qh after d (and m)
        q = nibbles(b[:, off + 4:off + 20]).reshape(n, 32) | (_qh_bits(b[:, off:off + 4]) << 4)
        m = b[:, 2:4].contiguous().view(torch.float16) if t == GGMLType.Q5_1 else None
        return q.to(torch.int64), b[:, 0:2].contiguous().view(torch.float16), m
    if t == GGMLType.Q5_K:
        sc, mn = scale_min_k4(b[:, 4:16])
        q = nibbles(b[:, 48:176].reshape(n, 4, 32)).reshape(n, 8, 32) | (_bits(b[:, 16:48], range(8), 1) << 4)
        d = (sc.to(torch.int16) | (mn.to(torch.int16) << 8)).reshape(n * 8)
        return q.reshape(n * 8, 32).to(torch.int64), d, b[:, 0:4].contiguous().view(torch.int32)
    if t == GGMLType.Q6_K:
        low4 = nibbles(b[:, 0:128].reshape(n, 2, 64)).reshape(n, 256)
        high2 = _bits(b[:, 128:192].reshape(n, 2, 32), (0, 2, 4, 6), 3).reshape(n, 256)
        sc = b[:, 192:208].reshape(n * 8, 2)  # the int8 scales' bits
        return (low4 | (high2 << 4)).reshape(n * 8, 32).to(torch.int64), _pair16(sc[:, 0], sc[:, 1]), \
            b[:, 208:210].contiguous().view(torch.float16)
    if t == GGMLType.Q3_K:
        packed = b[:, 96:108]
        low4 = nibbles(packed[:, 0:8]).reshape(n, 16)
        high2 = _bits(packed[:, 8:12], (0, 2, 4, 6), 3).reshape(n, 16)
        sc = ((low4 | (high2 << 4)).to(torch.int16) - 32) & 0xFF  # the bits of the signed scales (6 bits - 32)
        low2 = _bits(b[:, 32:96].reshape(n, 2, 32), (0, 2, 4, 6), 3).reshape(n, 256)
        hbit = _bits(b[:, 0:32], range(8), 1).reshape(n, 256)
        sc = sc.view(n * 8, 2)
        return (low2 | (hbit << 2)).reshape(n * 8, 32).to(torch.int64), _pair16(sc[:, 0], sc[:, 1]), \
            b[:, 108:110].contiguous().view(torch.float16)
    if t == GGMLType.Q2_K:
        q = _bits(b[:, 16:80].reshape(n, 2, 32), (0, 2, 4, 6), 3).reshape(n * 8, 32)
        sc = b[:, 0:16].reshape(n * 8, 2)
        return q.to(torch.int64), _pair16(sc[:, 0], sc[:, 1]), b[:, 80:84].contiguous().view(torch.int32)
    raise UnsupportedError(f"repack_planes: no planes layout for {t.name}")


def _plane_type(what: str, qtype, allowed=tuple(PLANE_TYPES)) -> GGMLType:
    """The GGMLType of `qtype` when it is one of `allowed`, else UnsupportedError naming them."""
    try:
        t = by_name(qtype).type if isinstance(qtype, str) else GGMLType(qtype)
    except (UnsupportedError, ValueError):
        t = None
    if t not in allowed:
        names = ", ".join(a.name for a in allowed)
        raise UnsupportedError(f"{what}: reads {names} weights, got qtype {qtype!r}")
    return t


def repack_planes(raw: torch.Tensor, n: int, k: int, qtype: GGMLType | int | str) -> PlanesPacked:
    """Raw GGUF bytes of a planes-type [n, k] weight -> the GEMV's PlanesPacked, on raw's device
    (in chunks of blocks, so the int64 temporaries stay bounded)."""
    what = "repack_planes"
    t = _plane_type(what, qtype)
    info, pt = QUANT_TABLE[t], PLANE_TYPES[t]
    _check_nk(what, n, k)
    if k % info.block_elems:
        raise UnsupportedError(f"{what}: {info.name} needs k a multiple of {info.block_elems}, got {k}")
    check_tensor(what, "raw", raw, (torch.uint8,))
    n_blocks = n * k // info.block_elems
    if raw.numel() != n_blocks * info.block_bytes:
        need = n_blocks * info.block_bytes
        raise UnsupportedError(f"{what}: {info.name} [{n}, {k}] needs {need} bytes, got {raw.numel()}")
    blocks, dev, per = raw.reshape(n_blocks, info.block_bytes), raw.device, info.block_elems // 32
    lo = torch.empty(n * k // 32, 4, dtype=_WORD_DTYPES[pt.lb], device=dev)
    hi = torch.empty(n * k // 32, 4, dtype=_WORD_DTYPES[pt.hb], device=dev) if pt.hb else None
    d_parts, m_parts = [], []
    step = max(1, _REPACK_CHUNK // per)
    for start in range(0, n_blocks, step):
        stop = min(start + step, n_blocks)
        q, d, m = _codes_and_scales(t, blocks[start:stop])
        rows = slice(start * per, stop * per)
        if pt.lb == 8:  # byte codes: elements 0..15 of each block in `lo`, 16..31 in `hi`, 4 per word
            lo[rows], hi[rows] = _byte_words(q[:, :16]), _byte_words(q[:, 16:])
        else:
            lo[rows] = _plane_words(q & ((1 << pt.lb) - 1), pt.lb)
            if hi is not None:
                hi[rows] = _plane_words(q >> pt.lb, pt.hb)
        d_parts.append(d.reshape(-1))
        if m is not None:
            m_parts.append(m.reshape(-1))
    d = torch.cat(d_parts).reshape(n, k // 32)
    m = torch.cat(m_parts).reshape(n, -1) if m_parts else d  # Q8_0 / Q5_0: no m plane (d stands in)
    counters, partials = _gemv_scratch(n, k, dev, affine=True)
    hi = hi.view(n, k // 8) if hi is not None else None
    return _settled(PlanesPacked(t, lo.view(n, k // 8), hi, d, m, n, k, counters, partials))


def planes_gemv(
    x: torch.Tensor,
    w: PlanesPacked | torch.Tensor,
    n: int,
    k: int,
    qtype: GGMLType | int | str,
    out: torch.Tensor | None = None,
    config: GemvConfig | dict | None = None,
    *,
    what: str = "planes_gemv",
    allowed: tuple[GGMLType, ...] = tuple(PLANE_TYPES),
) -> torch.Tensor:
    """out [1, n] f32 = x @ W^T for one token, W a planes-type [n, k] weight (`PLANE_TYPES`):
    q4_0_gemv's tile, loop and split K, each code assembled from its planes exactly in f32 and
    the block's scales (and offsets) applied once per 16- or 32-element sub-block; `w` a
    PlanesPacked or raw GGUF bytes (repacked per call)."""
    t = _plane_type(what, qtype, allowed)
    if not isinstance(w, PlanesPacked):
        if not isinstance(w, torch.Tensor):
            raise UnsupportedError(f"{what}: w must be a PlanesPacked or raw GGUF bytes, got {type(w).__name__}")
        w = repack_planes(w, n, k, t)
    if (w.n, w.k, w.qtype) != (n, k, t):
        raise UnsupportedError(f"{what}: w is a packed {w.qtype.name} [{w.n}, {w.k}], the call says {t.name} "
                               f"[{n}, {k}]")
    check_tensor(what, "x", x, (torch.float32,), ndim=(1, 2))
    if x.numel() != k or (x.dim() == 2 and x.shape[0] != 1):
        raise UnsupportedError(f"{what}: x must be [{k}] or [1, {k}] (M == 1), got {tuple(x.shape)}")
    device = check_device(what, x=x, lo=w.lo, out=out)
    out = make_out(what, out, (1, n), torch.float32, device)
    cfg = planes_config(n, k, t) if config is None else (GemvConfig(**config) if isinstance(config, dict) else config)
    launch_packed(what, x, w, out, cfg)
    return out


@functools.lru_cache(maxsize=256)
def planes_config(n: int, k: int, qtype: GGMLType) -> GemvConfig:
    """A planes type's config: the affine Q4 types' (`gemv_config(n, k, affine=True)`: the same
    tile, with more work per weight), at the register caps the sm_90 compile check finds free of
    spills: prefetching tiles 168 registers, except Q5_1 / Q5_K (the high words and the offsets
    do not fit beside the prefetched words: 48-96 bytes of spills at 168-232), which load each
    step's words in the step (128 registers), as wide Q6_K weights do (the 8B's output head; H200 run 38).
    The planes types keep f32 activations (q8 = 0)."""
    cfg = replace(_gemv_config(n, k, True), q8=0)  # f32 activations: no int8 path for these types
    if not cfg.prefetch:
        return cfg
    if qtype == GGMLType.Q6_K and n >= WIDE_ROWS:  # the 8B's output head: 170.9 vs 190.0 µs (H200 run 38)
        return replace(cfg, prefetch=False, maxnreg=128)
    if PLANE_TYPES[qtype].mode in (1, 2):
        return replace(cfg, prefetch=False, maxnreg=128)
    return replace(cfg, maxnreg=PLANES_REGS)


PLANES_REGS = 168


def q8_0_gemv(x, w, n, k, qtype=GGMLType.Q8_0, out=None, config=None):
    """planes_gemv for Q8_0 weights (its contract: 1.0625 bytes per weight)."""
    return planes_gemv(x, w, n, k, qtype, out, config, what="q8_0_gemv", allowed=(GGMLType.Q8_0,))


def q6_k_gemv(x, w, n, k, qtype=GGMLType.Q6_K, out=None, config=None):
    """planes_gemv for Q6_K weights (0.82 bytes per weight)."""
    return planes_gemv(x, w, n, k, qtype, out, config, what="q6_k_gemv", allowed=(GGMLType.Q6_K,))


def q5_gemv(x, w, n, k, qtype, out=None, config=None):
    """planes_gemv for the 5-bit types Q5_0, Q5_1, Q5_K (0.69-0.75 bytes per weight)."""
    return planes_gemv(x, w, n, k, qtype, out, config, what="q5_gemv",
                       allowed=(GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q5_K))


def q3_k_gemv(x, w, n, k, qtype=GGMLType.Q3_K, out=None, config=None):
    """planes_gemv for Q3_K weights (0.43 bytes per weight in the file, 0.45 repacked)."""
    return planes_gemv(x, w, n, k, qtype, out, config, what="q3_k_gemv", allowed=(GGMLType.Q3_K,))


def q2_k_gemv(x, w, n, k, qtype=GGMLType.Q2_K, out=None, config=None):
    """planes_gemv for Q2_K weights (0.33 bytes per weight)."""
    return planes_gemv(x, w, n, k, qtype, out, config, what="q2_k_gemv", allowed=(GGMLType.Q2_K,))


# ---------------------------------------------------------------------------------------------
# any GEMV type: what the fused GEMVs (gemv_fused.py) need to run this kernel on any of them

GEMV_TYPES = (GGMLType.Q4_0, *INT4_TYPES, *PLANE_TYPES)
GemvPacked = Q4_0Packed | Int4Packed | PlanesPacked


def gemv_type(what: str, qtype) -> GGMLType:
    """The GGMLType of `qtype` (type, ggml id or name) when the GEMV reads it, else UnsupportedError."""
    return _plane_type(what, qtype, GEMV_TYPES)


def repack_gemv(raw: torch.Tensor, n: int, k: int, qtype: GGMLType) -> GemvPacked:
    """Raw GGUF bytes of an [n, k] weight of any GEMV type -> that type's GEMV layout."""
    if qtype == GGMLType.Q4_0:
        return repack_q4_0(raw, n, k)
    if qtype in INT4_TYPES:
        return repack_int4(raw, n, k, qtype)
    return repack_planes(raw, n, k, qtype)


def gemv_default_config(n: int, k: int, qtype: GGMLType) -> GemvConfig:
    """The config the type's own GEMV launches an [n, k] weight with."""
    if qtype == GGMLType.Q4_0:
        return gemv_config(n, k)
    if qtype in INT4_TYPES:
        return gemv_config(n, k, True)
    return planes_config(n, k, qtype)


def launch_packed(what: str, x: torch.Tensor, w: GemvPacked, out: torch.Tensor, cfg: GemvConfig,
                  epilogue: tuple | None = None, xq: tuple | None = None) -> None:
    """Launch the GEMV kernel on a packed weight of any GEMV type (x, out checked by the caller).
    `xq`: x already quantized (quantize_act_q8's (codes, scales), e.g. by the RMSNorm before it),
    used when the config takes int8 activations of as many passes."""
    if isinstance(w, Q4_0Packed):
        _launch_gemv(what, x, w, w.d, w.d, 0, 0, out, w.n, w.k, cfg, epilogue=epilogue, xq=xq)
    elif isinstance(w, Int4Packed):
        _launch_gemv(what, x, w, w.d, w.m, w.m.shape[1], w.mode, out, w.n, w.k, cfg, epilogue=epilogue, xq=xq)
    else:
        pt = PLANE_TYPES[w.qtype]
        hi = w.hi if w.hi is not None else w.lo
        _launch_gemv(what, x, w, w.d, w.m, w.m.shape[1], pt.mode, out, w.n, w.k, cfg, (hi, pt.lb, pt.hb, pt.center),
                     epilogue)


# ---------------------------------------------------------------------------------------------
# tiled matmul (M > 1)


@triton.jit
def _mma_operand(v, COMPUTE: tl.constexpr):
    """f32 tile `v` rounded to the tensor-core input type COMPUTE.

    The interpreter's dot multiplies bf16 tiles as their raw 16-bit patterns, so there a bf16
    operand is rounded to bf16 and kept in f32: the same products, exact in f32.
    """
    if COMPUTE == tl.bfloat16:
        if INTERPRETING:
            return f32_to_bf16_rne(v).to(tl.float32)
        else:
            return v.to(tl.bfloat16)
    else:
        return v.to(COMPUTE)


@triton.jit
def _dot_slot(acc, xp, xmask, w, MASK: tl.constexpr, BIAS: tl.constexpr, magic, d, COMPUTE: tl.constexpr):
    """acc + x[:, slot] @ W[slot, :] for one nibble slot: x tile [BM, BW] at xp, words w [BW, BN],
    `d` the block scales times 2^-b for the slot's bit position b."""
    a = tl.load(xp, mask=xmask, other=0.0)
    b = _slot(w, MASK, BIAS, magic) * d
    return tl.dot(_mma_operand(a, COMPUTE), _mma_operand(b, COMPUTE), acc)


@triton.jit
def _q4_0_matmul_kernel(
    x_ptr, qs_ptr, d_ptr, out_ptr, M, N, K, NKB, M_BUCKET, magic, half_shift,
    COMPUTE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
):
    pid_m, pid_n, _, _ = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_m = tl.minimum(offs_m, M - 1).to(tl.int64)  # clamped loads, masked store
    cols_n = tl.minimum(offs_n, N - 1).to(tl.int64)
    # A K step of BLOCK_K values is BW = BLOCK_K / 8 packed words per row of W (word i: block
    # i // 4, word i % 4). Its 8 nibble slots are 8 dots of depth BW: slot s of word i holds
    # k = 32 (i // 4) + 4 s + i % 4, so each dot reads W's words once and x 4 values at a time.
    i = tl.arange(0, BLOCK_K // 8)
    w_tile = qs_ptr + cols_n[None, :] * (NKB * 4) + i[:, None]
    d_tile = d_ptr + cols_n[None, :] * NKB + (i // 4)[:, None]
    x_tile = x_ptr + rows_m[:, None] * K + ((i // 4) * 32 + i % 4)[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            imask = tl.full([BLOCK_K // 8], 1, tl.int1)
        else:
            imask = k0 + (i // 4) * 32 < K
        w = tl.load(w_tile + k0 // 8, mask=imask[:, None], other=0)
        d = tl.load(d_tile + k0 // 32, mask=imask[:, None], other=0.0).to(tl.float32)
        d1 = d * 0.0625
        d2 = d * 0.00390625
        d3 = d * 0.000244140625
        h = w >> half_shift
        xp = x_tile + k0
        xm = imask[None, :]
        acc = _dot_slot(acc, xp, xm, w, 0xF, 8388616.0, magic, d, COMPUTE)
        acc = _dot_slot(acc, xp + 4, xm, w, 0xF0, 8388736.0, magic, d1, COMPUTE)
        acc = _dot_slot(acc, xp + 8, xm, w, 0xF00, 8390656.0, magic, d2, COMPUTE)
        acc = _dot_slot(acc, xp + 12, xm, w, 0xF000, 8421376.0, magic, d3, COMPUTE)
        acc = _dot_slot(acc, xp + 16, xm, h, 0xF, 8388616.0, magic, d, COMPUTE)
        acc = _dot_slot(acc, xp + 20, xm, h, 0xF0, 8388736.0, magic, d1, COMPUTE)
        acc = _dot_slot(acc, xp + 24, xm, h, 0xF00, 8390656.0, magic, d2, COMPUTE)
        acc = _dot_slot(acc, xp + 28, xm, h, 0xF000, 8421376.0, magic, d3, COMPUTE)
    out = out_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    tl.store(out, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


_MATMUL_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "GROUP_M": 8}, num_warps=nw, num_stages=ns)
    for bm, bn, nw, ns in [
        (16, 64, 4, 3),
        (32, 64, 4, 3),
        (64, 64, 4, 3),
        (64, 128, 8, 3),
        (128, 64, 8, 2),
        (128, 128, 8, 2),
    ]
]


def _prune_matmul(configs, named_args, **kwargs):
    """Keep tiles no taller than M needs (M rounded up to a power of two, at least 16)."""
    m_cap = max(16, named_args["M_BUCKET"])
    fit = [c for c in configs if c.kwargs["BLOCK_M"] <= m_cap]
    return fit or [min(configs, key=lambda c: c.kwargs["BLOCK_M"])]


_matmul = triton.heuristics({"EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0})(_q4_0_matmul_kernel)
_matmul_tuned = triton.autotune(
    _MATMUL_CONFIGS,
    key=["M_BUCKET", "N", "K", "COMPUTE"],
    prune_configs_by={"early_config_prune": _prune_matmul},
)(_matmul)

_COMPUTE = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def q4_0_matmul(
    x: torch.Tensor,
    w: Q4_0Packed | torch.Tensor,
    n: int,
    k: int,
    qtype: GGMLType | int | str = GGMLType.Q4_0,
    out: torch.Tensor | None = None,
    config: dict | None = None,
    compute_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """out [m, n] f32 = x @ W^T for m tokens: x f32 [m, k], W a Q4_0 [n, k] weight.

    Products run on tensor cores in `compute_dtype` (float16: 11-bit mantissa, |x| < 65504;
    bfloat16: f32 range, 8-bit mantissa) with f32 accumulation. `w` and `config` as in
    `q4_0_gemv` (config keys BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages).
    """
    what = "q4_0_matmul"
    _check_q4_0(what, qtype)
    w = _packed(what, w, n, k)
    check_tensor(what, "x", x, (torch.float32,), ndim=2)
    if x.shape[1] != k:
        raise UnsupportedError(f"{what}: x must be [m, {k}], got {tuple(x.shape)}")
    if compute_dtype not in _COMPUTE:
        raise UnsupportedError(f"{what}: compute_dtype must be float16 or bfloat16, got {compute_dtype}")
    device = check_device(what, x=x, qs=w.qs, d=w.d, out=out)
    m = x.shape[0]
    out = make_out(what, out, (m, n), torch.float32, device)
    if m == 0:
        return out
    nkb = k // Q4_0.block_elems
    m_bucket = triton.next_power_of_2(m)  # autotune per power-of-two M, not per prompt length
    args = (x, w.qs, w.d, out, m, n, k, nkb, m_bucket, _MAGIC_BITS, _HALF_SHIFT)
    compute = _COMPUTE[compute_dtype]
    if config is None and interpreting():  # nothing to time configs on: the first one pruning keeps
        config = _launch_kwargs(_prune_matmul(_MATMUL_CONFIGS, {"M_BUCKET": m_bucket})[0])

    def grid(meta):
        return check_grid(what, (cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]),))

    if config is None:
        _matmul_tuned[grid](*args, COMPUTE=compute)
    else:
        _matmul[grid](*args, COMPUTE=compute, **config)
    return out
