"""The WGSL matmuls (vk_qmatvec*, vk_matmul*_tiled: matmul.fkc.md): the decode GEMV and the tiled
prefill matmul of every weight type, their launch variants (`GEMV`) and the Q4_0 / Q4_1 planes
layout the qmv4 / qmv8 variants read."""

from __future__ import annotations

import dataclasses
import weakref

import torch

from ...errors import UnsupportedError
from ...quant.types import GGMLType, quant_info
from ._common import MAX_GROUPS, SHADERS, WG, VkTensor, _check, _grid_2d, _host_bridge, _qinfo, _rows, default_device
from .quantize import _q8_of

REVISION_SOURCES = SHADERS
# The matmuls' launch variants. "qmatmul" (every type): TPR invocations per output column, each
# walking whole blocks (b = t, t + TPR, ...), WG / TPR columns per workgroup. "qmv" (Q4_0, Q4_1,
# Q8_0: QMV_TYPES): TPR invocations per NC columns, 4 per block (a quarter each: coalesced loads of
# W and of x, x loaded once for the NC columns), U iterations unrolled; NC halves (down to 1) while
# the grid would have fewer than MIN_GROUPS workgroups. The decode GEMV (TM 1) and the tiled prefill
# matmul (TM 8 rows of x per workgroup) run the same variant, so a row's sums are the same sequence
# in both (batch invariance: TM, NC, U and WG change no bit; TPR and the kernel do).
# LF 1: the decode GEMV's full iterations loads-first (qmv.wgsl; no bit changes). KIT > 0: TPR
# doubles (up to WG) while a lane would walk more than KIT iterations of a row (7B down, k 18944:
# TPR 128 at KIT 24): more lanes, so more loads in flight, for a long row; a function of k only.
# "qmv4" (Q4_0; the other qmv types run qmv): the weight repacked once into planes (q4_0_planes:
# a block's 16 quant bytes one 16-byte load, the f16 scales a plane of their own), lane t of a
# group of TPR4 taking whole blocks b = t, t + TPR4, ... of NR rows, x's 32 values per block loaded
# once for the NR rows; TPR4 doubles (up to WG) while a lane would walk more than KIT4 blocks of a
# row, NR halves (down to 1) while the grid would have fewer than MIN_GROUPS workgroups.
# "qmv8" (Q4_0 and Q4_1: QMV8_TYPES; Q8_0 runs qmv): qmv4's planes, grid and walk with x quantized
# to int8 per 32-block (q8_act.wgsl: P8 passes, the second quantizing the first's rounding error)
# and 8 dot4I8Packed per block and pass; U8 blocks per lane loaded before any is used. The norms,
# SwiGLU and attention feeding such a GEMV write x's int8 records beside their f32 output (the
# backend asks them to: no dispatch of its own); any other x is quantized by a dispatch first
# (quantize_q8_1).
# MINFER_VK_Q8=0 turns qmv8 into qmv4 (f32 activations) at run 35's NR 4 (QMV4_NR) unless
# MINFER_VK_GEMV names NR.
# MINFER_VK_GEMV="kernel=qmv,TPR=32,NC=2" overrides fields (bench/studies/vulkan_sweep.py).
# qmv8's wide rows (n >= WIDE; WIDE 0: none): TPR4W lanes a row group and KIT4W in place of TPR4
# and KIT4 (a function of (n, k): the GEMV and the tiled matmul of a weight still agree).
# Default: qmv8 with two passes at NR 1 (the H200 sweep of 2026-12-01, bench/NOTES.md "seventh
# session": NR 1 the fastest qmv8 variant on all five 7B shapes, o equal; NR 4 was the guess), and
# per shape (round 2's sweep): TPR4 16 on the wide rows (gate_up 37888: 39.0 µs vs 42.9 at 32;
# vocab 152064: 136.6 vs 156.2), 32 on the others (qkv 8.9 vs 10.6, o 7.9 vs 10.3; down equal).
GEMV = {"kernel": "qmv8", "WG": 128, "TPR": 32, "NC": 2, "U": 4, "MIN_GROUPS": 528, "LF": 0, "KIT": 24,  # qmv types
        "TPR4": 32, "NR": 1, "KIT4": 8,  # qmv4 (Q4_0) and qmv8 (Q4_0, Q4_1)
        "P8": 2, "U8": 1,  # qmv8: activation passes, blocks per lane loaded at once
        "WIDE": 16384, "TPR4W": 16, "KIT4W": 8,  # qmv8's wide rows
        "A_WG": 128, "A_TPR": 16}  # the others: qmatmul.wgsl
