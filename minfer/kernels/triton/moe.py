"""Mixture-of-experts kernels (graph/ir.py MoERoute, MoEMatMul, MoESum; contracts in moe.fkc.md).

    route:   (weights [T, k], ids [T, k]) = top-k of gating(logits [T, E]) (+ selection bias)
    experts: out[t, j] = x[t] (or x[t, j]) @ W[ids[t, j]]^T,  W the 3-D expert tensor [E, N, K]
    sum:     out[t] = sum_j weights[t, j] * y[t, j]

The ids never leave the device: the expert GEMV reads them in the kernel, so a decode step stays
one CUDA graph with no host sync, and one launch runs every chosen expert of every row of a layer.

- `moe_route_rows`: one program per row holds the row's E logits (E <= 1024, llama.cpp's limit),
  computes the gating in f32 (softmax, sigmoid, or the logits themselves for gpt-oss's
  softmax-over-the-chosen), adds the selection bias for the choice only, and picks the k largest
  one at a time (the lower expert index first among equal values, as the cpu reference's stable
  sort), then softmaxes (gpt-oss), normalises (sum clamped at 2^-14, llama.cpp's) and scales.
- `moe_gemv`: gemv.py's GEMV kernel (every GEMV type: Q4_0, Q4_1, Q4_K, Q5_x, Q6_K, Q8_0, Q3_K,
  Q2_K) over the expert tensor packed as one [E * N, K] weight (`repack_experts`, the GEMV
  layouts of q4_0.py / int4.py / planes.py: the file's bytes, E blocks of N rows), its MOE mode:
  program column s is slot s = t * k + j, reading expert ids[s]'s rows and x row t (x [T, K]:
  gate and up) or s (x [T, k, K]: down). A slot reads only its expert's bytes.
- `moe_matmul_f16`: float expert tensors (F32 / F16 / BF16 files: the tiny test models) on an f16
  copy (`f16_experts`), one program per (slot, block of N rows), f32 sums.
- expert biases (gpt-oss's ffn_*_exps.bias, `bias=` f32 [E * N]: the `expert_bias` capability):
  out[t, j] += bias[ids[t, j]] with the ids read on the device: in the store of `moe_matmul_f16`
  and of the GEMV (`moe_gemv`: its MOE_BIAS constexpr), and for the MMQ kernel (shared with every
  dense matmul) by `_expert_bias_kernel` launched right after it by the same launcher (one more
  launch per prompt chunk; no host sync, CUDA-graph safe).
- `moe_sum_rows`: the weighted sum of a row's k expert outputs, in slot order (as llama.cpp adds
  its experts' views).

- `moe_mm16`: many rows (prompt chunks, batches past 32 rows) grouped by expert: the slots sorted
  by expert on the device (`moe_align`: one one-program kernel, no host sync, shapes fixed by the
  row count; made once per layer, `aligned`), each expert's run padded to whole row blocks, and
  per block and column tile the expert's weights dequantized in the kernel to f16 and multiplied
  on f16 tensor cores (a block of no expert exits at once), so an expert's weights are read once
  per block of its rows instead of once per slot. Decode rows and batches up to 32 take
  `moe_gemv` (faster there: one slot's expert rows streamed per program).
- `moe_gemv_glu`, `moe_mm16_glu` (graph/ir.py MoEMatMulGLU): a layer's gate and up expert matmuls and
  the GLU after them (SwiGLU, or gpt-oss's clamped form with its biases) in one launch, on one packed
  weight stacking the gate experts, then the up experts (`repack_glu_experts`): the GEMV kernel's
  MOE_GLU mode (a tile's rows are gate rows and the same up rows; the fused GEMVs' pair epilogue
  stores the GLU) and moe_mm16's GLU mode (two dots a step on one x tile).
- `moe_mmq`: the same grouping with mmq.py's int8 tensor-core kernel in its MOE mode (x quantized
  per 32 in the kernel): slower than `moe_mm16` (H200: 1.8 against 0.6 ms for a 512-token prompt's
  gate), kept for its arithmetic (llama.cpp's 8-bit activations) and picked only when pinned.
"""

from __future__ import annotations

import functools
import weakref

import torch
import triton
import triton.language as tl

from ...errors import UnsupportedError
from ...quant.types import GGMLType, by_name, quant_info
from ._common import (
    cdiv,
    check_device,
    check_grid,
    check_int,
    check_tensor,
    make_out,
    pdl_args,
    release_next,
    swiglu_oai_f32,
    wait_prior,
)
from .gemv import GemvConfig, MoeLaunch, _lut_bytes, check_act_q8, glu_epilogue
from .lut4 import LUT4_TYPES
from .mmq import MMQ_CONFIGS, _w_scales, kernel_planes, launch_mmq_moe
from .planes import PLANE_TYPES
from .qmatmul import GEMV_TYPES, GemvPacked, gemv_type, launch_packed, repack_gemv

GATINGS = {"softmax": 0, "sigmoid": 1, "softmax_weight": 2}
MAX_EXPERTS = 1024
MAX_USED = 64
FLOAT_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)


# ---------------------------------------------------------------------------------------------
# routing


