"""The int4 affine layout (Q4_1, Q4_K) and its decode GEMV.

`repack_int4` keeps Q4_0Packed's nibble words (32-element blocks in element order) and the
block's affine form w = a * nibble + c as planes (Int4Packed); `int4_gemv` runs gemv.py's kernel
(MODE 1: Q4_1, 2: Q4_K) on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ...errors import UnsupportedError
from ...quant.types import QUANT_TABLE, GGMLType, by_name
from ._common import (
    check_tensor,
)
from .gemv import (
    ACT_Q8_PASSES,
    GemvConfig,
    MoeLaunch,
    _check_nk,
    _gemv_scratch,
    _launch_gemv,
    _pack_words,
    _settled,
    _split_scratch,
    check_act_q8,
    gemv_config,
    gemv_operands,
)

REVISION_SOURCES = (str(Path(__file__).with_name("gemv.py")),)  # the GEMV kernel: editing it retires judge numbers


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
    act_q8: int = ACT_Q8_PASSES  # the int8 activation passes of its default GEMV config (EngineConfig.gemv_q8)

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


def repack_int4(raw: torch.Tensor, n: int, k: int, qtype: GGMLType | int | str,
                act_q8: int = ACT_Q8_PASSES) -> Int4Packed:
    """Raw GGUF Q4_1 / Q4_K bytes of an [n, k] weight -> the GEMV's Int4Packed, on raw's device
    (`act_q8`: the int8 activation passes its GEMV takes x in)."""
    from ...quant.reference import nibbles, scale_min_k4  # the reference codec's field unpackers

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
    return _settled(Int4Packed(t, qs.view(n, nkb * 4), d, m, n, k, counters, partials, check_act_q8(act_q8)))


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
    rstd: tuple | None = None,
) -> torch.Tensor:
    """out [1, n] f32 = x @ W^T for one token, W a Q4_1 or Q4_K [n, k] weight: q4_0_gemv's tile
    and loop with the block's affine scale (w = a * nibble + c); `w` an Int4Packed or raw bytes;
    `xq` and `rstd` as for q4_0_gemv."""
    what = "int4_gemv"
    t = _int4_type(what, qtype)
    if not isinstance(w, Int4Packed):
        w = repack_int4(w, n, k, t)
    if (w.n, w.k, w.qtype) != (n, k, t):
        raise UnsupportedError(f"{what}: w is a packed {w.qtype.name} [{w.n}, {w.k}], the call says {t.name} "
                               f"[{n}, {k}]")
    out, cfg = gemv_operands(what, x, w.qs, n, k, out, config, lambda: gemv_config(n, k, True, w.act_q8))
    launch_int4(what, x, w, out, cfg, xq=xq, rstd=rstd)
    return out


def launch_int4(what: str, x: torch.Tensor, w: Int4Packed, out: torch.Tensor, cfg: GemvConfig,
                epilogue: tuple | None = None, xq: tuple | None = None, moe: MoeLaunch | None = None,
                rstd: tuple | None = None) -> None:
    """Launch the GEMV kernel on an Int4Packed weight (x, out checked by the caller; `moe`: gemv.py)."""
    n = w.n if moe is None else moe.rows
    _launch_gemv(what, x, w, w.d, w.m, w.m.shape[1], w.mode, out, n, w.k, cfg, epilogue=epilogue, xq=xq,
                 moe=moe, rstd=rstd)