QMV4_NR = 4  # qmv4's rows per lane group under MINFER_VK_Q8=0 (run 35's best)
TILED_TM = 8
RUN30_VARIANT = "kernel=qmatmul,A_WG=128,A_TPR=16"  # what bench/NOTES.md's run 30 measured
RUN32_DEFAULT = "kernel=qmv,WG=128,TPR=32,NC=2,U=2,LF=0,KIT=0"  # run 32's default and best (bench/NOTES.md)
RUN32_BEST = "kernel=qmv,WG=128,TPR=64,NC=2,U=2,LF=0,KIT=0"
RUN33_BEST = "kernel=qmv,WG=128,TPR=32,NC=2,U=4,LF=0,KIT=24"  # run 33's best
RUN35_BEST = "kernel=qmv4,WG=128,TPR4=32,NR=4,KIT4=8"  # run 35's best (the default until qmv8)
SEVENTH_DEFAULT = "kernel=qmv8,WG=128,TPR4=32,NR=4,KIT4=8,P8=2,U8=1,WIDE=0"  # qmv8's first default (NR 4)
_Q8 = "kernel=qmv8,WG=128,TPR4=32,NR=1,KIT4=8"
ROUND2_DEFAULT = _Q8 + ",P8=2,U8=1,WIDE=0"  # round 2's default: TPR4 32 on every shape
_W = ",WIDE=16384,TPR4W=16,KIT4W=8"  # the wide rows' default
# what bench/studies/vulkan_sweep.py times (tests/backends/test_wgpu_kernels.py checks each); the first is GEMV
GEMV_VARIANTS = [
    _Q8 + ",P8=2,U8=1" + _W, RUN35_BEST, RUN33_BEST, RUN30_VARIANT, SEVENTH_DEFAULT, ROUND2_DEFAULT,
    _Q8 + ",P8=1,U8=1" + _W, _Q8 + ",P8=1,U8=1,WIDE=0",  # one pass (5e-3: not the default) per shape and not
    # the wide rows: 8 lanes (14 blocks a lane at k 3584; KIT4W 16 keeps them), 16 rows a workgroup of 256
    _Q8 + ",P8=2,U8=1,WIDE=16384,TPR4W=8,KIT4W=16", "kernel=qmv8,WG=256,TPR4=32,NR=1,KIT4=8,P8=2" + _W,
    # qkv / o (launch- and latency-bound at 8-9 µs): 64 lanes a row (1.75 blocks a lane); 2 rows a lane group
    "kernel=qmv8,WG=128,TPR4=64,NR=1,KIT4=8,P8=2" + _W, "kernel=qmv8,WG=128,TPR4=32,NR=2,KIT4=8,P8=2" + _W,
    # round 2's runners-up, re-measured: loads before use, 64-invocation workgroups
    _Q8 + ",P8=2,U8=2" + _W, "kernel=qmv8,WG=64,TPR4=32,NR=1,KIT4=8,P8=2" + _W,
    # x's records in planes (coalesced x loads): 16 lanes a row everywhere; 2 rows a lane group loading 2 blocks
    "kernel=qmv8,WG=128,TPR4=16,NR=1,KIT4=8,P8=2,WIDE=0", "kernel=qmv8,WG=128,TPR4=32,NR=2,KIT4=8,P8=2,U8=2" + _W]
QMV_TYPES = {GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0}
QMV8_TYPES = {GGMLType.Q4_0, GGMLType.Q4_1}


def parse_variant(text: str, base: dict) -> dict:
    """base with the fields of "name=value,name=value" (ints, or the kernel's name) replaced."""
    cfg = dict(base)
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, _, val = item.partition("=")
        if key not in base:
            raise UnsupportedError(f"vk matmul variant: unknown field {key!r} (fields: {', '.join(base)})")
        cfg[key] = val if key == "kernel" else int(val)
    if cfg["kernel"] not in ("qmv8", "qmv4", "qmv", "qmatmul"):
        raise UnsupportedError(f"vk matmul variant: kernel {cfg['kernel']!r} is not qmv8, qmv4, qmv or qmatmul")
    if (cfg["TPR"] % 4 or cfg["WG"] % cfg["TPR"] or cfg["A_WG"] % cfg["A_TPR"] or cfg["WG"] % cfg["TPR4"]
            or cfg["WG"] % cfg["TPR4W"]):
        raise UnsupportedError(f"vk matmul variant {cfg}: TPR must be a multiple of 4 dividing WG, TPR4 and TPR4W "
                               "divide WG")
    if cfg["NR"] < 1 or cfg["NR"] & (cfg["NR"] - 1):
        raise UnsupportedError(f"vk matmul variant {cfg}: NR must be a power of two")
    if cfg["P8"] not in (1, 2) or cfg["U8"] < 1:
        raise UnsupportedError(f"vk matmul variant {cfg}: P8 (activation passes) must be 1 or 2, U8 >= 1")
    return cfg