@triton.jit
def _route_kernel(l_ptr, b_ptr, w_ptr, id_ptr, E, L_STRIDE, scale, K: tl.constexpr, KB: tl.constexpr,
                  BLOCK_E: tl.constexpr, GATING: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr):
    release_next(PDL)
    wait_prior(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)
    ok = offs < E
    x = tl.load(l_ptr + row * L_STRIDE + offs, mask=ok, other=0.0).to(tl.float32)
    if GATING == 0:
        m = tl.max(tl.where(ok, x, float("-inf")), axis=0)
        ex = tl.where(ok, tl.exp(x - m), 0.0)
        probs = ex / tl.sum(ex, axis=0)
    elif GATING == 1:
        probs = tl.sigmoid(x)
    else:
        probs = x
    sel = probs + tl.load(b_ptr + offs, mask=ok, other=0.0)
    sel = tl.where(ok & (sel == sel), sel, float("-inf")) + 0.0  # NaN (a diverged row) never chosen over a
    # number; -0.0 made +0.0, so zeros tie as equal floats do
    # One max a pick over int64 keys that order as (sel, then the lower index): the float's bits made
    # monotone as an int32 (negatives' magnitude bits flipped) in the high word, BLOCK_E - 1 - index in
    # the low; lanes past E and the experts already chosen hold the smallest key.
    bits = sel.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    gone = tl.full([BLOCK_E], -(2**63), tl.int64)
    key = tl.where(ok, (ordered.to(tl.int64) << 32) | (BLOCK_E - 1 - offs).to(tl.int64), gone)
    slots = tl.arange(0, KB)
    isel = tl.zeros([KB], dtype=tl.int32)
    for j in tl.static_range(K):
        best = tl.max(key, axis=0)
        idx = BLOCK_E - 1 - (best & 0xFFFFFFFF).to(tl.int32)
        idx = tl.minimum(idx, E - 1)  # (an id is always an expert: the expert kernels index with it)
        isel = tl.where(slots == j, idx, isel)
        key = tl.where(offs == idx, gone, key)
    wsel = tl.sum(tl.where(offs[None, :] == isel[:, None], probs[None, :], 0.0), axis=1)  # the chosen's probs
    used = slots < K
    if GATING == 2:  # gpt-oss: the chosen logits softmaxed
        m = tl.max(tl.where(used, wsel, float("-inf")), axis=0)
        ex = tl.where(used, tl.exp(wsel - m), 0.0)
        wsel = ex / tl.sum(ex, axis=0)
    if NORM:
        wsel = wsel / tl.maximum(tl.sum(tl.where(used, wsel, 0.0), axis=0), 6.103515625e-5)
    wsel = wsel * scale
    tl.store(w_ptr + row * K + slots, wsel, mask=used)
    tl.store(id_ptr + row * K + slots, isel, mask=used)


def _check_routing(what: str, e: int, n_used: int, gating: str, **vectors: torch.Tensor) -> None:
    """Typed errors for a routing the route kernels cannot run: E experts (1..MAX_EXPERTS), n_used of them
    (1..min(E, MAX_USED)), a known gating, and `vectors` (the biases) contiguous f32 [E]."""
    check_int(what, "n_used", n_used, 1)
    if not 1 <= e <= MAX_EXPERTS or not n_used <= min(e, MAX_USED):
        raise UnsupportedError(f"{what}: 1 <= n_used <= min(E, {MAX_USED}), 1 <= E <= {MAX_EXPERTS}; got E {e}, "
                               f"n_used {n_used}")
    if gating not in GATINGS:
        raise UnsupportedError(f"{what}: gating {gating!r} is not one of {', '.join(GATINGS)}")
    for name, v in vectors.items():
        check_tensor(what, name, v, (torch.float32,), ndim=1)
        if v.shape != (e,) or not v.is_contiguous():
            raise UnsupportedError(f"{what}: {name} must be contiguous [{e}] (E), got {tuple(v.shape)}")


def _route_outputs(what: str, out, t: int, n_used: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights f32 [t, n_used]: `out` or new, ids int32 [t, n_used])."""
    return (make_out(what, out, (t, n_used), torch.float32, device),
            torch.empty(t, n_used, dtype=torch.int32, device=device))


def moe_route_rows(logits: torch.Tensor, bias: torch.Tensor, n_used: int, gating: str, norm: bool, scale: float,
                   out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights f32 [T, k], ids int32 [T, k]) of router logits f32 [T, E] (rows may be strided):
    graph/ir.py's MoERoute. `bias` f32 [E]: the selection bias (zeros for none). `out`: the
    weights' tensor."""
    what = "moe_route_rows"
    check_tensor(what, "logits", logits, (torch.float32,), ndim=2)
    t, e = logits.shape
    _check_routing(what, e, n_used, gating, bias=bias)
    if logits.stride(1) != 1:
        raise UnsupportedError(f"{what}: logits rows must be contiguous")
    device = check_device(what, logits=logits, bias=bias, out=out)
    weights, ids = _route_outputs(what, out, t, n_used, device)
    if t:
        _route_kernel[check_grid(what, (t,))](
            logits, bias, weights, ids, e, logits.stride(0), float(scale), K=n_used,
            KB=triton.next_power_of_2(n_used), BLOCK_E=triton.next_power_of_2(e), GATING=GATINGS[gating],
            NORM=bool(norm), num_warps=4, **pdl_args())
    return weights, ids


# ---------------------------------------------------------------------------------------------
# expert matmuls


def _check_moe_call(what: str, x: torch.Tensor, ids: torch.Tensor, n: int, k: int, n_expert: int):
    """(T, k used, XDIV) of an expert call after checking x, ids and the sizes."""
    check_tensor(what, "x", x, (torch.float32,), ndim=(2, 3))
    check_tensor(what, "ids", ids, (torch.int32,), ndim=2)
    for name, v in (("n", n), ("k", k), ("n_expert", n_expert)):
        check_int(what, name, v, 1)
    t, used = ids.shape
    if x.shape[-1] != k or x.shape[0] != t or (x.dim() == 3 and x.shape[1] != used):
        raise UnsupportedError(f"{what}: x must be [{t}, {k}] or [{t}, {used}, {k}] for ids [{t}, {used}], got "
                               f"{tuple(x.shape)}")
    if not x.is_contiguous() or not ids.is_contiguous():
        raise UnsupportedError(f"{what}: x and ids must be contiguous")
    return t, used, used if x.dim() == 2 else 1


