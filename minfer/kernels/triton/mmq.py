"""Int8 tensor-core matmul ("MMQ") on the GEMVs' packed weights: prefill chunks and decode
batches (M = 2..64) of every type the GEMVs read, with no second copy of the weights.

    out[m, n] f32 = sum_k x[m, k] * W[n, k],  W a Q4_0Packed / Int4Packed / PlanesPacked (q4_0.py, int4.py, planes.py)

Per 32-element block b of K (llama.cpp's MMQ with Q8_1 activations):

- x: each row's 32 values are quantized in the kernel, d_x = amax / 127, q = round(x / d_x)
  (half away from zero, as llama.cpp's roundf), int8; the sum of q is kept for the offsets.
- W: the block's codes unpacked from the packed words to int8 in their natural slot order: the
  words of a row's block are j = 0..3 and slot s (0..7) of word j is element 4 s + j, so dot
  position p = 8 j + s holds element 4 s + j, and x is loaded with the matching permuted pointers
  (element 4 (p % 8) + p // 8): a dot product does not care about the order when both sides agree.
  Symmetric types (Q4_0, Q8_0, Q5_0, Q6_K, Q3_K) subtract their center in the codes (exact).
  The lookup types (IQ4_NL, IQ4_XS, MXFP4: lut4.py) look their codes up with gemv.py's byte
  permutes (the table's value + 128, minus 128: the int8 value, exact); their words hold element
  8 i + 4 h + j at nibble 4 h + i, and x is loaded in that order instead.
- `tl.dot(int8 [BM, 32], int8 [32, BN]) -> int32` on tensor cores (mma m16n8k32), exact; the
  int32 becomes f32 by the magic-number form (add the bits of 1.5 * 2^23, subtract 1.5 * 2^23:
  exact for |isum| < 2^22, full-rate ops where an I2F conversion is one-sixteenth rate), then
  acc += isum * d_x * a_w. The affine types' offsets (Q4_1 / Q5_1 m, Q4_K / Q5_K / Q2_K -dmin * m)
  come through the block sum of the quantized x: acc += sum(q) * d_x * c_w.
- 16-element sub-blocks (Q6_K, Q3_K, Q2_K: elements 0..15 are slots 0..3): two dots, x's other
  half masked to 0, each with its sub-block's scale.

So the only rounding is x's int8 quantization (~2^-8 of a block's amax per value: ~3e-3 relative
on random data, the same as llama.cpp's MMQ) and the f32 sums.

Tiles: BLOCK_M rows of x (>= 16, the mma's M; fewer rows are clamped loads and masked stores) by
BLOCK_N rows of W, KB blocks per loop step (unrolled), programs grouped along M so W tiles are
reused from L2. Few tiles (decode batches, the 7B's 3584-row projections) split K across programs
(`_split`: about TARGET_PROGRAMS programs in all); each stores its partial sums and the last of a
tile's programs to arrive adds them in split order (deterministic, bit-stable) and resets the
tile's arrival counter, as the split-K GEMV does. Configs: a small `@triton.autotune` list pruned
by M (`_prune`; its choices kept on disk), every one free of register spills at sm_90; a
launcher's `config=` pins one (tests pin one so the interpreter runs one small config). Raw GGUF
bytes are accepted too and repacked per call (correct, slow: the backend passes the weights it
repacked at load for the GEMVs).

Known costs (sm_90 compile): 64- and 128-row tiles take 240-255 registers (one or two programs
per SM), and x's int8 tile reaches the tensor cores through byte-wide shared-memory stores; x's
f32 tile is re-read from L2 by every column tile (4 bytes per value, against the weight's 0.56):
at 64 rows that traffic outweighs the weight's. A separate quantize pass (int8 x + scales, read
by every tile) would cut it 3.5x at the price of a launch.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ...errors import UnsupportedError
from ...quant.types import GGMLType
from ._common import cdiv, check_device, check_grid, check_tensor, e8m0_half, grouped_tile, interpreting, make_out
from .gemv import _lut_bytes
from .int4 import INT4_TYPES
from .lut4 import LUT4_TYPES, Lut4Packed
from .planes import PLANE_TYPES, PlanesPacked, _plane_type
from .q4_0 import Q4_0Packed
from .qmatmul import GemvPacked, packed_gemv

# the types this kernel reads (every GEMV type), and (LB, HB, CENTER, MODE) of their layouts: the
# codes' low / high bits in the words (planes.PlaneType), the center symmetric types subtract,
# the scale form (0: d per block; 1: d, m per block; 2: K-quant 6-bit sc, m + super-block d, dmin;
# 3: two int8 sub-block scales + super-block d; 4: Q2_K's 4-bit scale | min pairs + d, dmin; the lookup
# types' 5: int8 sub-block scale + super-block d, 6: an E8M0 exponent per block)
MMQ_TYPES = (GGMLType.Q4_0, *INT4_TYPES, *PLANE_TYPES, *LUT4_TYPES)
_Q4_LAYOUT = {GGMLType.Q4_0: (4, 0, 8, 0), GGMLType.Q4_1: (4, 0, 0, 1), GGMLType.Q4_K: (4, 0, 0, 2)}
TARGET_PROGRAMS = 528  # 4 per H200 SM: fewer tiles than this and K is split across programs
MAX_SPLIT = 8
_MAGIC_I2F = 0x4B400000  # bits of 1.5 * 2^23: int32 i + these bits is the f32 1.5 * 2^23 + i (|i| < 2^22)


def kernel_planes(w: GemvPacked) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(hi, m, consts) of a packed weight for the kernels that read its planes (this file's, moe.py's
    moe_mm16): the high-bit plane (the code words where there is none), the plane the kernels'
    `m_ptr` reads, and the layout's constexprs LB, HB, CENTER, MODE, LUT with a lookup type's table
    words t0..t3 (zeros otherwise)."""
    hi = w.hi if isinstance(w, PlanesPacked) and w.hi is not None else w.qs
    m_plane = w.m if not isinstance(w, Q4_0Packed) else w.d
    lb, hb, center, mode = layout_of(w)
    lut = isinstance(w, Lut4Packed)
    table = w.table if lut else (0, 0, 0, 0)
    return hi, m_plane, dict(LB=lb, HB=hb, CENTER=center, MODE=mode, LUT=lut,
                             **dict(zip(("t0", "t1", "t2", "t3"), table, strict=True)))


