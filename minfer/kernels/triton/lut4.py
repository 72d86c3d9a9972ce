"""The lookup layout (IQ4_NL, IQ4_XS, MXFP4) and its decode GEMV.

Each of these types stores a 4-bit code per weight that indexes a 16-entry table of int8 values
(`QuantInfo.lut`: kvalues_iq4nl, or MXFP4's doubled e2m1 values), times a scale per 32 weights.
`repack_lut4` keeps the file's bytes per weight (Lut4Packed): the codes as nibble words, 32-element
blocks of 4 words, and the scales as planes in their file form; `lut4_gemv` runs gemv.py's kernel
(LUT=True) on them. Per word the kernel looks the 8 codes up with byte permutes into two words of
table bytes (value + 128), which it multiplies as Q8_0's byte codes: exact values in f32 on f32
activations, or dp4a dots with the int8 activations of `quantize_act_q8` above Q8_MIN_WEIGHTS
(the Q4 types' rule), the offset -128 a per block through x's block sum.

Word order. Word j (0..3) of a block holds at bits 4 i (i = 0..3) the code of element 8 i + j and
at bits 16 + 4 i that of element 8 i + 4 + j: the order of the int8 activations' code words
(quantize.py: word j = elements 8 t + j, word 4 + j = elements 8 t + 4 + j), so each half-word's
4 table bytes meet their 4 activation codes in one dp4a, with no byte shuffle after the lookup.
The MMQ matmul (mmq.py) reads the same words.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ...errors import UnsupportedError
from ...quant.types import QUANT_TABLE, GGMLType, by_name
from ._common import check_tensor
from .gemv import (
    _REPACK_CHUNK,
    ACT_Q8_PASSES,
    GemvConfig,
    MoeLaunch,
    _check_nk,
    _gemv_scratch,
    _launch_gemv,
    _settled,
    _split_scratch,
    check_act_q8,
    gemv_config,
    gemv_operands,
)

REVISION_SOURCES = (str(Path(__file__).with_name("gemv.py")),)  # the GEMV kernel: editing it retires judge numbers

LUT4_TYPES = (GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.MXFP4)
# the scale form (gemv._lut_scale's MODE): 0 f16 d per block; 5 int8 ls - 32 per block + f16 d per
# super-block; 6 the E8M0 byte per block
LUT4_MODES = {GGMLType.IQ4_NL: 0, GGMLType.IQ4_XS: 5, GGMLType.MXFP4: 6}
_SCALE_DTYPES = {GGMLType.IQ4_NL: torch.float16, GGMLType.IQ4_XS: torch.int8, GGMLType.MXFP4: torch.uint8}


def table_words(qtype: GGMLType) -> tuple[int, int, int, int]:
    """A lookup type's 16 values + 128 as 4 int32 words (byte b of word w: code 4 w + b), the
    registers the kernels' byte permutes read."""
    values = [(v + 128) & 0xFF for v in QUANT_TABLE[qtype].lut]
    words = [sum(values[4 * w + b] << (8 * b) for b in range(4)) for w in range(4)]
    return tuple(w - (1 << 32) if w >= 1 << 31 else w for w in words)