def gemv_variant(text: str = "", q8: bool = True) -> dict:
    """GEMV with the fields of `text` ("name=value,...": EngineConfig.vk_gemv, MINFER_VK_GEMV), and
    qmv8 turned into qmv4 when not `q8` (EngineConfig.vk_q8 False: f32 x; NR QMV4_NR unless the
    text sets it). The backend hands it to its device (`Device.gemv`), where the launchers read it."""
    cfg = parse_variant(text, GEMV)
    if not q8 and cfg["kernel"] == "qmv8":
        cfg["kernel"] = "qmv4"
        if "NR" not in {item.partition("=")[0].strip() for item in text.split(",")}:
            cfg["NR"] = QMV4_NR
    return cfg


def variant_passes(g: dict | None = None) -> int:
    """The activation passes a variant's matmuls of QMV8_TYPES read x in (0: f32 x, not qmv8)."""
    g = GEMV if g is None else g
    return g["P8"] if g["kernel"] == "qmv8" else 0


def q8_passes(n: int, k: int, qtype, variant: dict | None = None, **_) -> int:
    """The int8-record passes the matmuls read x in for an [n, k] weight of `qtype` under `variant`
    (the device's GEMV settings; 0: f32 x): the contracts' `caps.q8_passes`, what a producer of x
    may write for them (backends/compile.py pairs the two)."""
    if k % 32 or _qinfo("vk q8_passes", qtype).type not in QMV8_TYPES:
        return 0
    return variant_passes(variant)


def planes_layout(w: VkTensor, n: int, k: int, qtype, variant: dict | None = None) -> VkTensor:
    """A matmul weight's load layout (the contracts' `load_layout`): the planes qmv4 / qmv8 read for
    Q4_0 / Q4_1 under the variant that reads them (made once at load, on the device), else w."""
    g = GEMV if variant is None else variant
    t = _qinfo("vk planes_layout", qtype).type
    if (g["kernel"] == "qmv8" and t in QMV8_TYPES) or (g["kernel"] == "qmv4" and t == GGMLType.Q4_0):
        if isinstance(w, torch.Tensor):  # host bytes (the conformance harness): laid out on the default device
            w = default_device().upload(w)
        return planes(w, n, k, t)
    return w