def layout_of(w: GemvPacked) -> tuple[int, int, int, int]:
    """(LB, HB, CENTER, MODE) of a packed weight (a lookup type: its table bytes, center 128)."""
    if isinstance(w, Lut4Packed):
        return 8, 0, 128, w.mode
    if isinstance(w, PlanesPacked):
        pt = PLANE_TYPES[w.qtype]
        return pt.lb, pt.hb, pt.center, pt.mode
    return _Q4_LAYOUT[GGMLType.Q4_0 if isinstance(w, Q4_0Packed) else w.qtype]


# ---------------------------------------------------------------------------------------------
# kernel


@triton.jit
def _w_codes(lo_rows, hi_rows, b, j, s, t0, t1, t2, t3, LB: tl.constexpr, HB: tl.constexpr, CENTER: tl.constexpr,
             LUT: tl.constexpr):
    """int8 [32, BN]: block b's codes (minus CENTER) of the tile's rows, dot position p = 8 j + s
    holding element 4 s + j (LUT: element 8 (s % 4) + 4 (s / 4) + j, the lookup words' order).
    lo_rows / hi_rows: [BN, 1] pointers to the rows' low / high planes; j [1, 4, 1] (word), s [1, 1, 8]
    (slot); t0..t3 a lookup type's table words."""
    lo = tl.load(lo_rows[:, :, None] + b * 4 + j).to(tl.int32)  # [BN, 4, 1]
    if LUT:  # the table bytes of the word's nibbles 0..3 (wa) and 4..7 (wb)
        wa, wb = _lut_bytes(lo, t0, t1, t2, t3)
        c = (tl.where(s < 4, wa, wb) >> (8 * (s & 3))) & 0xFF
    elif LB == 8:  # Q8_0's byte codes: elements 0..15 in the low plane (slots 0..3), 16..31 in the high
        hi = tl.load(hi_rows[:, :, None] + b * 4 + j)
        c = (tl.where(s < 4, lo, hi) >> (8 * (s & 3))) & 0xFF
    else:
        c = (lo >> (LB * s)) & ((1 << LB) - 1)
        if HB > 0:
            hi = tl.load(hi_rows[:, :, None] + b * 4 + j).to(tl.int32)
            c = c | (((hi >> (HB * s)) & ((1 << HB) - 1)) << LB)
    c = (c - CENTER).to(tl.int8)  # [BN, 4, 8]
    return tl.trans(tl.reshape(c, (c.shape[0], 32)))


