"""Quantized weight x f32 activation matmuls (seed 004 QMATMUL pair), by weight layout:

- q4_0.py: the Q4_0 layout, its decode GEMV (`q4_0_gemv`) and prefill matmul (`q4_0_matmul`);
- int4.py: Q4_1 / Q4_K in the affine int4 layout (`int4_gemv`);
- planes.py: Q8_0, Q5_x, Q6_K, Q3_K, Q2_K in the planes layout (`q8_0_gemv` ... `q2_k_gemv`);
- lut4.py: IQ4_NL, IQ4_XS, MXFP4 (4-bit codes through a table) in the lookup layout (`lut4_gemv`);
- gemv.py: the GEMV kernel all four run, its configs (`gemv_config`) and launch.

This module: any GEMV type (`repack_gemv`, `launch_packed`, ...), what the fused GEMVs
(gemv_fused.py), the MMQ matmuls (mmq.py) and the backend need to run the kernel on any layout.
"""

from __future__ import annotations

import torch

from ...errors import UnsupportedError
from ...quant.types import GGMLType
from .gemv import ACT_Q8_PASSES, GemvConfig, MoeLaunch, gemv_config
from .int4 import INT4_TYPES, Int4Packed, launch_int4, repack_int4
from .lut4 import LUT4_TYPES, Lut4Packed, launch_lut4, lut4_config, repack_lut4
from .planes import PLANE_TYPES, PlanesPacked, _plane_type, launch_planes, planes_config, repack_planes
from .q4_0 import Q4_0Packed, launch_q4_0, repack_q4_0

GEMV_TYPES = (GGMLType.Q4_0, *INT4_TYPES, *PLANE_TYPES, *LUT4_TYPES)
GemvPacked = Q4_0Packed | Int4Packed | PlanesPacked | Lut4Packed
Q8_TYPES = (GGMLType.Q4_0, *INT4_TYPES, *LUT4_TYPES)  # the GEMVs that read x as int8 above Q8_MIN_WEIGHTS


def gemv_type(what: str, qtype) -> GGMLType:
    """The GGMLType of `qtype` (type, ggml id or name) when the GEMV reads it, else UnsupportedError."""
    return _plane_type(what, qtype, GEMV_TYPES)


def repack_gemv(raw: torch.Tensor, n: int, k: int, qtype: GGMLType, act_q8: int = ACT_Q8_PASSES) -> GemvPacked:
    """Raw GGUF bytes of an [n, k] weight of any GEMV type -> that type's GEMV layout (`act_q8`:
    the int8 activation passes of the Q4 and lookup types' GEMV)."""
    if qtype == GGMLType.Q4_0:
        return repack_q4_0(raw, n, k, act_q8)
    if qtype in INT4_TYPES:
        return repack_int4(raw, n, k, qtype, act_q8)
    if qtype in LUT4_TYPES:
        return repack_lut4(raw, n, k, qtype, act_q8)
    return repack_planes(raw, n, k, qtype)


def packed_gemv(what: str, w, n: int, k: int, t: GGMLType) -> GemvPacked:
    """`w` as a packed GEMV weight of type `t` and shape [n, k]: raw GGUF bytes repacked, a packed one
    checked (the launchers that read the plain GEMV layout: mmq, gemv_fused.gemv_add_norm)."""
    if isinstance(w, torch.Tensor):
        return repack_gemv(w, n, k, t)
    if not isinstance(w, (Q4_0Packed, Int4Packed, PlanesPacked, Lut4Packed)):
        raise UnsupportedError(f"{what}: w must be a packed GEMV weight (Q4_0Packed, Int4Packed, PlanesPacked, "
                               f"Lut4Packed) or raw GGUF bytes, got {type(w).__name__}")
    wt = GGMLType.Q4_0 if isinstance(w, Q4_0Packed) else w.qtype
    if (w.n, w.k, wt) != (n, k, t):
        raise UnsupportedError(f"{what}: w is a packed {wt.name} [{w.n}, {w.k}], the call says {t.name} [{n}, {k}]")
    return w


def gemv_default_config(n: int, k: int, qtype: GGMLType, act_q8: int = ACT_Q8_PASSES) -> GemvConfig:
    """The config the type's own GEMV launches an [n, k] weight with (`act_q8` as repack_gemv's)."""
    if qtype == GGMLType.Q4_0:
        return gemv_config(n, k, False, act_q8)
    if qtype in INT4_TYPES:
        return gemv_config(n, k, True, act_q8)
    if qtype in LUT4_TYPES:
        return lut4_config(n, k, act_q8)
    return planes_config(n, k, qtype)


def launch_packed(what: str, x: torch.Tensor, w: GemvPacked, out: torch.Tensor, cfg: GemvConfig,
                  epilogue: tuple | None = None, xq: tuple | None = None, moe: MoeLaunch | None = None,
                  rstd: tuple | None = None) -> None:
    """Launch the GEMV kernel on a packed weight of any GEMV type (x, out checked by the caller).
    `xq`: x already quantized (quantize_act_q8's (codes, scales), e.g. by the RMSNorm before it),
    used when the config takes int8 activations of as many passes. `moe`: the expert mode (gemv.py
    MoeLaunch: w stacks experts; one launch runs every slot's expert, moe.py). `rstd`: x is a deferred
    RMSNorm's h * w (gemv.py _launch_gemv)."""
    if isinstance(w, Q4_0Packed):
        launch_q4_0(what, x, w, out, cfg, epilogue, xq, moe, rstd)
    elif isinstance(w, Int4Packed):
        launch_int4(what, x, w, out, cfg, epilogue, xq, moe, rstd)
    elif isinstance(w, Lut4Packed):
        launch_lut4(what, x, w, out, cfg, epilogue, xq, moe, rstd)
    else:
        launch_planes(what, x, w, out, cfg, epilogue, moe, rstd)


def q8_passes(n: int, k: int, qtype: GGMLType | int | str, act_q8: int = ACT_Q8_PASSES, **_) -> int:
    """The int8 activation passes the decode GEMVs read x in for an [n, k]
    weight of `qtype` on its default config (0: f32 x): what the node before them may write
    (the contracts' `caps.q8_passes`; the compiler pairs the two, backends/compile.py)."""
    try:
        t = gemv_type("q8_passes", qtype)
    except UnsupportedError:
        return 0
    return gemv_default_config(n, k, t, act_q8).q8 if t in Q8_TYPES else 0