@dataclass(frozen=True)
class Lut4Packed:
    """An IQ4_NL / IQ4_XS / MXFP4 [n, k] weight in the lookup layout (`repack_lut4`; the module
    doc gives the word order): `qs` int32 [n, k/8] code words; `d` [n, k/32] the block scales as
    the file has them (IQ4_NL: f16 d; IQ4_XS: int8 ls - 32; MXFP4: uint8 E8M0 exponent); `m`
    IQ4_XS's super-block f16 d [n, k/256] (the other types: `d` again, unused). The file's bytes
    per weight (0.5625, 0.53; IQ4_XS 0.539 against 0.531: its 6-bit scales a byte each)."""

    qtype: GGMLType
    qs: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor
    n: int
    k: int
    counters: torch.Tensor
    partials: torch.Tensor
    act_q8: int = ACT_Q8_PASSES  # the int8 activation passes of its default GEMV config (EngineConfig.gemv_q8)

    def __post_init__(self):
        """Checked once, when made: a plane of the wrong dtype or size would be misread, not refused."""
        what = f"Lut4Packed[{self.qtype.name}]"
        if self.qtype not in LUT4_TYPES:
            raise UnsupportedError(f"{what}: not a lookup type ({', '.join(t.name for t in LUT4_TYPES)})")
        _check_nk(what, self.n, self.k)
        if self.k % QUANT_TABLE[self.qtype].block_elems:
            raise UnsupportedError(f"{what}: k must be a multiple of {QUANT_TABLE[self.qtype].block_elems}, "
                                   f"got {self.k}")
        check_tensor(what, "qs", self.qs, (torch.int32,))
        check_tensor(what, "d", self.d, (_SCALE_DTYPES[self.qtype],))
        if self.qs.numel() != self.n * self.k // 8 or self.d.numel() != self.n * self.k // 32:
            raise UnsupportedError(f"{what}: qs / d must hold {self.n * self.k // 8} words / {self.n * self.k // 32} "
                                   f"scales for [{self.n}, {self.k}], got {self.qs.numel()} / {self.d.numel()}")
        if self.qtype == GGMLType.IQ4_XS:
            check_tensor(what, "m", self.m, (torch.float16,))
            if self.m.numel() != self.n * self.k // 256:
                raise UnsupportedError(f"{what}: m must hold {self.n * self.k // 256} super-block scales")
        if len({t.device for t in (self.qs, self.d, self.m)}) != 1:
            raise UnsupportedError(f"{what}: planes must be on one device")

    @property
    def mode(self) -> int:
        return LUT4_MODES[self.qtype]

    @property
    def table(self) -> tuple[int, int, int, int]:
        return table_words(self.qtype)

    @property
    def nbytes(self) -> int:
        planes = (self.qs, self.d, None if self.m is self.d else self.m)
        return sum(t.numel() * t.element_size() for t in planes if t is not None)

    def scratch(self, splits: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _split_scratch(self, splits, tiles)


def lut4_type(what: str, qtype, allowed=LUT4_TYPES) -> GGMLType:
    """The GGMLType of `qtype` when it is one of `allowed`, else UnsupportedError naming them."""
    try:
        t = by_name(qtype).type if isinstance(qtype, str) else GGMLType(qtype)
    except (UnsupportedError, ValueError):
        t = None
    if t not in allowed:
        raise UnsupportedError(f"{what}: reads {', '.join(a.name for a in allowed)} weights, got qtype {qtype!r}")
    return t


def _codes_and_scales(t: GGMLType, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """For `b` [blocks, block_bytes] of lookup type t: (codes [blocks * block_elems / 32, 32] in
    element order, the d plane's values per 32-element block, IQ4_XS's f16 d per super-block)."""
    from ...quant.reference import iq4_xs_scales, nibbles

    n = b.shape[0]
    if t == GGMLType.IQ4_XS:
        codes = nibbles(b[:, 8:136].reshape(n, 8, 16)).reshape(n * 8, 32)
        return codes, iq4_xs_scales(b).reshape(-1), b[:, 0:2].contiguous().view(torch.float16).reshape(-1)
    if t == GGMLType.IQ4_NL:
        return nibbles(b[:, 2:18]).reshape(n, 32), b[:, 0:2].contiguous().view(torch.float16).reshape(-1), None
    return nibbles(b[:, 1:17]).reshape(n, 32), b[:, 0].contiguous(), None


def lut_words(codes: torch.Tensor) -> torch.Tensor:
    """[blocks, 32] codes 0..15 in element order -> int32 [blocks, 4] lookup words: word j holds
    element 8 i + 4 h + j at bit 4 (4 h + i) (i = 0..3, h = 0..1; the module doc's order)."""
    c = codes.to(torch.int64).view(-1, 4, 2, 4)  # [block, i, h, j]: element 8 i + 4 h + j
    shifts = (4 * (4 * torch.arange(2).view(1, 2, 1) + torch.arange(4).view(4, 1, 1))).to(codes.device)
    word = (c << shifts).sum(dim=(1, 2))
    return (word - ((word >> 31) << 32)).to(torch.int32)


def repack_lut4(raw: torch.Tensor, n: int, k: int, qtype: GGMLType | int | str,
                act_q8: int = ACT_Q8_PASSES) -> Lut4Packed:
    """Raw GGUF bytes of an IQ4_NL / IQ4_XS / MXFP4 [n, k] weight -> the kernels' Lut4Packed, on
    raw's device (in chunks of blocks, so the int64 temporaries stay bounded); `act_q8`: the int8
    activation passes its GEMV takes x in."""
    what = "repack_lut4"
    t = lut4_type(what, qtype)
    info = QUANT_TABLE[t]
    _check_nk(what, n, k)
    if k % info.block_elems:
        raise UnsupportedError(f"{what}: {info.name} needs k a multiple of {info.block_elems}, got {k}")
    check_tensor(what, "raw", raw, (torch.uint8,))
    n_blocks = n * k // info.block_elems
    if raw.numel() != n_blocks * info.block_bytes:
        raise UnsupportedError(f"{what}: {info.name} [{n}, {k}] needs {n_blocks * info.block_bytes} bytes, "
                               f"got {raw.numel()}")
    blocks, dev, per = raw.reshape(n_blocks, info.block_bytes), raw.device, info.block_elems // 32
    qs = torch.empty(n * k // 32, 4, dtype=torch.int32, device=dev)
    d = torch.empty(n * k // 32, dtype=_SCALE_DTYPES[t], device=dev)
    m = torch.empty(n_blocks if t == GGMLType.IQ4_XS else 0, dtype=torch.float16, device=dev)
    step = max(1, _REPACK_CHUNK // per)
    for start in range(0, n_blocks, step):
        stop = min(start + step, n_blocks)
        codes, dd, mm = _codes_and_scales(t, blocks[start:stop])
        qs[start * per:stop * per] = lut_words(codes)
        d[start * per:stop * per] = dd
        if mm is not None:
            m[start:stop] = mm
    d = d.view(n, k // 32)
    m = m.view(n, k // 256) if t == GGMLType.IQ4_XS else d
    counters, partials = _gemv_scratch(n, k, dev, affine=True)
    return _settled(Lut4Packed(t, qs.view(n, k // 8), d, m, n, k, counters, partials, check_act_q8(act_q8)))


def lut4_config(n: int, k: int, act_q8: int = ACT_Q8_PASSES) -> GemvConfig:
    """The lookup types' config: the affine Q4 types' tile (`gemv_config(n, k, affine=True)`: the
    lookup adds work per weight as their offsets do), int8 activations above Q8_MIN_WEIGHTS."""
    return gemv_config(n, k, True, act_q8)


def lut4_gemv(
    x: torch.Tensor,
    w: Lut4Packed | torch.Tensor,
    n: int,
    k: int,
    qtype: GGMLType | int | str,
    out: torch.Tensor | None = None,
    config: GemvConfig | dict | None = None,
    *,
    xq: tuple | None = None,
    rstd: tuple | None = None,
) -> torch.Tensor:
    """out [1, n] f32 = x @ W^T for one token, W an IQ4_NL / IQ4_XS / MXFP4 [n, k] weight: a
    Lut4Packed (fast path) or raw GGUF bytes (repacked per call). `config`, `xq` and `rstd` as q4_0_gemv's."""
    what = "lut4_gemv"
    t = lut4_type(what, qtype)
    if not isinstance(w, Lut4Packed):
        if not isinstance(w, torch.Tensor):
            raise UnsupportedError(f"{what}: w must be a Lut4Packed or raw GGUF bytes, got {type(w).__name__}")
        w = repack_lut4(w, n, k, t)
    if (w.n, w.k, w.qtype) != (n, k, t):
        raise UnsupportedError(f"{what}: w is a packed {w.qtype.name} [{w.n}, {w.k}], the call says {t.name} "
                               f"[{n}, {k}]")
    out, cfg = gemv_operands(what, x, w.qs, n, k, out, config, lambda: lut4_config(n, k, w.act_q8))
    launch_lut4(what, x, w, out, cfg, xq=xq, rstd=rstd)
    return out


def launch_lut4(what: str, x: torch.Tensor, w: Lut4Packed, out: torch.Tensor, cfg: GemvConfig,
                epilogue: tuple | None = None, xq: tuple | None = None, moe: MoeLaunch | None = None,
                rstd: tuple | None = None) -> None:
    """Launch the GEMV kernel on a Lut4Packed weight (x, out checked by the caller; `moe`: gemv.py)."""
    n = w.n if moe is None else moe.rows
    _launch_gemv(what, x, w, w.d, w.m, w.m.shape[1], w.mode, out, n, w.k, cfg, epilogue=epilogue, xq=xq,
                 lut=w.table, moe=moe, rstd=rstd)
