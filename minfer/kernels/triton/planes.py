"""The planes layout (Q8_0, Q5_0, Q5_1, Q5_K, Q6_K, Q3_K, Q2_K) and its decode GEMVs.

These types run gemv.py's GEMV kernel on a second layout, `repack_planes` ("planes",
PLANES=True): each weight's unsigned code split into a low plane (nibble words as Q4_0Packed's,
or int16 words of eight 2-bit slots) and a high plane of its other bits (int8 / int16 words of
eight slots, indexed like the nibble words; Q8_0: whole byte codes, a block's first and last 16
in the two planes), scales in planes of their own: about the file's bytes per weight. The kernel
assembles each code exactly in f32 from its two fields (gemv.py's `_code`, `_planes_block`).
`planes_config` picks the tile; the planes types keep f32 activations.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ...errors import UnsupportedError
from ...quant.types import QUANT_TABLE, GGMLType, by_name
from . import gemv  # (gemv._gemv_config looked up per call: tests patch it)
from ._common import (
    check_tensor,
)
from .gemv import (
    _REPACK_CHUNK,
    WIDE_ROWS,
    GemvConfig,
    MoeLaunch,
    _check_nk,
    _gemv_scratch,
    _launch_gemv,
    _settled,
    _split_scratch,
    gemv_operands,
)

REVISION_SOURCES = (str(Path(__file__).with_name("gemv.py")),)  # the GEMV kernel: editing it retires judge numbers


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
    from ...quant.reference import _bits, _qh_bits, nibbles, scale_min_k4

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
    rstd: tuple | None = None,
) -> torch.Tensor:
    """out [1, n] f32 = x @ W^T for one token, W a planes-type [n, k] weight (`PLANE_TYPES`):
    q4_0_gemv's tile, loop and split K, each code assembled from its planes exactly in f32 and
    the block's scales (and offsets) applied once per 16- or 32-element sub-block; `w` a
    PlanesPacked or raw GGUF bytes (repacked per call); `rstd` as q4_0_gemv's."""
    t = _plane_type(what, qtype, allowed)
    if not isinstance(w, PlanesPacked):
        if not isinstance(w, torch.Tensor):
            raise UnsupportedError(f"{what}: w must be a PlanesPacked or raw GGUF bytes, got {type(w).__name__}")
        w = repack_planes(w, n, k, t)
    if (w.n, w.k, w.qtype) != (n, k, t):
        raise UnsupportedError(f"{what}: w is a packed {w.qtype.name} [{w.n}, {w.k}], the call says {t.name} "
                               f"[{n}, {k}]")
    out, cfg = gemv_operands(what, x, w.lo, n, k, out, config, lambda: planes_config(n, k, t))
    launch_planes(what, x, w, out, cfg, rstd=rstd)
    return out


@functools.lru_cache(maxsize=256)
def planes_config(n: int, k: int, qtype: GGMLType) -> GemvConfig:
    """A planes type's config: the affine Q4 types' (`gemv_config(n, k, affine=True)`: the same
    tile, with more work per weight), at the register caps the sm_90 compile check finds free of
    spills: prefetching tiles 168 registers, except Q5_1 / Q5_K (the high words and the offsets
    do not fit beside the prefetched words: 48-96 bytes of spills at 168-232), which load each
    step's words in the step (128 registers), as wide Q6_K weights do (the 8B's output head; H200 run 38).
    The planes types keep f32 activations (q8 = 0)."""
    cfg = replace(gemv._gemv_config(n, k, True), q8=0)  # f32 activations: no int8 path for these types
    if not cfg.prefetch:
        return cfg
    if qtype == GGMLType.Q6_K and n >= WIDE_ROWS:  # the 8B's output head: 170.9 vs 190.0 µs (H200 run 38)
        return replace(cfg, prefetch=False, maxnreg=128)
    if PLANE_TYPES[qtype].mode in (1, 2):
        return replace(cfg, prefetch=False, maxnreg=128)
    return replace(cfg, maxnreg=PLANES_REGS)


PLANES_REGS = 168


def q8_0_gemv(x, w, n, k, qtype=GGMLType.Q8_0, out=None, config=None, *, rstd=None):
    """planes_gemv for Q8_0 weights (its contract: 1.0625 bytes per weight)."""
    return planes_gemv(x, w, n, k, qtype, out, config, what="q8_0_gemv", allowed=(GGMLType.Q8_0,), rstd=rstd)


def q6_k_gemv(x, w, n, k, qtype=GGMLType.Q6_K, out=None, config=None, *, rstd=None):
    """planes_gemv for Q6_K weights (0.82 bytes per weight)."""
    return planes_gemv(x, w, n, k, qtype, out, config, what="q6_k_gemv", allowed=(GGMLType.Q6_K,), rstd=rstd)


def q5_gemv(x, w, n, k, qtype, out=None, config=None, *, rstd=None):
    """planes_gemv for the 5-bit types Q5_0, Q5_1, Q5_K (0.69-0.75 bytes per weight)."""
    return planes_gemv(x, w, n, k, qtype, out, config, what="q5_gemv",
                       allowed=(GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q5_K), rstd=rstd)


def q3_k_gemv(x, w, n, k, qtype=GGMLType.Q3_K, out=None, config=None, *, rstd=None):
    """planes_gemv for Q3_K weights (0.43 bytes per weight in the file, 0.45 repacked)."""
    return planes_gemv(x, w, n, k, qtype, out, config, what="q3_k_gemv", allowed=(GGMLType.Q3_K,), rstd=rstd)


def q2_k_gemv(x, w, n, k, qtype=GGMLType.Q2_K, out=None, config=None, *, rstd=None):
    """planes_gemv for Q2_K weights (0.33 bytes per weight)."""
    return planes_gemv(x, w, n, k, qtype, out, config, what="q2_k_gemv", allowed=(GGMLType.Q2_K,), rstd=rstd)


def launch_planes(what: str, x: torch.Tensor, w: PlanesPacked, out: torch.Tensor, cfg: GemvConfig,
                  epilogue: tuple | None = None, moe: MoeLaunch | None = None, rstd: tuple | None = None) -> None:
    """Launch the GEMV kernel on a PlanesPacked weight (x, out checked by the caller; `moe`, `rstd`: gemv.py)."""
    pt = PLANE_TYPES[w.qtype]
    hi = w.hi if w.hi is not None else w.lo
    n = w.n if moe is None else moe.rows
    _launch_gemv(what, x, w, w.d, w.m, w.m.shape[1], pt.mode, out, n, w.k, cfg, (hi, pt.lb, pt.hb, pt.center),
                 epilogue, moe=moe, rstd=rstd)
