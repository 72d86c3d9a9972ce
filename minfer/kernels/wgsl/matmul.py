"""Launchers of the WGSL kernels (`wgsl/*.wgsl`), one per contract of `contracts/vulkan*.fkc.md`.

Each launcher, like the Triton ones: (1) checks its invariants, (2) allocates or takes `out`,
(3) computes the workgroup grid and records the dispatch on the tensors' device (wgpu_device.py;
it runs at the next flush). Tensors are `VkTensor`s, device buffers the backend owns.

Given torch tensors instead (the conformance harness, tests), a launcher runs on the process's
default Vulkan device: the inputs are uploaded, the kernel runs, the result comes back as a torch
tensor (into `out=` when given), and the caches an attention call writes are copied back too.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import weakref
from collections.abc import Callable

import torch

from ..config import env
from ..errors import UnsupportedError
from ..quant.types import GGMLType, by_name, quant_info
from .wgpu_device import ITEMSIZE, WGSL_DIR, VkTensor, default_device

REVISION_SOURCES = tuple(sorted(WGSL_DIR.glob("*.wgsl")))  # the shaders: editing one retires its judge numbers
WG = 64  # invocations per workgroup of the elementwise kernels
NORM_WG = 256  # rms_norm: 16 elements an invocation per round (4 quads, loads first): a 7B row in 1 round
ARGMAX_WG = 256  # argmax: 4 elements an invocation, a row over many workgroups, then a merge
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
# MINFER_VK_GEMV="kernel=qmv,TPR=32,NC=2" overrides fields (bench/vulkan_sweep.py).
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
GEMV_VARIANTS = [  # what bench/vulkan_sweep.py times (tests/backends/test_wgpu_kernels.py checks each); first: GEMV
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
ATTN_WG = 64
# attention: split over the context in chunks of >= CH positions (at most MAX_SPLIT chunks), WG
# invocations per chunk; split False: the single-pass kernel (one workgroup per head and row)
ATTN = {"split": True, "WG": 128, "CH": 64, "MAX_SPLIT": 32}
MAX_HEAD_DIM = 128  # past it both kernels are wrong on NVIDIA's driver (right on lavapipe): refused
MAX_GROUPS = 65535
QTYPES = {GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1,
          GGMLType.Q8_0, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K}


def _host_bridge(mutates: tuple[str, ...] = ()) -> Callable:
    """Launchers also take torch tensors: upload them, run, download the result (into `out`); the
    inputs named in `mutates` are copied back into the caller's tensors."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def launch(**kw):
            if not any(isinstance(v, torch.Tensor) for v in kw.values()):
                return fn(**kw)
            dev = default_device()
            out = kw.pop("out", None)
            dkw = {k: dev.upload(v) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
            res = dev.download(fn(**dkw))
            for name in mutates:
                if isinstance(kw.get(name), torch.Tensor):
                    kw[name].copy_(dev.download(dkw[name]).view(kw[name].dtype).view(kw[name].shape))
            if out is None:
                return res
            out.copy_(res.view(out.shape))
            return out

        launch.wgpu_device = default_device  # what the judge times this launcher's device calls on
        return launch

    return wrap


def _check(what: str, name: str, t, dtype: str, ndim: tuple[int, ...] | None = None, contiguous: bool = False) -> None:
    if not isinstance(t, VkTensor):
        raise UnsupportedError(f"{what}: {name} must be a device tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise UnsupportedError(f"{what}: {name} must be {dtype}, got {t.dtype}")
    if ndim is not None and len(t.shape) not in ndim:
        raise UnsupportedError(f"{what}: {name} must have rank {' or '.join(map(str, ndim))}, got {t.shape}")
    if contiguous and not t.contiguous:
        raise UnsupportedError(f"{what}: {name} must be contiguous")


def _out(what: str, out, like: VkTensor, shape: tuple[int, ...], dtype: str = "F32") -> VkTensor:
    if out is None:
        return like.dev.empty(shape, dtype)
    _check(what, "out", out, dtype, contiguous=True)
    if out.numel != math.prod(shape):
        raise UnsupportedError(f"{what}: out must hold {shape}, got {out.shape}")
    return out


def _rows(t: VkTensor) -> int:
    return t.shape[0] if len(t.shape) == 2 else 1


def _grid_2d(n: int, per_group: int) -> tuple[int, int]:
    """Workgroups (x, y) covering n items of per_group each, x below the 65535 limit."""
    groups = -(-n // per_group)
    y = -(-groups // MAX_GROUPS)
    return -(-groups // y), y


def _qinfo(what: str, qtype):
    q = by_name(qtype) if isinstance(qtype, str) else quant_info(qtype)
    if q.type not in QTYPES:
        raise UnsupportedError(f"{what}: storage type {q.name} has no WGSL decoder (have: "
                               f"{', '.join(sorted(t.name for t in QTYPES))})")
    return q


# ---- embedding gather / dequant -------------------------------------------------------------------


@_host_bridge()
def get_rows(weight_u8: VkTensor, ids: VkTensor, qtype, n_embd: int, out: VkTensor | None = None) -> VkTensor:
    """out [n_ids, n_embd] f32 = the table rows `ids` decoded (the embedding gather)."""
    what = "vk get_rows"
    q = _qinfo(what, qtype)
    _check(what, "weight_u8", weight_u8, "U8", contiguous=True)
    _check(what, "ids", ids, "I32", (1,), contiguous=True)
    row_bytes = q.nbytes(n_embd)
    n_rows = weight_u8.numel // row_bytes
    if n_rows * row_bytes != weight_u8.numel or weight_u8.offset:
        raise UnsupportedError(f"{what}: the table must be whole rows of {row_bytes} bytes from byte 0")
    n_ids = ids.numel
    out = _out(what, out, ids, (n_ids, n_embd))
    pipe = ids.dev.pipeline("get_rows", {"WG": WG}, q.name)
    ids.dev.dispatch(pipe, [weight_u8, ids, out], [n_embd, row_bytes, n_rows, out.offset],
                     (-(-n_embd // WG), n_ids))
    return out


@_host_bridge()
def dequant(raw_u8: VkTensor, qtype, rows: int, cols: int, out_dtype=torch.float32,
            out: VkTensor | None = None) -> VkTensor:
    """out [rows, cols] f32 = the GGUF blocks of raw_u8 decoded (seed 004's dequantizers)."""
    what = "vk dequant"
    q = _qinfo(what, qtype)
    if out_dtype != torch.float32:
        raise UnsupportedError(f"{what}: the WGSL dequantizer writes float32, not {out_dtype}")
    _check(what, "raw_u8", raw_u8, "U8", contiguous=True)
    row_bytes = q.nbytes(cols)
    if raw_u8.numel != rows * row_bytes or raw_u8.offset:
        raise UnsupportedError(f"{what}: raw_u8 must be exactly {rows} x {row_bytes} bytes from byte 0")
    out = _out(what, out, raw_u8, (rows, cols))
    y_rows, z = min(rows, MAX_GROUPS), -(-rows // MAX_GROUPS)
    pipe = raw_u8.dev.pipeline("dequant", {"WG": WG}, q.name)
    raw_u8.dev.dispatch(pipe, [raw_u8, out], [cols, row_bytes, rows, out.offset, 0], (-(-cols // WG), y_rows, z))
    return out


# ---- matmul ---------------------------------------------------------------------------------------


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


def gemv_from_env(base: dict) -> dict:
    """base with MINFER_VK_GEMV's fields, and qmv8 turned into qmv4 under MINFER_VK_Q8=0 (f32 x;
    NR QMV4_NR unless MINFER_VK_GEMV sets it)."""
    cfg = parse_variant(env("MINFER_VK_GEMV", ""), base)
    if not env("MINFER_VK_Q8", True) and cfg["kernel"] == "qmv8":
        cfg["kernel"] = "qmv4"
        if "NR" not in {item.partition("=")[0].strip() for item in env("MINFER_VK_GEMV", "").split(",")}:
            cfg["NR"] = QMV4_NR
    return cfg


GEMV.update(gemv_from_env(GEMV))


def q8_passes(g: dict | None = None) -> int:
    """The activation passes the matmuls of QMV8_TYPES read x in (0: f32 x, the kernel is not qmv8)."""
    g = GEMV if g is None else g
    return g["P8"] if g["kernel"] == "qmv8" else 0
for _item in filter(None, env("MINFER_VK_ATTN", "").split(",")):
    _key, _, _val = _item.partition("=")
    if _key not in ATTN:
        raise UnsupportedError(f"MINFER_VK_ATTN: unknown field {_key!r} (fields: {', '.join(ATTN)})")
    ATTN[_key] = bool(int(_val)) if _key == "split" else int(_val)


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


def q8_layout(passes: int) -> str:
    return f"q8_1x{passes}"


def q8_records(dev, rows: int, k: int, passes: int) -> VkTensor:
    """An empty buffer of x's int8 records (q8_act.wgsl): per row and 32-block 2 * passes + 1 16-byte words,
    in planes (word w of a row's block b at w * k / 32 + b)."""
    return dataclasses.replace(dev.empty((rows, k // 32 * (2 * passes + 1) * 16), "U8"), layout=q8_layout(passes))


@_host_bridge()
def quantize_q8_1(x: VkTensor, passes: int = 2) -> VkTensor:
    """x [m, k] f32 (row-strided) -> its int8 records (q8_act.wgsl): per 32-block the codes of
    `passes` passes (the second quantizes the first's rounding error) and (d, s = d * sum(codes))."""
    what = "vk quantize_q8_1"
    _check(what, "x", x, "F32", (1, 2))
    m, k = _rows(x), x.shape[-1]
    if k % 32 or passes not in (1, 2):
        raise UnsupportedError(f"{what}: x's rows must be a multiple of 32 long (got {k}), passes 1 or 2")
    out = q8_records(x.dev, m, k, passes)
    gx, gy = _grid_2d(m * (k // 4), WG)  # an invocation per 4 elements (q8_act.wgsl's q8_quad)
    x.dev.dispatch(x.dev.pipeline("q8_act+quantize_q8_1", {"WG": WG, "P8": passes}), [x, out],
                   [m, k, x.offset, x.stride, gx], (gx, gy))
    return out


def _q8_of(x: VkTensor, passes: int) -> VkTensor:
    """x's int8 records: the ones its producer wrote beside it (rms_norm / swiglu with q8), else
    quantized now (one dispatch)."""
    rec = getattr(x, "q8", None)
    if rec is not None and rec.layout == q8_layout(passes) and rec.shape == (_rows(x), x.shape[-1] // 32 *
                                                                          (2 * passes + 1) * 16):
        return rec
    return quantize_q8_1(x=x, passes=passes)


def _qmatmul(what: str, tm: int, x: VkTensor, w: VkTensor, n: int, k: int, qtype, out) -> VkTensor:
    q = _qinfo(what, qtype)
    _check(what, "x", x, "F32", (1, 2))
    _check(what, "w", w, "U8", contiguous=True)
    be = max(q.block_elems, 32)  # the float types are read in 32-element "blocks" too (q_f32.wgsl)
    if x.shape[-1] != k or k % be:
        raise UnsupportedError(f"{what}: x must be [m, {k}] with k a multiple of {be}, got {x.shape}")
    row_bytes = q.nbytes(k)
    g = GEMV
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
            xin = _q8_of(x, p8)
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
def qmatvec(x: VkTensor, w: VkTensor, n: int, k: int, qtype, out: VkTensor | None = None) -> VkTensor:
    """out [m, n] = x [m, k] @ dequant(w [n, k])^T, the decode GEMV (one pass over x per row of x)."""
    return _qmatmul("vk qmatvec", 1, x, w, n, k, qtype, out)


@_host_bridge()
def qmatmul_tiled(x: VkTensor, w: VkTensor, n: int, k: int, qtype, out: VkTensor | None = None) -> VkTensor:
    """out [m, n] = x [m, k] @ dequant(w [n, k])^T, tiled over 8 rows of x (prefill)."""
    return _qmatmul("vk qmatmul_tiled", TILED_TM, x, w, n, k, qtype, out)


# ---- norm, elementwise ----------------------------------------------------------------------------


@_host_bridge()
def rms_norm(x: VkTensor, w: VkTensor, eps: float, out: VkTensor | None = None, q8: int = 0) -> VkTensor:
    """out [rows, d] = x * rsqrt(mean(x^2) + eps) * w per row; x may be row-strided. q8 = 1 or 2
    (d a multiple of 32): out also carries its int8 records of q8 passes (`out.q8`, q8_act.wgsl),
    written by the same dispatch, for the qmv8 GEMV it feeds."""
    what = "vk rms_norm"
    _check(what, "x", x, "F32", (1, 2))
    _check(what, "w", w, "F32", (1,), contiguous=True)
    d = x.shape[-1]
    if w.numel != d:
        raise UnsupportedError(f"{what}: w must be [{d}], got {w.shape}")
    rows = _rows(x)
    if rows > MAX_GROUPS:
        raise UnsupportedError(f"{what}: {rows} rows exceed one dispatch")
    out = _out(what, out, x, x.shape)
    if q8 and d % 32 == 0:
        rec = q8_records(x.dev, rows, d, q8)
        pipe = x.dev.pipeline("rms_sumsq+q8_act+rms_norm_q8+norm_q8_main", {"WG": NORM_WG, "P8": q8})
        x.dev.dispatch(pipe, [x, w, _at(out), rec], [d, x.offset, x.stride, float(eps)],
                       (-(-d // (4 * NORM_WG)), rows))  # 4 elements an invocation: many workgroups a row
        out.q8 = rec
        return out
    pipe = x.dev.pipeline("rms_sumsq+rms_norm", {"WG": NORM_WG})
    x.dev.dispatch(pipe, [x, w, _at(out)], [d, x.offset, x.stride, float(eps)], (rows,))
    return out


@_host_bridge(mutates=("sum_out",))
def add_rms_norm(x: VkTensor, y: VkTensor, w: VkTensor, eps: float, out: VkTensor | None = None,
                 sum_out: VkTensor | None = None, q8: int = 0) -> VkTensor:
    """out [rows, d] = RMSNorm(h) per row and h = x + y written to `sum_out` (a fresh tensor, then
    dropped, when None): the residual add and the norm after it in one dispatch, h bit-equal to
    `add`'s and out (and with q8 its records, `out.q8`) to `rms_norm`'s of h. x, y contiguous.

    sum_out may not be x (nor share a buffer with x, y or out), unlike the cuda kernel's in-place
    residual: with q8 a row is split over workgroups that each read the row's whole x and y for
    the sum of squares, so one writing h over x could feed another's sum x + y + y; and WebGPU
    refuses a buffer bound read-only and read-write in one dispatch. The backend gives a fresh one."""
    what = "vk add_rms_norm"
    _check(what, "x", x, "F32", (1, 2), contiguous=True)
    _check(what, "y", y, "F32", (1, 2), contiguous=True)
    _check(what, "w", w, "F32", (1,), contiguous=True)
    d = x.shape[-1]
    if x.shape != y.shape or w.numel != d:
        raise UnsupportedError(f"{what}: x and y must both be [rows, {w.numel}] (w [d]), got {x.shape}, {y.shape}, "
                               f"w {w.shape}")
    if not (isinstance(eps, float | int) and eps >= 0):
        raise UnsupportedError(f"{what}: eps must be a number >= 0, got {eps!r}")
    rows = _rows(x)
    if rows > MAX_GROUPS:
        raise UnsupportedError(f"{what}: {rows} rows exceed one dispatch")
    out = _out(what, out, x, x.shape)
    sum_out = _out(what, sum_out, x, x.shape)
    if out.storage is sum_out.storage or any(o.storage is t.storage for o in (out, sum_out) for t in (x, y)):
        raise UnsupportedError(f"{what}: out and sum_out must be buffers of their own (not x's, y's or each other's)")
    params = [d, x.offset, y.offset, float(eps)]
    if q8 and d % 32 == 0:
        rec = q8_records(x.dev, rows, d, q8)
        pipe = x.dev.pipeline("add_norm_io+rms_sumsq+q8_act+add_rms_norm_q8+norm_q8_main", {"WG": NORM_WG, "P8": q8})
        x.dev.dispatch(pipe, [x, y, w, _at(out), _at(sum_out), rec], params, (-(-d // (4 * NORM_WG)), rows))
        out.q8 = rec
        return out
    pipe = x.dev.pipeline("add_norm_io+rms_sumsq+add_rms_norm", {"WG": NORM_WG})
    x.dev.dispatch(pipe, [x, y, w, _at(out), _at(sum_out)], params, (rows,))
    return out


def _at(out: VkTensor) -> VkTensor:
    """Kernels that write from element 0 of their output binding need an unshifted buffer."""
    if out.offset:
        raise UnsupportedError("vk: this kernel writes its output from element 0 (out= must not be a shifted view)")
    return out


@_host_bridge()
def add(x: VkTensor, y: VkTensor, out: VkTensor | None = None) -> VkTensor:
    """out = x + y, contiguous f32 of one shape."""
    what = "vk add"
    _check(what, "x", x, "F32", contiguous=True)
    _check(what, "y", y, "F32", contiguous=True)
    if x.shape != y.shape:
        raise UnsupportedError(f"{what}: x and y differ in shape: {x.shape} and {y.shape}")
    out = _out(what, out, x, x.shape)
    gx, gy = _grid_2d(x.numel, WG)
    x.dev.dispatch(x.dev.pipeline("add", {"WG": WG}), [x, y, _at(out)], [x.numel, x.offset, y.offset], (gx, gy))
    return out


@_host_bridge(mutates=("y",))
def add_bias(y: VkTensor, b: VkTensor, n_rows: int) -> VkTensor:
    """y[r, :] += b for the first n_rows rows of y (in place; returns y)."""
    what = "vk add_bias"
    _check(what, "y", y, "F32", (1, 2))
    _check(what, "b", b, "F32", (1,), contiguous=True)
    n = b.numel
    if y.shape[-1] != n or not 0 <= n_rows <= _rows(y):
        raise UnsupportedError(f"{what}: y must be [>= {n_rows}, {n}], got {y.shape}")
    y.dev.dispatch(y.dev.pipeline("add_bias", {"WG": WG}), [y, b], [n, y.offset, y.stride], (-(-n // WG), n_rows))
    return y


@_host_bridge()
def swiglu(gate: VkTensor, up: VkTensor, out: VkTensor | None = None, q8: int = 0) -> VkTensor:
    """out [rows, d] = silu(gate) * up; gate and up may be column slices of one matmul output.
    q8 = 1 or 2 (d a multiple of 32): out also carries its int8 records (`out.q8`, as rms_norm)."""
    what = "vk swiglu"
    _check(what, "gate", gate, "F32", (1, 2))
    _check(what, "up", up, "F32", (1, 2))
    if gate.shape != up.shape:
        raise UnsupportedError(f"{what}: gate and up differ in shape: {gate.shape} and {up.shape}")
    d, rows = gate.shape[-1], _rows(gate)
    out = _out(what, out, gate, gate.shape)
    params = [d, rows, gate.offset, gate.stride, up.offset, up.stride]
    if q8 and d % 32 == 0:
        rec = q8_records(gate.dev, rows, d, q8)
        gate.dev.dispatch(gate.dev.pipeline("q8_act+swiglu_q8", {"WG": WG, "P8": q8}), [gate, up, _at(out), rec],
                          params, (-(-d // (4 * WG)), rows))
        out.q8 = rec
        return out
    gate.dev.dispatch(gate.dev.pipeline("swiglu", {"WG": WG}), [gate, up, _at(out)], params, (-(-d // WG), rows))
    return out


@_host_bridge()
def row_select(x: VkTensor, rows: VkTensor, out: VkTensor | None = None) -> VkTensor:
    """out [n, width] = x[rows, :]; x may be row-strided."""
    what = "vk row_select"
    _check(what, "x", x, "F32", (2,))
    _check(what, "rows", rows, "I32", (1,), contiguous=True)
    width = x.shape[-1]
    out = _out(what, out, x, (rows.numel, width))
    x.dev.dispatch(x.dev.pipeline("row_select", {"WG": WG}), [x, rows, _at(out)], [width, x.offset, x.stride],
                   (-(-width // WG), rows.numel))
    return out


@_host_bridge()
def argmax(x: VkTensor, out: VkTensor | None = None) -> VkTensor:
    """out [rows] int32 = the index of each row's largest value (the first of equal ones)."""
    what = "vk argmax"
    _check(what, "x", x, "F32", (2,))
    rows, width = x.shape
    out = _out(what, out, x, (rows,), "I32")
    if rows > MAX_GROUPS:
        raise UnsupportedError(f"{what}: {rows} rows exceed one dispatch")
    groups = -(-width // (4 * ARGMAX_WG))  # workgroups a row, 4 elements an invocation
    if groups > MAX_GROUPS:
        raise UnsupportedError(f"{what}: a row of {width} exceeds one dispatch")
    params = [width, x.offset, x.stride, groups]
    if groups == 1:
        x.dev.dispatch(x.dev.pipeline("argmax_tree+argmax", {"WG": ARGMAX_WG, "FINAL": 1}), [x, _at(out)], params,
                       (1, rows))
        return out
    part = x.dev.empty((rows, 2 * groups), "I32")  # per workgroup (value bits, index)
    x.dev.dispatch(x.dev.pipeline("argmax_tree+argmax", {"WG": ARGMAX_WG, "FINAL": 0}), [x, part], params,
                   (groups, rows))
    x.dev.dispatch(x.dev.pipeline("argmax_tree+argmax_merge", {"WG": ARGMAX_WG}), [part, _at(out)], [groups], (rows,))
    return out


# ---- RoPE, attention ------------------------------------------------------------------------------


@_host_bridge()
def rope(x: VkTensor, positions: VkTensor, cos: VkTensor, sin: VkTensor, n_heads: int, head_dim: int, n_rot: int,
         neox: bool, out: VkTensor | None = None) -> VkTensor:
    """out [rows, n_heads * head_dim] = x rotated at `positions` by the cos/sin [n_ctx, n_rot/2] tables."""
    what = "vk rope"
    _check(what, "x", x, "F32", (2,))
    _check(what, "positions", positions, "I32", (1,), contiguous=True)
    for name, t in (("cos", cos), ("sin", sin)):
        _check(what, name, t, "F32", (2,), contiguous=True)
        if t.shape[1] != n_rot // 2:
            raise UnsupportedError(f"{what}: {name} must be [n_ctx, {n_rot // 2}], got {t.shape}")
    if x.shape[1] != n_heads * head_dim or head_dim % 2 or n_rot % 2 or n_rot > head_dim:
        raise UnsupportedError(f"{what}: x [rows, {n_heads} x {head_dim}] with an even n_rot <= head_dim, got "
                               f"{x.shape}, n_rot {n_rot}")
    rows = x.shape[0]
    out = _out(what, out, x, x.shape)
    pairs = n_heads * head_dim // 2
    x.dev.dispatch(x.dev.pipeline("rope", {"WG": WG}), [x, positions, cos, sin, _at(out)],
                   [n_heads, head_dim, n_rot, int(bool(neox)), x.offset, x.stride, rows], (-(-pairs // WG), rows))
    return out


@_host_bridge(mutates=("cache_k", "cache_v"))
def attention(q: VkTensor, k: VkTensor, v: VkTensor, cache_k: VkTensor, cache_v: VkTensor, row_slots: VkTensor,
              positions: VkTensor, layer: int, n_head: int, n_head_kv: int, head_dim: int, scale: float,
              spans=None, out: VkTensor | None = None, q8: int = 0) -> VkTensor:
    """Write each row's k, v at (its slot, its position) of layer `layer` of the f32 cache
    [layers, slots, n_kv, ctx, head_dim], then each row's causal GQA attention over positions
    0..its position of its slot. Two dispatches: every row's keys are written before any is read.
    q8 = 1 or 2: out also carries its int8 records (`out.q8`, as rms_norm), written by the split
    kernel's merge where it runs (head_dim a multiple of 32), else by a dispatch of their own."""
    what = "vk attention"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check(what, name, t, "F32", (2,))
    for name, t in (("cache_k", cache_k), ("cache_v", cache_v)):
        _check(what, name, t, "F32", (5,), contiguous=True)
    for name, t in (("row_slots", row_slots), ("positions", positions)):
        _check(what, name, t, "I32", (1,), contiguous=True)
    layers, slots, nkv, ctx, hd = cache_k.shape
    rows = q.shape[0]
    if (nkv, hd) != (n_head_kv, head_dim) or cache_v.shape != cache_k.shape or not 0 <= layer < layers:
        raise UnsupportedError(f"{what}: caches {cache_k.shape} / {cache_v.shape} do not hold layer {layer} of "
                               f"{n_head_kv} x {head_dim}")
    if q.shape[1] != n_head * hd or k.shape != (rows, nkv * hd) or v.shape != (rows, nkv * hd):
        raise UnsupportedError(f"{what}: q {q.shape}, k {k.shape}, v {v.shape} are not [{rows}, heads x {hd}]")
    if hd > MAX_HEAD_DIM:
        raise UnsupportedError(f"{what}: head_dim {hd} > {MAX_HEAD_DIM}: both attention kernels give wrong results "
                               "past 128 on NVIDIA's Vulkan driver (bench/NOTES.md, H200 runs 32-36), so it is refused")
    if n_head % n_head_kv or hd > 4 * ATTN_WG or row_slots.numel != rows or positions.numel != rows:
        raise UnsupportedError(f"{what}: {n_head} heads over {n_head_kv} kv heads, head_dim {hd} <= {4 * ATTN_WG}, "
                               "one slot and one position per row")
    base = cache_k.offset + layer * slots * nkv * ctx * hd
    if cache_v.offset != cache_k.offset:
        raise UnsupportedError(f"{what}: cache_k and cache_v must start at the same element")
    dev = q.dev
    dev.dispatch(dev.pipeline("kv_store", {"WG": WG}), [k, v, row_slots, positions, cache_k, cache_v],
                 [nkv, hd, ctx, base, k.offset, k.stride, v.offset, v.stride], (-(-(nkv * hd) // WG), rows))
    out = _out(what, out, q, (rows, n_head * hd))
    if not ATTN["split"] or hd % 4 or base % 4:  # one workgroup per (head, row) over every position
        dev.dispatch(dev.pipeline("attention", {"WG": ATTN_WG}), [q, cache_k, cache_v, row_slots, positions, _at(out)],
                     [n_head, nkv, hd, ctx, base, q.offset, q.stride, float(scale)], (n_head, rows))
        if q8 and (n_head * hd) % 32 == 0:
            out.q8 = quantize_q8_1(x=out, passes=q8)
        return out
    # split over the context: chunks of `ch` positions (a function of ctx alone: batch invariance),
    # each (head, row, chunk) a workgroup, then one merge per (head, row)
    tk = 1 << max(0, math.ceil(math.log2(-(-hd // 4))))
    wg = max(ATTN["WG"], tk)
    ch = max(ATTN["CH"], -(-ctx // ATTN["MAX_SPLIT"]))
    n_split = -(-ctx // ch)
    part = dev.empty((rows, n_head, n_split, hd + 2))
    dev.dispatch(dev.pipeline("attention_split", {"WG": wg, "TK": tk}),
                 [q, cache_k, cache_v, row_slots, positions, part],
                 [n_head, nkv, hd, ctx, base, q.offset, q.stride, float(scale), ch, n_split], (n_head, rows, n_split))
    if q8 and hd % 32 == 0:
        rec = q8_records(dev, rows, n_head * hd, q8)
        dev.dispatch(dev.pipeline("q8_act+merge_splits+attention_merge_q8", {"WG": ATTN_WG, "P8": q8}),
                     [part, positions, _at(out), rec], [n_head, hd, ch, n_split], (n_head, rows))
        out.q8 = rec
        return out
    dev.dispatch(dev.pipeline("merge_splits+attention_merge", {"WG": ATTN_WG}), [part, positions, _at(out)],
                 [n_head, hd, ch, n_split], (n_head, rows))
    if q8:
        out.q8 = quantize_q8_1(x=out, passes=q8)
    return out


# ---- quantize -------------------------------------------------------------------------------------


@_host_bridge()
def quantize_q8_0(x_f32: VkTensor, out: VkTensor | None = None) -> VkTensor:
    """out: the GGML Q8_0 blocks of contiguous f32 x (34 bytes per 32 values), [.., cols / 32 * 34] bytes."""
    what = "vk quantize_q8_0"
    _check(what, "x_f32", x_f32, "F32", contiguous=True)
    n = x_f32.numel
    if n % 32 or not x_f32.shape:
        raise UnsupportedError(f"{what}: the element count must be a multiple of 32, got {x_f32.shape}")
    n_blocks = n // 32
    shape = (*x_f32.shape[:-1], x_f32.shape[-1] // 32 * 34)
    if out is None:
        out = x_f32.dev.empty(shape, "U8")
    _check(what, "out", out, "U8", contiguous=True)
    if out.numel != n_blocks * 34 or out.offset:
        raise UnsupportedError(f"{what}: out must be {n_blocks * 34} bytes from byte 0")
    gx, gy = _grid_2d(-(-n_blocks // 2), WG)
    x_f32.dev.dispatch(x_f32.dev.pipeline("quantize_q8_0", {"WG": WG}), [x_f32, out], [n_blocks, x_f32.offset],
                       (gx, gy))
    return out


__all__ = ["ITEMSIZE", "add", "add_bias", "add_rms_norm", "argmax", "attention", "dequant", "get_rows", "qmatmul_tiled",
           "qmatvec", "quantize_q8_0", "quantize_q8_1", "rms_norm", "rope", "row_select", "swiglu"]