def qmv_lanes(g: dict, k: int) -> int:
    """The qmv lanes per column for a row of k elements: TPR, doubled (up to WG) while a lane would
    walk more than KIT iterations (KIT 0: never). A function of k alone, so the decode GEMV and
    the tiled prefill matmul of one weight agree (batch invariance)."""
    tpr, its = g["TPR"], -(-k // 32)
    while g["KIT"] and tpr < g["WG"] and g["WG"] % (2 * tpr) == 0 and -(-its // (tpr // 4)) > g["KIT"]:
        tpr *= 2
    return tpr


def qmv4_lanes(g: dict, k: int, n: int = 0) -> int:
    """qmv4's / qmv8's lanes per row group for n rows of k elements: TPR4 (qmv8's wide rows, n >=
    WIDE: TPR4W), doubled (up to WG) while a lane would walk more than KIT4 (KIT4W) blocks (0:
    never); a function of (n, k) alone (batch invariance)."""
    wide = g["kernel"] == "qmv8" and g["WIDE"] and n >= g["WIDE"]
    tpr, kit, nb = g["TPR4W"] if wide else g["TPR4"], g["KIT4W"] if wide else g["KIT4"], -(-k // 32)
    while kit and tpr < g["WG"] and g["WG"] % (2 * tpr) == 0 and -(-nb // tpr) > kit:
        tpr *= 2
    return tpr


PLANES = "q4_0_planes"
PLANES_Q4_1 = "q4_1_planes"
PLANE_LAYOUTS = {PLANES: GGMLType.Q4_0, PLANES_Q4_1: GGMLType.Q4_1}
_PLANES_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # raw storage -> its planes


def planes_bytes(n_blocks: int, qtype=GGMLType.Q4_0) -> int:
    """Bytes of the planes of n_blocks Q4_0 / Q4_1 blocks: 16 per block, then the scale words (Q4_0:
    two f16 scales to a word; Q4_1: one (d, m) word per block), 16-byte padded."""
    scale_words = -(-n_blocks // 2) if qtype == GGMLType.Q4_0 else n_blocks
    return -(-(16 * n_blocks + 4 * scale_words) // 16) * 16


def q4_0_planes(w: VkTensor, n: int, k: int) -> VkTensor:
    """Q4_0 GGUF bytes [n, k / 32 * 18] (from byte 0) repacked on the device into the planes qmv4
    and qmv8 read (repack_q4_0.wgsl): the quant plane (16 bytes per block, rows one after another),
    then the f16 scales two to a word. Recorded like any dispatch (not inside a captured step)."""
    return planes(w, n, k, GGMLType.Q4_0)


def planes(w: VkTensor, n: int, k: int, qtype) -> VkTensor:
    """Q4_0 or Q4_1 GGUF bytes [n, k / 32 * block_bytes] (from byte 0) repacked on the device: the
    quant plane (a block's 16 quant bytes one 16-byte word), then the scale plane (Q4_0: the f16
    scales two to a word, repack_q4_0.wgsl; Q4_1: each block's (d, m) word, repack_q4_1.wgsl)."""
    q = quant_info(qtype)
    nblk = n * (k // 32)
    if w.numel != nblk * q.block_bytes or w.offset or k % 32 or q.type not in QMV8_TYPES:
        raise UnsupportedError(f"vk planes: w must be {n} rows of {k // 32 * q.block_bytes} bytes of Q4_0 / Q4_1 "
                               f"from byte 0 (got {w.numel} bytes of {q.name})")
    out = w.dev.empty((planes_bytes(nblk, q.type),), "U8")
    if q.type == GGMLType.Q4_0:
        gx, gy = _grid_2d(-(-nblk // 2), WG)
        pipe, layout = w.dev.pipeline("quant_common+repack_planes+repack_q4_0", {"WG": WG}), PLANES
    else:
        gx, gy = _grid_2d(nblk, WG)
        pipe, layout = w.dev.pipeline("repack_planes+repack_q4_1", {"WG": WG}), PLANES_Q4_1
    w.dev.dispatch(pipe, [w, out], [nblk, 4 * nblk, gx], (gx, gy))
    return dataclasses.replace(out, layout=layout)


def _planes_of(w: VkTensor, n: int, k: int, qtype) -> VkTensor:
    """w's planes: w itself when repacked, else a repack cached for w's buffer (tests, the harness,
    the sweep hand raw bytes; the backend repacks its weights at load)."""
    if w.layout in PLANE_LAYOUTS:
        if w.numel != planes_bytes(n * (k // 32), PLANE_LAYOUTS[w.layout]) or w.offset:
            raise UnsupportedError(f"vk qmatvec: planes of {w.numel} bytes do not hold a [{n}, {k}] "
                                   f"{PLANE_LAYOUTS[w.layout].name} weight")
        return w
    hit = _PLANES_CACHE.get(w.storage)
    if hit is None or hit[0] != (n, k, qtype):
        hit = _PLANES_CACHE[w.storage] = ((n, k, qtype), planes(w, n, k, qtype))
    return hit[1]


def _qmatmul(what: str, tm: int, x: VkTensor, w: VkTensor, n: int, k: int, qtype, out, xq=None) -> VkTensor:
    q = _qinfo(what, qtype)
    _check(what, "x", x, "F32", (1, 2))
    _check(what, "w", w, "U8", contiguous=True)
    be = max(q.block_elems, 32)  # the float types are read in 32-element "blocks" too (q_f32.wgsl)
    if x.shape[-1] != k or k % be:
        raise UnsupportedError(f"{what}: x must be [m, {k}] with k a multiple of {be}, got {x.shape}")
    row_bytes = q.nbytes(k)
    g = x.dev.gemv or GEMV
    if w.layout in PLANE_LAYOUTS or (g["kernel"] == "qmv8" and q.type in QMV8_TYPES) or (
            g["kernel"] == "qmv4" and q.type == GGMLType.Q4_0):
        if w.layout in PLANE_LAYOUTS and PLANE_LAYOUTS[w.layout] != q.type:
            raise UnsupportedError(f"{what}: a {w.layout} weight is {PLANE_LAYOUTS[w.layout].name}, not {q.name}")
        w = _planes_of(w, n, k, q.type)
    elif w.numel != n * row_bytes or w.offset:
        raise UnsupportedError(f"{what}: w must be {n} rows of {row_bytes} bytes ({q.name}) from byte 0")
    m = _rows(x)
    shape = (m, n) if len(x.shape) == 2 else (n,)
    if out is None:
        out = x.dev.empty(shape)
    else:  # a contiguous [m, n], or the columns of a wider [m, n_total] output (one type's part of a fused weight)
        _check(what, "out", out, "F32")
        if out.numel != m * n:
            raise UnsupportedError(f"{what}: out must hold {shape}, got {out.shape}")
    aligned = x.offset % 4 == 0 and x.stride % 4 == 0  # rows of x start on 16 bytes: vec4 loads of x
    xs = "qmatmul_x4" if aligned else "qmatmul_x"
    xin = x
    if w.layout in PLANE_LAYOUTS:  # qmv8 (Q4_1 always; Q4_0 unless the kernel is qmv4), else qmv4
        tpr, nr = qmv4_lanes(g, k, n), g["NR"]
        while nr > 1 and -(-n // (g["WG"] // tpr * nr)) < g["MIN_GROUPS"]:
            nr //= 2
        cols_per_group = g["WG"] // tpr * nr
        if w.layout == PLANES and g["kernel"] != "qmv8":
            pipe = x.dev.pipeline(f"{xs}+qmv_planes+qmv4", {"WG": g["WG"], "TPR": tpr, "NR": nr, "TM": tm})
        else:
            p8 = g["P8"]
            xin = _q8_of(x, p8, xq)
            pipe = x.dev.pipeline("qmv_planes+qmv8", {"WG": g["WG"], "TPR": tpr, "NR": nr, "TM": tm, "P8": p8,
                                                      "U": g["U8"], "QT": 0 if w.layout == PLANES else 1})
        row_bytes = 4 * n * (k // 32)  # the scale plane's first word (Params.d_off)
    elif g["kernel"] in ("qmv", "qmv4", "qmv8") and q.type in QMV_TYPES:
        tpr = qmv_lanes(g, k)
        nc = g["NC"]
        while nc > 1 and -(-n // (g["WG"] // tpr * nc)) < g["MIN_GROUPS"]:
            nc //= 2
        cfg = {"WG": g["WG"], "TPR": tpr, "NC": nc, "U": g["U"], "TM": tm, "LF": g["LF"] if tm == 1 else 0}
        cols_per_group = g["WG"] // tpr * nc
        pipe = x.dev.pipeline(f"{xs}+part_{q.name.lower()}+qmv", cfg, q.name)
    else:
        cfg = {"WG": g["A_WG"], "TPR": g["A_TPR"], "TM": tm}
        cols_per_group = g["A_WG"] // g["A_TPR"]
        pipe = x.dev.pipeline(f"{xs}+qmatmul", cfg, q.name, dot=True)
    gx, gz = _grid_2d(n, cols_per_group)
    gy = -(-m // tm)
    if gy > MAX_GROUPS:
        raise UnsupportedError(f"{what}: {m} rows exceed one dispatch ({MAX_GROUPS * tm})")
    out_stride = out.stride if len(out.shape) == 2 else n
    x.dev.dispatch(pipe, [w, xin, out], [m, n, k, x.offset, x.stride, out.offset, out_stride, row_bytes, gx],
                   (gx, gy, gz))
    return out


@_host_bridge()
def qmatvec(x: VkTensor, w: VkTensor, n: int, k: int, qtype, out: VkTensor | None = None,
            xq: VkTensor | None = None) -> VkTensor:
    """out [m, n] = x [m, k] @ dequant(w [n, k])^T, the decode GEMV (one pass over x per row of x);
    `xq`: x's int8 records written by the node before it (qmv8), else made here when needed."""
    return _qmatmul("vk qmatvec", 1, x, w, n, k, qtype, out, xq)


@_host_bridge()
def qmatmul_tiled(x: VkTensor, w: VkTensor, n: int, k: int, qtype, out: VkTensor | None = None,
                  xq: VkTensor | None = None) -> VkTensor:
    """out [m, n] = x [m, k] @ dequant(w [n, k])^T, tiled over 8 rows of x (prefill); `xq` as qmatvec's."""
    return _qmatmul("vk qmatmul_tiled", TILED_TM, x, w, n, k, qtype, out, xq)