def repack_experts(w: torch.Tensor, n: int, k: int, qtype: GGMLType | int | str, n_expert: int) -> GemvPacked:
    """Load layout: a 3-D expert tensor's raw GGUF bytes (E matrices [n, k], any GEMV type) -> one
    packed GEMV weight of E * n rows (expert e: rows e n .. e n + n - 1); f32 x (no int8 records)."""
    what = "repack_experts"
    if isinstance(w, GemvPacked):
        return w
    t = gemv_type(what, qtype)
    check_tensor(what, "w", w, (torch.uint8,))
    if w.numel() != n_expert * quant_info(t).nbytes(n * k):
        raise UnsupportedError(f"{what}: {n_expert} {t.name} experts [{n}, {k}] are "
                               f"{n_expert * quant_info(t).nbytes(n * k)} bytes, got {w.numel()}")
    return repack_gemv(w.reshape(n_expert * n, -1), n_expert * n, k, t, act_q8=0)


def check_expert_bias(what: str, bias, n: int, n_expert: int, like: torch.Tensor) -> None:
    """None, or the experts' biases: contiguous f32 [n_expert * n] on the call's device."""
    if bias is None:
        return
    check_tensor(what, "bias", bias, (torch.float32,))
    if bias.numel() != n_expert * n or not bias.is_contiguous():
        raise UnsupportedError(f"{what}: bias must be contiguous f32 of {n_expert} experts x {n} values, got "
                               f"{tuple(bias.shape)}")
    check_device(what, x=like, bias=bias)


