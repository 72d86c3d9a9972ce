"""The WGSL mixture-of-experts kernels (vk_moe_route, vk_moe_qmatmul, vk_moe_sum: moe.fkc.md):
the router's choice, the chosen experts' matmuls over a 3-D expert tensor's GGUF bytes (every weight
type, the ids read on the device: one dispatch for every slot of a step), and the weighted sum."""

from __future__ import annotations

import torch

from ...errors import UnsupportedError
from ...quant.types import quant_info
from ..wgpu.device import VkTensor, default_device
from ._common import MAX_GROUPS, SHADERS, WG, _at, _check, _grid_2d, _host_bridge, _out, _qinfo

REVISION_SOURCES = SHADERS
GATINGS = {"softmax": 0, "sigmoid": 1, "softmax_weight": 2}
MAX_EXPERTS = 1024
MAX_USED = 64
EXPERT_WG, EXPERT_TPR = 128, 16  # qmatmul.wgsl's A_WG / A_TPR: 16 invocations a column


def moe_route(logits, bias, n_used: int, gating: str, norm: bool, scale: float, out=None):
    """(weights f32 [rows, k], ids int32 [rows, k]) of router logits [rows, E] (rows may be strided),
    graph/ir.py's MoERoute; `bias` [E] the selection bias (zeros for none). Torch tensors run on the
    default device and come back as torch tensors."""
    if isinstance(logits, torch.Tensor):
        dev = default_device()
        w, ids = moe_route(dev.upload(logits), dev.upload(bias), n_used, gating, norm, scale)
        w_host, ids_host = dev.download(w), dev.download(ids)
        return (w_host if out is None else out.copy_(w_host.view(out.shape))), ids_host
    what = "vk moe_route"
    _check(what, "logits", logits, "F32", (2,))
    _check(what, "bias", bias, "F32", (1,), contiguous=True)
    rows, e = logits.shape
    if not (1 <= e <= MAX_EXPERTS and 1 <= n_used <= min(e, MAX_USED) and bias.shape == (e,)):
        raise UnsupportedError(f"{what}: 1 <= n_used <= min(E, {MAX_USED}), 1 <= E <= {MAX_EXPERTS}, bias [E]; got "
                               f"E {e}, n_used {n_used}, bias {bias.shape}")
    if gating not in GATINGS:
        raise UnsupportedError(f"{what}: gating {gating!r} is not one of {', '.join(GATINGS)}")
    w = _out(what, out, logits, (rows, n_used))
    ids = logits.dev.empty((rows, n_used), "I32")
    if rows > MAX_GROUPS * WG:
        raise UnsupportedError(f"{what}: {rows} rows exceed one dispatch")
    pipe = logits.dev.pipeline("moe_route", {"WG": WG, "K": n_used, "GATING": GATINGS[gating], "NORM": int(norm)})
    logits.dev.dispatch(pipe, [logits, bias, _at(w), ids], [rows, e, logits.offset, logits.stride, float(scale)],
                        (-(-rows // WG),))
    return w, ids


moe_route.wgpu_device = default_device  # (as _host_bridge's launchers: what the judge times it on)


@_host_bridge()
def moe_qmatmul(x: VkTensor, ids: VkTensor, w: VkTensor, n: int, k: int, qtype, n_expert: int,
                out: VkTensor | None = None, bias: VkTensor | None = None) -> VkTensor:
    """out [T, k_used, n] = x[t] (x [T, k]) or x[t, j] (x [T, k_used, k]) @ dequant(expert ids[t, j])^T,
    w the GGUF bytes of n_expert stacked [n, k] matrices of any weight type; one dispatch, a
    workgroup row per slot. `bias` f32 [n_expert * n]: each slot's expert's bias added in the store
    (gpt-oss's ffn_*_exps.bias)."""
    what = "vk moe_qmatmul"
    q = _qinfo(what, qtype)
    _check(what, "x", x, "F32", (2, 3), contiguous=True)
    _check(what, "ids", ids, "I32", (2,), contiguous=True)
    _check(what, "w", w, "U8", contiguous=True)
    t, used = ids.shape
    be = max(q.block_elems, 32)
    if x.shape[-1] != k or k % be or x.shape[0] != t or (len(x.shape) == 3 and x.shape[1] != used):
        raise UnsupportedError(f"{what}: x must be [{t}, {k}] or [{t}, {used}, {k}] (k a multiple of {be}) for ids "
                               f"[{t}, {used}], got {x.shape}")
    row_bytes = quant_info(q.type).nbytes(k)
    if w.numel != n_expert * n * row_bytes or w.offset:
        raise UnsupportedError(f"{what}: w must be {n_expert} experts of {n} rows of {row_bytes} bytes ({q.name}) "
                               f"from byte 0, got {w.numel} bytes")
    if bias is not None:
        _check(what, "bias", bias, "F32", contiguous=True)
        if bias.numel != n_expert * n or bias.offset:
            raise UnsupportedError(f"{what}: bias must be f32 [{n_expert} x {n}] from element 0, got {bias.shape}")
    slots = t * used
    if slots > MAX_GROUPS:
        raise UnsupportedError(f"{what}: {slots} slots exceed one dispatch ({MAX_GROUPS})")
    out = _out(what, out, x, (t, used, n))
    if slots:
        gx, gz = _grid_2d(n, EXPERT_WG // EXPERT_TPR)
        shader = "qmatmul_x+moe_no_bias+moe_qmatmul" if bias is None else "qmatmul_x+moe_bias+moe_qmatmul"
        pipe = x.dev.pipeline(shader, {"WG": EXPERT_WG, "TPR": EXPERT_TPR}, q.name, dot=True)
        x.dev.dispatch(pipe, [w, x, _at(out), ids, *([] if bias is None else [bias])],
                       [slots, n, k, x.offset, used if len(x.shape) == 2 else 1, row_bytes, gx], (gx, slots, gz))
    return out


@_host_bridge()
def moe_sum(y: VkTensor, weights: VkTensor, out: VkTensor | None = None) -> VkTensor:
    """out [rows, n] = sum_j weights[row, j] * y[row, j, :], in slot order."""
    what = "vk moe_sum"
    _check(what, "y", y, "F32", (3,), contiguous=True)
    _check(what, "weights", weights, "F32", (2,), contiguous=True)
    rows, used, n = y.shape
    if weights.shape != (rows, used) or y.offset or weights.offset:
        raise UnsupportedError(f"{what}: y [rows, k, n] and weights [rows, k] from element 0; got {y.shape}, "
                               f"{weights.shape}")
    out = _out(what, out, y, (rows, n))
    if rows > MAX_GROUPS:
        raise UnsupportedError(f"{what}: {rows} rows exceed one dispatch")
    if rows and n:
        y.dev.dispatch(y.dev.pipeline("moe_sum", {"WG": WG, "K": used}), [y, weights, _at(out)], [n],
                       (-(-n // WG), rows))
    return out