@triton.jit
def _half_f16(bits):
    """The f16 whose bit pattern is the low 16 bits of int32 `bits`, as f32."""
    return (bits & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _w_scales(d_rows, m_rows, b, ok, MODE: tl.constexpr):
    """(a0, a1, c0, c1) [BN] of block b (all 0 when not `ok`): code scale and offset of the
    block's two 16-element halves (one value each for the 32-element-block types)."""
    if MODE == 0:
        a0 = tl.where(ok, tl.load(d_rows + b).to(tl.float32), 0.0)
        return a0, a0, a0, a0
    elif MODE == 1:
        a0 = tl.where(ok, tl.load(d_rows + b).to(tl.float32), 0.0)
        c0 = tl.where(ok, tl.load(m_rows + b).to(tl.float32), 0.0)
        return a0, a0, c0, c0
    elif MODE == 2:
        scm = tl.load(d_rows + b).to(tl.int32)
        dd = tl.load(m_rows + b // 8)
        a0 = tl.where(ok, _half_f16(dd) * (scm & 0xFF).to(tl.float32), 0.0)
        c0 = tl.where(ok, -(_half_f16(dd >> 16) * ((scm >> 8) & 0xFF).to(tl.float32)), 0.0)
        return a0, a0, c0, c0
    elif MODE == 3:
        scs = tl.load(d_rows + b).to(tl.int32)
        d = tl.where(ok, tl.load(m_rows + b // 8).to(tl.float32), 0.0)
        a0 = d * ((scs << 24) >> 24).to(tl.float32)
        a1 = d * ((scs << 16) >> 24).to(tl.float32)
        return a0, a1, a0, a1
    elif MODE == 5:  # IQ4_XS: int8 ls - 32 per block, f16 d per super-block
        a0 = tl.where(ok, tl.load(m_rows + b // 8).to(tl.float32), 0.0) * tl.load(d_rows + b).to(tl.float32)
        return a0, a0, a0, a0
    elif MODE == 6:  # MXFP4: the E8M0 byte e per block, 2^(e - 128)
        a0 = tl.where(ok, e8m0_half(tl.load(d_rows + b).to(tl.int32)), 0.0)
        return a0, a0, a0, a0
    else:
        scs = tl.load(d_rows + b).to(tl.int32)
        dd = tl.load(m_rows + b // 8)
        d = tl.where(ok, _half_f16(dd), 0.0)
        dmin = tl.where(ok, _half_f16(dd >> 16), 0.0)
        a0 = d * (scs & 0xF).to(tl.float32)
        c0 = -(dmin * ((scs >> 4) & 0xF).to(tl.float32))
        a1 = d * ((scs >> 8) & 0xF).to(tl.float32)
        c1 = -(dmin * ((scs >> 12) & 0xF).to(tl.float32))
        return a0, a1, c0, c1


@triton.jit
def _i2f(i, magic):
    """int32 `i` (|i| < 2^22) as exact f32 in two full-rate ops; `magic` = the bits of 1.5 * 2^23."""
    return (i + magic).to(tl.float32, bitcast=True) - 12582912.0


@triton.jit
def _x_block(x_rows, b, xoff):
    """Block b of the tile's x rows quantized: (q int32 [BM, 32] in dot-position order, d_x [BM])."""
    x = tl.load(x_rows + b * 32 + xoff)
    amax = tl.max(tl.abs(x), axis=1)
    inv = tl.where(amax > 0, 127.0 / amax, 0.0)
    y = x * inv[:, None]
    q = (y + tl.where(y < 0, -0.5, 0.5)).to(tl.int32)  # round half away from zero (|y| <= 127)
    return q, amax * (1.0 / 127.0)


@triton.jit
def _mmq_kernel(
    x_ptr, lo_ptr, hi_ptr, d_ptr, m_ptr, out_ptr, part_ptr, cnt_ptr, M, N, K, NKB, M_STRIDE, M_BUCKET, KB_SPLIT,
    SPLIT, magic, t0, t1, t2, t3, sorted_ptr, bexp_ptr, XDIV, NEXP,
    LB: tl.constexpr, HB: tl.constexpr, CENTER: tl.constexpr, MODE: tl.constexpr, LUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KB: tl.constexpr, GROUP_M: tl.constexpr, EVEN: tl.constexpr,
    MOE: tl.constexpr = False,
):
    # program_id(0) -> (pid_m, pid_n) in groups of GROUP_M row tiles; program_id(1): the K split.
    # MOE (moe.py, no split): row tile pid_m is block pid_m of the rows sorted by expert (`moe_align`):
    # sorted_ptr holds its BLOCK_M slots (-1: padding), bexp_ptr its expert (NEXP: an unused block);
    # slot s reads x row s // XDIV and the expert's N rows of the stacked weight, and writes out row s.
    pid = tl.program_id(0)
    pid_m, pid_n, grid_m, grid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if MOE:
        expert = tl.load(bexp_ptr + pid_m)
        if expert >= NEXP:
            return
        slots = tl.load(sorted_ptr + offs_m)
        rows_m = tl.where(slots >= 0, slots // XDIV, 0).to(tl.int64)
        cols_n = tl.minimum(offs_n, N - 1).to(tl.int64) + expert.to(tl.int64) * N
    else:
        rows_m = tl.minimum(offs_m, M - 1).to(tl.int64)  # clamped loads, masked stores
        cols_n = tl.minimum(offs_n, N - 1).to(tl.int64)
    j = tl.arange(0, 4)[None, :, None]
    s = tl.arange(0, 8)[None, None, :]
    p = tl.arange(0, 32)
    x_rows = x_ptr + rows_m[:, None] * K
    if LUT:  # dot position p = 8 j + s holds element 8 (s % 4) + 4 (s / 4) + j
        xoff = (8 * (p % 4) + 4 * ((p % 8) // 4) + p // 8)[None, :]
    else:  # dot position p = 8 j + s holds element 4 s + j
        xoff = (4 * (p % 8) + p // 8)[None, :]
    lo_rows = lo_ptr + cols_n[:, None] * (NKB * 4)
    hi_rows = hi_ptr + cols_n[:, None] * (NKB * 4)
    d_rows = d_ptr + cols_n * NKB
    m_rows = m_ptr + cols_n * M_STRIDE
    HALVES: tl.constexpr = MODE == 3 or MODE == 4  # 16-element sub-blocks
    AFFINE: tl.constexpr = MODE == 1 or MODE == 2 or MODE == 4
    first_half = (p % 8 < 4)[None, :]  # slots 0..3: elements 0..15

    kb_lo = tl.program_id(1) * KB_SPLIT
    kb_hi = tl.minimum(kb_lo + KB_SPLIT, NKB)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb0 in range(kb_lo, kb_hi, KB):
        for u in tl.static_range(KB):
            if EVEN:
                b = kb0 + u
                ok = True
            else:  # past the end: the last block re-read (finite) with scales 0
                b = tl.minimum(kb0 + u, kb_hi - 1)
                ok = kb0 + u < kb_hi
            w = _w_codes(lo_rows, hi_rows, b, j, s, t0, t1, t2, t3, LB, HB, CENTER, LUT)
            q, dx = _x_block(x_rows, b, xoff)
            a0, a1, c0, c1 = _w_scales(d_rows, m_rows, b, ok, MODE)
            if HALVES:
                q0 = tl.where(first_half, q, 0)
                q1 = q - q0
                i0 = tl.dot(q0.to(tl.int8), w, out_dtype=tl.int32)
                i1 = tl.dot(q1.to(tl.int8), w, out_dtype=tl.int32)
                acc += (_i2f(i0, magic) * dx[:, None]) * a0[None, :]
                acc += (_i2f(i1, magic) * dx[:, None]) * a1[None, :]
                if AFFINE:
                    acc += (tl.sum(q0, axis=1).to(tl.float32) * dx)[:, None] * c0[None, :]
                    acc += (tl.sum(q1, axis=1).to(tl.float32) * dx)[:, None] * c1[None, :]
            else:
                isum = tl.dot(q.to(tl.int8), w, out_dtype=tl.int32)
                acc += (_i2f(isum, magic) * dx[:, None]) * a0[None, :]
                if AFFINE:
                    acc += (tl.sum(q, axis=1).to(tl.float32) * dx)[:, None] * c0[None, :]

    if MOE:
        mask = (slots[:, None] >= 0) & (offs_n[None, :] < N)
        at = slots.to(tl.int64)[:, None] * N + offs_n[None, :]
    else:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        at = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    if SPLIT > 1:
        # each program stores its partial sums (the tile's own BM x BN run of the scratch: unmasked,
        # one base pointer); the last of the tile's SPLIT programs to arrive (one acq_rel atomic per
        # program, after a barrier) adds them in split order and resets the tile's counter
        TILE: tl.constexpr = BLOCK_M * BLOCK_N
        local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tiles = grid_m * grid_n
        tl.store(part_ptr + (tl.program_id(1) * tiles + pid).to(tl.int64) * TILE + local, acc)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:
            total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for sp in range(0, SPLIT):  # L2 reads (.cg): other SMs wrote these
                total += tl.load(part_ptr + (sp * tiles + pid).to(tl.int64) * TILE + local, cache_modifier=".cg")
            tl.store(out_ptr + at, total, mask=mask)
            tl.atomic_xchg(cnt_ptr + pid, 0, sem="relaxed", scope="gpu")
    else:
        tl.store(out_ptr + at, acc, mask=mask)


# ---------------------------------------------------------------------------------------------
# configs


def _cfg(bm: int, bn: int, kb: int, warps: int, stages: int) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "KB": kb, "GROUP_M": 8}, num_warps=warps, num_stages=stages)


# (BLOCK_M, BLOCK_N, KB, warps, stages); `_prune` keeps the ones whose BLOCK_M fits M's bucket
MMQ_CONFIGS = [  # no register spills on sm_90 for any type (tests/kernels/triton/sm90_compile.py, triton 3.6.0, 3.7.1:
    # 32x128 and 128x64 tiles spilled 8 bytes on 3.7.1 for Q5_0 / Q5_K / Q2_K, so they are not offered)
    _cfg(16, 64, 2, 4, 4),
    _cfg(16, 128, 2, 4, 3),
    _cfg(32, 64, 2, 4, 4),
    _cfg(64, 64, 2, 8, 3),
    _cfg(64, 128, 1, 8, 3),
]


def _prune(configs, named_args, **kwargs):
    """Tiles as tall as M's bucket needs and at most 4x shorter (M rounded up to a power of two,
    at least 16): a decode batch of 4 tries the 16-row tiles, a 512-row chunk the 128-row ones."""
    cap = max(16, named_args["M_BUCKET"])
    fit = [c for c in configs if cap // 4 <= c.kwargs["BLOCK_M"] <= cap or c.kwargs["BLOCK_M"] == min(cap, 128)]
    return fit or [min(configs, key=lambda c: c.kwargs["BLOCK_M"])]


def _split(m_bucket: int, n: int, nkb: int, bm: int, bn: int, kb: int) -> tuple[int, int]:
    """(programs along K, blocks per program): K is split when the output tiles are fewer than
    TARGET_PROGRAMS, into at most MAX_SPLIT parts of at least two loop steps each."""
    tiles = cdiv(m_bucket, bm) * cdiv(n, bn)
    want = min(MAX_SPLIT, cdiv(TARGET_PROGRAMS, tiles), max(1, nkb // (2 * kb))) if tiles < TARGET_PROGRAMS else 1
    per = cdiv(cdiv(nkb, max(want, 1)), kb) * kb
    return cdiv(nkb, per), per


def _split_args(a: dict) -> tuple[int, int]:
    return _split(a["M_BUCKET"], a["N"], a["NKB"], a["BLOCK_M"], a["BLOCK_N"], a["KB"])


_mmq = triton.heuristics({
    "SPLIT": lambda a: _split_args(a)[0],
    "KB_SPLIT": lambda a: _split_args(a)[1],
    "EVEN": lambda a: _split_args(a)[1] % a["KB"] == 0 and a["NKB"] % _split_args(a)[1] == 0,
})(_mmq_kernel)
_mmq_tuned = triton.autotune(
    MMQ_CONFIGS,
    key=["M_BUCKET", "N", "K", "LB", "HB", "MODE", "LUT"],
    prune_configs_by={"early_config_prune": _prune},
    cache_results=True,  # on disk: a later process (the engine after bench/mmq_matmul.py) skips the timing
)(_mmq)


@functools.lru_cache(maxsize=512)
def _scratch_size(m: int, m_bucket: int, n: int, nkb: int, pinned: tuple | None) -> tuple[int, int]:
    """(partial-sum floats, arrival counters) the largest split of the configs a launch may take
    needs: each program's whole BM x BN tile of partial sums, per split."""
    if pinned is not None:
        configs = [pinned]
    else:
        configs = [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["KB"])
                   for c in _prune(MMQ_CONFIGS, {"M_BUCKET": m_bucket})]
    parts = tiles = 0
    for bm, bn, kb in configs:
        split, _ = _split(m_bucket, n, nkb, bm, bn, kb)
        if split > 1:
            t = cdiv(m, bm) * cdiv(n, bn)
            parts, tiles = max(parts, split * t * bm * bn), max(tiles, t)
    return parts, tiles


# ---------------------------------------------------------------------------------------------
# launcher


def _packed(what: str, w, n: int, k: int, qtype) -> GemvPacked:
    return packed_gemv(what, w, n, k, _plane_type(what, qtype, MMQ_TYPES))


def mmq_matmul(
    x: torch.Tensor,
    w: GemvPacked | torch.Tensor,
    n: int,
    k: int,
    qtype: GGMLType | int | str,
    out: torch.Tensor | None = None,
    config: dict | None = None,
    *,
    what: str = "mmq_matmul",
) -> torch.Tensor:
    """out [m, n] f32 = x @ W^T for m tokens: x f32 [m, k], W an [n, k] weight of any GEMV type in
    its packed layout (`qmatmul.repack_gemv`; raw GGUF bytes are repacked per call). x is
    quantized to int8 per 32 values inside the kernel; products on int8 tensor cores. `config`
    pins a launch (keys BLOCK_M, BLOCK_N, KB, GROUP_M, num_warps, num_stages); else autotuned."""
    w = _packed(what, w, n, k, qtype)
    check_tensor(what, "x", x, (torch.float32,), ndim=2)
    if x.shape[1] != k:
        raise UnsupportedError(f"{what}: x must be [m, {k}], got {tuple(x.shape)}")
    hi, m_plane, layout = kernel_planes(w)
    device = check_device(what, x=x, qs=w.qs, hi=hi, d=w.d, m=m_plane, out=out)
    m = x.shape[0]
    out = make_out(what, out, (m, n), torch.float32, device)
    if m == 0:
        return out
    nkb = k // 32
    m_bucket = triton.next_power_of_2(m)  # autotune per power-of-two M, not per prompt length
    if config is None and interpreting():  # nothing to time configs on: the first one pruning keeps
        c = _prune(MMQ_CONFIGS, {"M_BUCKET": m_bucket})[0]
        config = dict(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages)
    pinned = (config["BLOCK_M"], config["BLOCK_N"], config["KB"]) if config is not None else None
    n_parts, n_tiles = _scratch_size(m, m_bucket, n, nkb, pinned)
    part = torch.empty(n_parts, dtype=torch.float32, device=device) if n_parts else out
    counters = w.counters if w.counters is not None and w.counters.numel() >= n_tiles else None
    if counters is None:
        counters = torch.zeros(max(n_tiles, 1), dtype=torch.int32, device=device)
    args = (x, w.qs, hi, w.d, m_plane, out, part, counters, m, n, k, nkb, m_plane.shape[1], m_bucket)
    moe = {"sorted_ptr": counters, "bexp_ptr": counters, "XDIV": 1, "NEXP": 1}  # (unused off the MOE mode)

    def grid(meta):
        split, _ = _split(m_bucket, n, nkb, meta["BLOCK_M"], meta["BLOCK_N"], meta["KB"])
        return check_grid(what, (cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]), split))

    consts = dict(layout, magic=_MAGIC_I2F)
    if config is None:
        _mmq_tuned[grid](*args, **moe, **consts)
    else:
        _mmq[grid](*args, **moe, **consts, **config)
    return out


# the grouped expert matmul (moe.py moe_mmq): no split K (each program a whole row of K)
_mmq_moe = triton.heuristics({
    "SPLIT": lambda a: 1,
    "KB_SPLIT": lambda a: a["NKB"],
    "EVEN": lambda a: a["NKB"] % a["KB"] == 0,
})(_mmq_kernel)


def launch_mmq_moe(what: str, x: torch.Tensor, w: GemvPacked, out: torch.Tensor, n: int, k: int, table: tuple,
                   xdiv: int, n_expert: int, config: dict) -> None:
    """The MMQ kernel's MOE mode over a packed stack of `n_expert` experts of `n` rows (x, out and w
    checked by the caller): `table` = (sorted slots, block experts) of moe.moe_align with
    config["BLOCK_M"]-row blocks; one program per block and column tile, blocks of no expert exit."""
    sorted_slots, block_expert = table
    hi, m_plane, layout = kernel_planes(w)
    rows = sorted_slots.numel()
    grid = check_grid(what, (cdiv(rows, config["BLOCK_M"]) * cdiv(n, config["BLOCK_N"]),))
    _mmq_moe[grid](x, w.qs, hi, w.d, m_plane, out, out, block_expert, rows, n, k, k // 32, m_plane.shape[1],
                   rows, magic=_MAGIC_I2F, sorted_ptr=sorted_slots, bexp_ptr=block_expert, XDIV=xdiv,
                   NEXP=n_expert, MOE=True, **layout, **config)


def mmq_q4_0(x, w, n, k, qtype=GGMLType.Q4_0, out=None, config=None):
    """mmq_matmul for Q4_0 weights (the Q4_0Packed of `repack_q4_0`, shared with q4_0_gemv)."""
    _plane_type("mmq_q4_0", qtype, (GGMLType.Q4_0,))
    return mmq_matmul(x, w, n, k, qtype, out, config, what="mmq_q4_0")


def mmq_int4(x, w, n, k, qtype, out=None, config=None):
    """mmq_matmul for Q4_1 / Q4_K weights (the Int4Packed of `repack_int4`, shared with int4_gemv)."""
    _plane_type("mmq_int4", qtype, INT4_TYPES)
    return mmq_matmul(x, w, n, k, qtype, out, config, what="mmq_int4")


def mmq_q8_0(x, w, n, k, qtype=GGMLType.Q8_0, out=None, config=None):
    """mmq_matmul for Q8_0 weights (the PlanesPacked of `repack_planes`, shared with q8_0_gemv)."""
    _plane_type("mmq_q8_0", qtype, (GGMLType.Q8_0,))
    return mmq_matmul(x, w, n, k, qtype, out, config, what="mmq_q8_0")


def mmq_q6_k(x, w, n, k, qtype=GGMLType.Q6_K, out=None, config=None):
    """mmq_matmul for Q6_K weights (the PlanesPacked of `repack_planes`, shared with q6_k_gemv)."""
    _plane_type("mmq_q6_k", qtype, (GGMLType.Q6_K,))
    return mmq_matmul(x, w, n, k, qtype, out, config, what="mmq_q6_k")


def mmq_lut4(x, w, n, k, qtype, out=None, config=None):
    """mmq_matmul for IQ4_NL / IQ4_XS / MXFP4 weights (the Lut4Packed of `repack_lut4`, shared with lut4_gemv)."""
    _plane_type("mmq_lut4", qtype, LUT4_TYPES)
    return mmq_matmul(x, w, n, k, qtype, out, config, what="mmq_lut4")


LOW_BIT_PLANES = (GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q5_K, GGMLType.Q3_K, GGMLType.Q2_K)


def mmq_planes(x, w, n, k, qtype, out=None, config=None):
    """mmq_matmul for the other planes types Q5_0, Q5_1, Q5_K, Q3_K, Q2_K (the PlanesPacked of
    `repack_planes`, shared with their GEMVs)."""
    _plane_type("mmq_planes", qtype, LOW_BIT_PLANES)
    return mmq_matmul(x, w, n, k, qtype, out, config, what="mmq_planes")