@triton.jit
def _expert_bias_kernel(out_ptr, id_ptr, b_ptr, N, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    """out[slot, :] += b[ids[slot], :] for the slot of program axis 0, BLOCK_N columns per axis-1 program."""
    release_next(PDL)
    wait_prior(PDL)
    slot = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = cols < N
    expert = tl.load(id_ptr + slot).to(tl.int64)
    y = tl.load(out_ptr + slot * N + cols, mask=ok)
    tl.store(out_ptr + slot * N + cols, y + tl.load(b_ptr + expert * N + cols, mask=ok), mask=ok)


def _add_expert_bias(what: str, out: torch.Tensor, ids: torch.Tensor, bias: torch.Tensor | None, n: int) -> None:
    slots = ids.numel()
    if bias is not None and slots:
        block = 256
        _expert_bias_kernel[check_grid(what, (slots, cdiv(n, block)))](out, ids, bias, n, BLOCK_N=block, num_warps=4,
                                                                      **pdl_args())


def _packed_call(what: str, x, ids, w, n: int, k: int, qtype, n_expert: int, out):
    """(packed w, its type, (T, k used, XDIV), out) of an expert call on a GEMV layout, all checked."""
    t_type = gemv_type(what, qtype)
    w = repack_experts(w, n, k, t_type, n_expert)
    if w.n != n_expert * n or w.k != k:
        raise UnsupportedError(f"{what}: w holds [{w.n}, {w.k}], {n_expert} experts of [{n}, {k}] need "
                               f"[{n_expert * n}, {k}]")
    t, used, xdiv = _check_moe_call(what, x, ids, n, k, n_expert)
    device = check_device(what, x=x, ids=ids, qs=w.qs, out=out)
    return w, t_type, (t, used, xdiv), make_out(what, out, (t, used, n), torch.float32, device)


MANY_SLOTS = 32  # slots (rows x experts used) from which a call takes the batch tile


@functools.lru_cache(maxsize=256)  # (the launcher's host time matters at decode sizes, as gemv_config's)
def moe_gemv_config(n: int, k: int, qtype: GGMLType, slots: int = 1) -> GemvConfig:
    """The GEMV tile an expert call of `slots` slots launches (H200, bench/moe_gemv_sweep.py, each
    call replayed in a CUDA graph, 2026-12-05). From MANY_SLOTS (decode batches): 16 rows a program
    (4 rows per lane, 4 lanes along rows), one warp, words loaded in the step; int8 x (two passes)
    for the lookup types, whose f32 path decodes each code through the table per row (16 rows:
    qwen3moe Q4_K gate 132.7 -> 67.4 us, Q6_K down 171.0 -> 75.9, gpt-oss MXFP4 gate 164.0 -> 105.9
    and down 161.8 -> 103.3). Fewer (a decode row's 4-8 slots): 16 rows a program on two warps
    along K, the planes types 2 rows per lane over 8 lanes, the others 4 over 4; the lookup types
    with int8 x and the next step's words loaded ahead (one row: qwen3moe gate 14.4 -> 7.1 us, down
    13.0 -> 7.3; gpt-oss gate 20.0 -> 11.4, down 19.9 -> 11.3; the type's one-expert tile before)."""
    lut = qtype in LUT4_TYPES
    if slots >= MANY_SLOTS:
        return GemvConfig(r=4, lr=4, wk=1, maxnreg=128, q8=2 if lut else 0)
    planes = qtype in PLANE_TYPES
    return GemvConfig(r=2 if planes else 4, lr=8 if planes else 4, wk=2, maxnreg=168 if lut else 128,
                      prefetch=lut, q8=2 if lut else 0)


def _gemv_tile(config: GemvConfig | dict | None, n: int, k: int, qtype: GGMLType, slots: int) -> GemvConfig:
    """A call's pinned tile (a GemvConfig or its fields; its int8 passes checked), else moe_gemv_config's."""
    if config is None:
        return moe_gemv_config(n, k, qtype, slots)
    cfg = GemvConfig(**config) if isinstance(config, dict) else config
    check_act_q8(cfg.q8)
    return cfg


def moe_gemv(x: torch.Tensor, ids: torch.Tensor, w: GemvPacked | torch.Tensor, n: int, k: int,
             qtype: GGMLType | int | str, n_expert: int, out: torch.Tensor | None = None,
             bias: torch.Tensor | None = None, config: GemvConfig | dict | None = None) -> torch.Tensor:
    """out f32 [T, k_used, n]: slot (t, j) = x[t] (x [T, k]) or x[t, j] (x [T, k_used, k]) @ the
    expert ids[t, j]'s [n, k] matrix of `w` (`repack_experts`; raw bytes are repacked per call).
    Ids outside 0..n_expert-1 read out of bounds: the router makes them (moe_route_rows).
    `bias` f32 [n_expert * n]: each slot's expert's bias added (gpt-oss). `config` pins the tile
    (a GemvConfig or its fields; split is ignored; q8 > 0 quantizes x's rows to int8 first, for
    the types with an int8 path); None: `moe_gemv_config`."""
    what = "moe_gemv"
    w, t_type, (t, used, xdiv), out = _packed_call(what, x, ids, w, n, k, qtype, n_expert, out)
    check_expert_bias(what, bias, n, n_expert, x)
    cfg = _gemv_tile(config, n, k, t_type, t * used)
    if t:
        launch_packed(what, x, w, out, cfg, moe=MoeLaunch(ids, t * used, xdiv, n, bias))
    return out


# ---------------------------------------------------------------------------------------------
# an expert's gate and up projections and the GLU after them, in one launch

GLUS = {"swiglu": 1, "swiglu_oai": 5}  # the GEMV / mm16 epilogue of each GLU


def repack_glu_experts(w: torch.Tensor, n: int, k: int, qtype: GGMLType | int | str, n_expert: int) -> GemvPacked:
    """Load layout of a stacked gate + up expert weight: the raw bytes of the n_expert gate matrices
    [n, k], then of the n_expert up matrices (graph/fuse.py's fused weight) -> one packed GEMV weight
    of 2 n_expert n rows (`repack_experts` of 2 n_expert experts), which both GLU kernels read."""
    return repack_experts(w, n, k, qtype, 2 * n_expert)


def _glu_call(what: str, x, ids, w, n: int, k: int, qtype, n_expert: int, glu: str, alpha: float, limit: float,
              out, bias):
    """(packed w, its type, (T, k used), out) of a GLU expert call, all checked."""
    if glu not in GLUS:
        raise UnsupportedError(f"{what}: glu must be one of {sorted(GLUS)}, got {glu!r}")
    if glu == "swiglu_oai" and not (alpha == alpha and limit > 0):
        raise UnsupportedError(f"{what}: swiglu_oai needs a number alpha and a positive limit, got {alpha}, {limit}")
    check_int(what, "n_expert", n_expert, 1)
    w, t_type, (t, used, _), out = _packed_call(what, x, ids, w, n, k, qtype, 2 * n_expert, out)
    if x.dim() != 2:
        raise UnsupportedError(f"{what}: x must be [T, {k}] (each row's x feeds its slots), got {tuple(x.shape)}")
    check_expert_bias(what, bias, n, 2 * n_expert, x)
    return w, t_type, (t, used), out


def moe_gemv_glu(x: torch.Tensor, ids: torch.Tensor, w: GemvPacked | torch.Tensor, n: int, k: int,
                 qtype: GGMLType | int | str, n_expert: int, glu: str = "swiglu", alpha: float = 0.0,
                 limit: float = 0.0, out: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                 config: GemvConfig | dict | None = None) -> torch.Tensor:
    """out f32 [T, k_used, n]: slot (t, j) = glu(x[t] @ G[e]^T, x[t] @ U[e]^T), e = ids[t, j], G the
    n_expert gate matrices [n, k] and U the up ones stacked after them in `w` (`repack_glu_experts`;
    raw bytes are repacked per call); glu "swiglu" (silu(g) u) or "swiglu_oai" (gpt-oss's, alpha and
    limit). One launch: the GEMV kernel's MOE_GLU mode reads a slot's gate and up rows in one tile and
    stores the GLU (gemv.py); each sum is moe_gemv's on that row with the same tile. `bias` f32
    [2 n_expert n] (the gate experts' biases, then the up experts'): added before the GLU. `config`:
    as moe_gemv's; None: moe_gemv_config of both halves' rows."""
    what = "moe_gemv_glu"
    w, t_type, (t, used), out = _glu_call(what, x, ids, w, n, k, qtype, n_expert, glu, alpha, limit, out, bias)
    cfg = _gemv_tile(config, 2 * n, k, t_type, t * used)
    if t:
        launch_packed(what, x, w, out, cfg, epilogue=glu_epilogue(GLUS[glu], out, w.qs),
                      moe=MoeLaunch(ids, t * used, used, 2 * n, bias, n_expert * n, alpha, limit))
    return out


@triton.jit
def _align_kernel(id_ptr, sorted_ptr, bexp_ptr, cursor_ptr, S, E, ROWS, NB, BLOCK_M: tl.constexpr, EB: tl.constexpr,
                  CHUNK: tl.constexpr, PDL: tl.constexpr):
    """One program: the slots grouped by expert (moe_align's tables). Counts by atomics into
    `cursor`, each expert's first padded position by a cumsum, then every slot takes the next
    position of its expert (atomics: the order within an expert is arbitrary, and harmless: a
    row's products do not depend on the rows sharing its block) and names its block's expert."""
    release_next(PDL)
    wait_prior(PDL)
    eo = tl.arange(0, EB)
    tl.store(cursor_ptr + eo, tl.zeros([EB], dtype=tl.int32), mask=eo < E)
    for r0 in range(0, ROWS, CHUNK):
        r = r0 + tl.arange(0, CHUNK)
        tl.store(sorted_ptr + r, tl.full([CHUNK], -1, tl.int32), mask=r < ROWS)
    for b0 in range(0, NB, CHUNK):
        r = b0 + tl.arange(0, CHUNK)
        tl.store(bexp_ptr + r, tl.full([CHUNK], 0, tl.int32) + E, mask=r < NB)
    tl.debug_barrier()
    for c0 in range(0, S, CHUNK):
        c = c0 + tl.arange(0, CHUNK)
        e = tl.minimum(tl.maximum(tl.load(id_ptr + c, mask=c < S, other=0), 0), E - 1)  # memory-safe on any ids
        tl.atomic_add(cursor_ptr + e, tl.full([CHUNK], 1, tl.int32), mask=c < S, sem="relaxed", scope="cta")
    tl.debug_barrier()
    counts = tl.load(cursor_ptr + eo, mask=eo < E, other=0, volatile=True)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    first = tl.cumsum(padded, 0) - padded
    tl.debug_barrier()
    tl.store(cursor_ptr + eo, first, mask=eo < E)
    tl.debug_barrier()
    for c0 in range(0, S, CHUNK):
        c = c0 + tl.arange(0, CHUNK)
        e = tl.minimum(tl.maximum(tl.load(id_ptr + c, mask=c < S, other=0), 0), E - 1)
        pos = tl.atomic_add(cursor_ptr + e, tl.full([CHUNK], 1, tl.int32), mask=c < S, sem="relaxed", scope="cta")
        tl.store(sorted_ptr + pos, c, mask=c < S)
        tl.store(bexp_ptr + pos // BLOCK_M, e, mask=c < S)


_ALIGNED: dict = {}  # the last grouping made: (weakref to ids, its version, expert count, block rows) -> tables


def aligned(ids: torch.Tensor, n_expert: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """moe_align's tables, made once for a layer's three expert matmuls: gate, up and down take the
    same router ids tensor (a new one per forward), so the second and third call reuse the tables
    the first made (in a CUDA graph the one align launch is captured before the gate's). Keyed by
    the tensor object itself (a weak reference: a freed tensor's address never matches), its
    version counter outside inference mode (an in-place torch write changes it) and the grouping's
    sizes; rewriting the same tensor's values in place under inference mode (no counter) or by a
    kernel behind torch's back would defeat it, and nothing does (the router writes a fresh tensor
    each forward)."""
    version = -1 if ids.is_inference() else ids._version  # (inference tensors, the engine's, keep no counter)
    key = (version, n_expert, block_m, ids.data_ptr())
    hit = _ALIGNED.get("last")
    if hit is not None and hit[0]() is ids and hit[1] == key:
        return hit[2]
    tables = moe_align(ids, n_expert, block_m)
    _ALIGNED["last"] = (weakref.ref(ids), key, tables)
    return tables


def moe_align(ids: torch.Tensor, n_expert: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted slots int32 [blocks * block_m], block experts int32 [blocks]): the step's slots
    (t * k + j) grouped by expert, each expert's run padded to whole blocks of block_m (padding
    -1), the experts in order; blocks past the last used one name expert n_expert (none).
    blocks = cdiv(slots, block_m) + min(n_expert, slots) bounds any routing, so the shapes depend
    on the row count alone: one one-program kernel (`_align_kernel`), no host sync (a CUDA graph
    captures it). The order of an expert's slots within its run is not fixed (atomics)."""
    what = "moe_align"
    check_tensor(what, "ids", ids, (torch.int32,), ndim=2)
    check_int(what, "n_expert", n_expert, 1)
    check_int(what, "block_m", block_m, 1)
    if not ids.is_contiguous() or n_expert > MAX_EXPERTS:
        raise UnsupportedError(f"{what}: contiguous ids and at most {MAX_EXPERTS} experts, got {n_expert}")
    s, device = ids.numel(), ids.device
    n_blocks = cdiv(s, block_m) + min(n_expert, s)
    sorted_slots = torch.empty(n_blocks * block_m, dtype=torch.int32, device=device)
    block_expert = torch.empty(n_blocks, dtype=torch.int32, device=device)
    cursor = torch.empty(n_expert, dtype=torch.int32, device=device)
    if s:
        _align_kernel[(1,)](ids, sorted_slots, block_expert, cursor, s, n_expert, n_blocks * block_m, n_blocks,
                            BLOCK_M=block_m, EB=triton.next_power_of_2(n_expert), CHUNK=1024, num_warps=8,
                            **pdl_args())
    return sorted_slots, block_expert


def moe_config(slots: int, n_expert: int, n: int) -> dict:
    """The MMQ tile of a grouped expert matmul: rows per block near the slots an expert gets on
    average (16..64: a decode batch's few rows per expert, a prompt's many), one of mmq.py's
    spill-free configs."""
    per = max(1, slots // max(1, n_expert))
    bm = 16 if per <= 16 else 32 if per <= 32 else 64
    cfg = next(c for c in MMQ_CONFIGS if c.kwargs["BLOCK_M"] == bm)
    return dict(cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def moe_mmq(x: torch.Tensor, ids: torch.Tensor, w: GemvPacked | torch.Tensor, n: int, k: int,
            qtype: GGMLType | int | str, n_expert: int, out: torch.Tensor | None = None,
            config: dict | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """moe_gemv's result for many rows, grouped by expert: the step's slots sorted by expert
    (`moe_align`, on the device) and each block of one expert's rows multiplied on int8 tensor
    cores by mmq.py's kernel (x quantized per 32 in the kernel, as mmq_matmul), so each expert's
    weights are read once per block of rows, not once per slot. `config` pins the tile (keys of
    mmq's configs); else `moe_config`. `bias`: as moe_gemv."""
    what = "moe_mmq"
    w, _, (t, used, xdiv), out = _packed_call(what, x, ids, w, n, k, qtype, n_expert, out)
    check_expert_bias(what, bias, n, n_expert, x)
    if t:
        cfg = dict(config) if config is not None else moe_config(t * used, n_expert, n)
        table = moe_align(ids, n_expert, cfg["BLOCK_M"])
        launch_mmq_moe(what, x, w, out, n, k, table, xdiv, n_expert, cfg)
        _add_expert_bias(what, out, ids, bias, n)
    return out


# ---------------------------------------------------------------------------------------------
# the grouped expert matmul on f16 tensor cores (prompt chunks, decode batches)


@triton.jit
def _w_tile_f16(lo_rows, hi_rows, d_rows, m_rows, kb0, t0, t1, t2, t3, KB: tl.constexpr, LB: tl.constexpr,
                HB: tl.constexpr, CENTER: tl.constexpr, MODE: tl.constexpr, LUT: tl.constexpr,
                MAGIC: tl.constexpr = True):
    """f16 [32 KB, BN]: blocks kb0 .. kb0 + KB - 1 of the tile's rows dequantized (scale * code +
    offset in f32, rounded once to f16), dot position 32 u + 8 j + s holding the element mmq.py's
    `_w_codes` puts at 8 j + s of block u. lo_rows, hi_rows, d_rows, m_rows: [BN, 1, 1] pointers."""
    jw = tl.arange(0, 4 * KB)[None, :, None]  # word 4 u + j of the step
    s = tl.arange(0, 8)[None, None, :]
    lo = tl.load(lo_rows + kb0 * 4 + jw).to(tl.int32)  # [BN, 4 KB, 1]
    if LUT:
        wa, wb = _lut_bytes(lo, t0, t1, t2, t3)
        c = (tl.where(s < 4, wa, wb) >> (8 * (s & 3))) & 0xFF
    elif LB == 8:
        hi = tl.load(hi_rows + kb0 * 4 + jw).to(tl.int32)
        c = (tl.where(s < 4, lo, hi) >> (8 * (s & 3))) & 0xFF
    elif LB == 4 and HB == 0:
        c = 0  # (the nibbles go straight into the float below)
    else:
        c = (lo >> (LB * s)) & ((1 << LB) - 1)
        if HB > 0:
            hi = tl.load(hi_rows + kb0 * 4 + jw).to(tl.int32)
            c = c | (((hi >> (HB * s)) & ((1 << HB) - 1)) << LB)
    a0, a1, c0, c1 = _w_scales(d_rows, m_rows, kb0 + jw // 4, True, MODE)  # [BN, 4 KB, 1]
    HALVES: tl.constexpr = MODE == 3 or MODE == 4
    AFFINE: tl.constexpr = MODE == 1 or MODE == 2 or MODE == 4
    if HALVES:  # slots 0..3 are elements 0..15 of the block
        a0 = tl.where(s < 4, a0, a1)
        c0 = tl.where(s < 4, c0, c1)
    # code - CENTER as f32 without an int-to-float conversion (16 a clock an SM on Hopper, and 1.1 a weight made
    # this loop convert-bound): gemv.py's magic-number form, the same bits as the conversion. A code ORed into the
    # mantissa of 2^23 is 2^23 + c exactly, and 2^23 + CENTER subtracted leaves c - CENTER exactly. The 4-bit
    # codes skip their shift too: slots 4..7 moved down by one 16-bit shift a word, the nibble at bit b = 0, 4,
    # 8, 12 ORed in place into 2^(23 - b), whose mantissa unit sits at bit b. sm_90 SASS of the Q4_K loop: no
    # I2FP (was 72 a thread and K step), shifts 106 -> 26, 162 -> 128 registers.
    if LB == 4 and HB == 0 and not LUT:
        b = 4 * (s % 4)
        magic = 0x4B000000 - (b << 23)  # the bits of 2^(23 - b)
        src = tl.where(s < 4, lo, lo >> 16)
        code = ((src & (15 << b)) | magic).to(tl.float32, bitcast=True)
        w = (code - (magic.to(tl.float32, bitcast=True) + CENTER)) * a0
    elif MAGIC:  # byte codes, the 5- and 6-bit codes of one dot a step
        w = ((c | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + CENTER)) * a0
    else:  # converted (the magic form spilled Q6_K's GLU tile and Q2_K's tile: `MAGIC` off there)
        w = (c - CENTER).to(tl.float32) * a0
    if AFFINE:
        w = w + c0
    w16 = tl.reshape(w.to(tl.float16), (w.shape[0], 32 * KB))
    return tl.trans(w16)


@triton.jit
def _mm16_kernel(x_ptr, lo_ptr, hi_ptr, d_ptr, m_ptr, out_ptr, b_ptr, sorted_ptr, bexp_ptr, N, K, NKB, M_STRIDE,
                 XDIV, NEXP, t0, t1, t2, t3, LB: tl.constexpr, HB: tl.constexpr, CENTER: tl.constexpr,
                 MODE: tl.constexpr, LUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 KB: tl.constexpr, BIAS: tl.constexpr, PDL: tl.constexpr, GLU_OFF, GLU: tl.constexpr = 0,
                 ALPHA: tl.constexpr = 0.0, LIMIT: tl.constexpr = 0.0):
    # program (i, n): block i of the slots sorted by expert (moe_align), column tile n of its expert.
    # GLU (moe_mm16_glu) 1 (SwiGLU) or 5 (gpt-oss's clamped SwiGLU, ALPHA, LIMIT): the same columns of
    # the expert's up matrix too (GLU_OFF rows after its gate matrix; biases likewise), one more dot a
    # step on the same x tile, and the GLU of the two sums stored (elementwise.py's order).
    release_next(PDL)
    wait_prior(PDL)
    expert = tl.load(bexp_ptr + tl.program_id(0))
    if expert >= NEXP:
        return
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    slots = tl.load(sorted_ptr + offs_m)
    x_rows = x_ptr + tl.where(slots >= 0, slots // XDIV, 0).to(tl.int64)[:, None] * K
    cols = (tl.minimum(offs_n, N - 1).to(tl.int64) + expert.to(tl.int64) * N)[:, None, None]
    p = tl.arange(0, 32 * KB)
    r = p % 32
    if LUT:  # the element at dot position 32 u + 8 j + s (mmq.py's order within each block)
        xoff = (p // 32) * 32 + 8 * (r % 4) + 4 * ((r % 8) // 4) + r // 8
    else:
        xoff = (p // 32) * 32 + 4 * (r % 8) + r // 8
    up = cols + GLU_OFF
    MAGIC: tl.constexpr = LUT or LB == 8 or (LB == 4 and (HB == 0 or GLU == 0))  # (see _w_tile_f16)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb0 in range(0, NKB, KB):
        w = _w_tile_f16(lo_ptr + cols * (NKB * 4), hi_ptr + cols * (NKB * 4), d_ptr + cols * NKB,
                        m_ptr + cols * M_STRIDE, kb0, t0, t1, t2, t3, KB, LB, HB, CENTER, MODE, LUT, MAGIC)
        x = tl.load(x_rows + kb0 * 32 + xoff[None, :]).to(tl.float16)
        acc = tl.dot(x, w, acc)
        if GLU:
            wu = _w_tile_f16(lo_ptr + up * (NKB * 4), hi_ptr + up * (NKB * 4), d_ptr + up * NKB,
                             m_ptr + up * M_STRIDE, kb0, t0, t1, t2, t3, KB, LB, HB, CENTER, MODE, LUT, MAGIC)
            acc_up = tl.dot(x, wu, acc_up)
    if BIAS:  # the block's expert's bias (gpt-oss)
        acc += tl.load(b_ptr + expert.to(tl.int64) * N + offs_n, mask=offs_n < N, other=0.0)[None, :]
        if GLU:
            acc_up += tl.load(b_ptr + GLU_OFF + expert.to(tl.int64) * N + offs_n, mask=offs_n < N, other=0.0)[None, :]
    if GLU == 1:
        acc = acc * tl.sigmoid(acc) * acc_up
    elif GLU == 5:
        acc = swiglu_oai_f32(acc, acc_up, ALPHA, LIMIT)
    mask = (slots[:, None] >= 0) & (offs_n[None, :] < N)
    tl.store(out_ptr + slots.to(tl.int64)[:, None] * N + offs_n[None, :], acc, mask=mask)


def mm16_config(slots: int, n_expert: int, n: int, k: int) -> dict:
    """The tile of `moe_mm16`: 16 rows by 128 columns, 2 blocks of 32 per K step (1 when K is an
    odd number of blocks). The H200 sweep (bench/moe_mm16_sweep.py, 2026-12-04: Qwen3-30B-A3B's
    and gpt-oss-20b's experts, batches of 16 and prompts of 512) found it the fastest of 12 tiles
    in 7 of 8 cases, prompts included (16 rows beat 32 and 64: the in-kernel dequantization, not
    the tensor cores, bounds the kernel, and short tiles keep more programs in flight)."""
    return {"BLOCK_M": 16, "BLOCK_N": 128, "KB": 2 if k % 64 == 0 else 1, "num_warps": 4, "num_stages": 3}


def moe_mm16(x: torch.Tensor, ids: torch.Tensor, w: GemvPacked | torch.Tensor, n: int, k: int,
             qtype: GGMLType | int | str, n_expert: int, out: torch.Tensor | None = None,
             config: dict | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """moe_gemv's result for many rows, grouped by expert on f16 tensor cores: the step's slots
    sorted by expert (`moe_align`, on the device), and per block of one expert's rows and column
    tile, each K step's weights dequantized in the kernel from the GEMV layout (`repack_experts`,
    no second copy) to f16 and multiplied with the rows (x rounded to f16) into f32 sums; an
    expert's weights are read once per block of its rows. `config` pins the tile (`mm16_config`'s
    keys); `bias`: as moe_gemv's, added in the store."""
    what = "moe_mm16"
    w, _, (t, used, xdiv), out = _packed_call(what, x, ids, w, n, k, qtype, n_expert, out)
    check_expert_bias(what, bias, n, n_expert, x)
    _launch_mm16(what, x, ids, w, n, k, n_expert, (t, used, xdiv), out, config, bias)
    return out


def _launch_mm16(what: str, x, ids, w: GemvPacked, n: int, k: int, n_expert: int, sizes: tuple, out, config, bias,
                 glu: tuple = (0, 0, 0.0, 0.0)) -> None:
    """moe_mm16's kernel on checked operands: sizes (T, k used, XDIV); glu (GLU epilogue, the up
    experts' row offset, alpha, limit) for moe_mm16_glu."""
    t, used, xdiv = sizes
    cfg = dict(config) if config is not None else mm16_config(t * used, n_expert, n, k)
    if k % (32 * cfg["KB"]):
        raise UnsupportedError(f"{what}: k {k} is not a multiple of {32 * cfg['KB']} (KB {cfg['KB']} blocks of 32)")
    if t:
        sorted_slots, block_expert = aligned(ids, n_expert, cfg["BLOCK_M"])
        hi, m_plane, layout = kernel_planes(w)
        grid = check_grid(what, (block_expert.numel(), cdiv(n, cfg["BLOCK_N"])))
        epi, off, alpha, limit = glu
        _mm16_kernel[grid](x, w.qs, hi, w.d, m_plane, out, out if bias is None else bias, sorted_slots, block_expert,
                           n, k, k // 32, m_plane.shape[1], xdiv, n_expert, **layout, BIAS=bias is not None, **cfg,
                           **pdl_args(), GLU_OFF=off, GLU=epi, ALPHA=float(alpha), LIMIT=float(limit))


def moe_mm16_glu(x: torch.Tensor, ids: torch.Tensor, w: GemvPacked | torch.Tensor, n: int, k: int,
                 qtype: GGMLType | int | str, n_expert: int, glu: str = "swiglu", alpha: float = 0.0,
                 limit: float = 0.0, out: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                 config: dict | None = None) -> torch.Tensor:
    """moe_gemv_glu's result for many rows, grouped by expert on f16 tensor cores (moe_mm16's
    kernel in its GLU mode): per block of one expert's rows and column tile, the gate and the up
    tiles dequantized and multiplied with the same x tile, the GLU of the two sums stored; each
    sum is moe_mm16's with the same tile. One launch and one x read where moe_mm16 ran two and a
    SwiGLU kernel ran a third. `config`: mm16_config's keys; `bias`: as moe_gemv_glu's."""
    what = "moe_mm16_glu"
    w, _, (t, used), out = _glu_call(what, x, ids, w, n, k, qtype, n_expert, glu, alpha, limit, out, bias)
    _launch_mm16(what, x, ids, w, n, k, n_expert, (t, used, used), out, config, bias,
                 (GLUS[glu], n_expert * n, alpha, limit))
    return out


def f16_experts(w: torch.Tensor, n: int, k: int, qtype: GGMLType | int | str, n_expert: int) -> torch.Tensor:
    """Load layout: a float expert tensor's raw bytes (F32, F16, BF16) -> its f16 copy [E * n, k]."""
    what = "f16_experts"
    if isinstance(w, torch.Tensor) and w.dtype == torch.float16:
        return w.reshape(n_expert * n, k)
    info = by_name(qtype) if isinstance(qtype, str) else quant_info(qtype)
    if info.type not in FLOAT_TYPES:
        raise UnsupportedError(f"{what}: {info.name} is not a float type ({', '.join(t.name for t in FLOAT_TYPES)})")
    check_tensor(what, "w", w, (torch.uint8,))
    if w.numel() != n_expert * n * k * info.block_bytes:
        raise UnsupportedError(f"{what}: {n_expert} {info.name} experts [{n}, {k}] are "
                               f"{n_expert * n * k * info.block_bytes} bytes, got {w.numel()}")
    dtype = {GGMLType.F32: torch.float32, GGMLType.F16: torch.float16, GGMLType.BF16: torch.bfloat16}[info.type]
    return w.reshape(-1).view(dtype).reshape(n_expert * n, k).to(torch.float16)


@triton.jit
def _f16_kernel(x_ptr, w_ptr, id_ptr, out_ptr, b_ptr, N, K, XDIV, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                BIAS: tl.constexpr, PDL: tl.constexpr):
    release_next(PDL)
    wait_prior(PDL)
    slot = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    expert = tl.load(id_ptr + slot).to(tl.int64)
    w_rows = w_ptr + (expert * N + tl.minimum(rows, N - 1))[:, None] * K
    x_row = x_ptr + (slot // XDIV) * K
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        xv = tl.load(x_row + cols, mask=cols < K, other=0.0)
        wv = tl.load(w_rows + cols[None, :], mask=cols[None, :] < K, other=0.0).to(tl.float32)
        acc += tl.sum(wv * xv[None, :], axis=1)
    if BIAS:  # the slot's expert's bias, in the store
        acc += tl.load(b_ptr + expert * N + rows, mask=rows < N, other=0.0)
    tl.store(out_ptr + slot * N + rows, acc, mask=rows < N)


def moe_matmul_f16(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, n: int, k: int,
                   qtype: GGMLType | int | str, n_expert: int, out: torch.Tensor | None = None,
                   bias: torch.Tensor | None = None) -> torch.Tensor:
    """moe_gemv for float expert tensors, on their f16 copy (`f16_experts`; raw bytes converted
    per call): f32 x and sums; `bias` (as moe_gemv's) added in the store."""
    what = "moe_matmul_f16"
    w = f16_experts(w, n, k, qtype, n_expert)
    if tuple(w.shape) != (n_expert * n, k):
        raise UnsupportedError(f"{what}: w must be the f16 [{n_expert * n}, {k}] of {n_expert} experts, got "
                               f"{tuple(w.shape)}")
    t, used, xdiv = _check_moe_call(what, x, ids, n, k, n_expert)
    device = check_device(what, x=x, ids=ids, w=w, out=out)
    check_expert_bias(what, bias, n, n_expert, x)
    out = make_out(what, out, (t, used, n), torch.float32, device)
    if t:
        block_n = 64  # wide tiles: few loop steps (the interpreter pays per step, not per element)
        _f16_kernel[check_grid(what, (t * used, cdiv(n, block_n)))](
            x, w, ids, out, out if bias is None else bias, n, k, xdiv, BLOCK_N=block_n, BLOCK_K=256,
            BIAS=bias is not None, num_warps=4, **pdl_args())
    return out


# ---------------------------------------------------------------------------------------------
# the weighted sum


@triton.jit
def _sum_kernel(y_ptr, w_ptr, out_ptr, N, K: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    release_next(PDL)
    wait_prior(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = cols < N
    acc = tl.load(y_ptr + row * K * N + cols, mask=ok, other=0.0) * tl.load(w_ptr + row * K)
    for j in tl.static_range(1, K):
        acc += tl.load(y_ptr + (row * K + j) * N + cols, mask=ok, other=0.0) * tl.load(w_ptr + row * K + j)
    tl.store(out_ptr + row * N + cols, acc, mask=ok)


def moe_sum_rows(y: torch.Tensor, weights: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out f32 [T, n] = sum over j, in slot order, of weights[t, j] * y[t, j] (y f32 [T, k, n])."""
    what = "moe_sum_rows"
    check_tensor(what, "y", y, (torch.float32,), ndim=3)
    check_tensor(what, "weights", weights, (torch.float32,), ndim=2)
    t, used, n = y.shape
    if tuple(weights.shape) != (t, used) or not y.is_contiguous() or not weights.is_contiguous():
        raise UnsupportedError(f"{what}: contiguous y [T, k, n] and weights [T, k]; got {tuple(y.shape)}, "
                               f"{tuple(weights.shape)}")
    check_int(what, "k", used, 1)
    device = check_device(what, y=y, weights=weights, out=out)
    out = make_out(what, out, (t, n), torch.float32, device)
    if t and n:
        block = 256
        _sum_kernel[check_grid(what, (t, cdiv(n, block)))](y, weights, out, n, K=used, BLOCK_N=block, num_warps=4,
                                                           **pdl_args())
    return out


__all__ = ["GEMV_TYPES", "moe_route_rows", "moe_gemv", "moe_gemv_config", "moe_mmq", "moe_mm16", "moe_align",
           "moe_matmul_f16", "moe_sum_rows", "repack_experts", "f16_experts"]
