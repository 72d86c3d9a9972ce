"""The WGSL elementwise kernels (vk_add, vk_add_bias, vk_swiglu, vk_geglu, vk_swiglu_oai, vk_scale, vk_softcap,
vk_rope: elementwise.fkc.md)."""

from __future__ import annotations

import math

from ...errors import UnsupportedError
from ._common import SHADERS, WG, VkTensor, _at, _check, _grid_2d, _host_bridge, _out, _rows
from .quantize import records_passes

REVISION_SOURCES = SHADERS


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
def swiglu(gate: VkTensor, up: VkTensor, out: VkTensor | None = None, q8: VkTensor | None = None) -> VkTensor:
    """out [rows, d] = silu(gate) * up; gate and up may be column slices of one matmul output.
    q8: a q8_records buffer the same dispatch fills with out's int8 records (as rms_norm's)."""
    return _glu("vk swiglu", (0, 0.0, 0.0), gate, up, out, q8)


@_host_bridge()
def geglu(gate: VkTensor, up: VkTensor, out: VkTensor | None = None) -> VkTensor:
    """out [rows, d] = gelu_tanh(gate) * up (gemma's feed-forward), as swiglu."""
    return _glu("vk geglu", (1, 0.0, 0.0), gate, up, out, None)


@_host_bridge()
def swiglu_oai(gate: VkTensor, up: VkTensor, alpha: float, limit: float, out: VkTensor | None = None) -> VkTensor:
    """out = g * sigmoid(alpha g) * (u + 1), g = min(gate, limit), u = clamp(up, -limit, limit):
    gpt-oss's clamped SwiGLU (ggml's swiglu_oai), as swiglu ([T, k, d] experts' outputs too); alpha
    and limit are constants of the compiled variant (one per model)."""
    what = "vk swiglu_oai"
    for name, v in (("alpha", alpha), ("limit", limit)):
        bad = isinstance(v, bool) or not isinstance(v, float | int) or not math.isfinite(v)
        if bad or (name == "limit" and v <= 0):
            raise UnsupportedError(f"{what}: {name} must be a finite number{' > 0' if name == 'limit' else ''}, "
                                   f"got {v!r}")
    return _glu(what, (2, float(alpha), float(limit)), gate, up, out, None)


def _glu(what: str, act: tuple[int, float, float], gate: VkTensor, up: VkTensor, out: VkTensor | None,
         q8: VkTensor | None) -> VkTensor:
    """act: (ACT, ALPHA, LIMIT) of swiglu.wgsl's variant (0 silu, 1 gelu_tanh, 2 the clamped SwiGLU)."""
    _check(what, "gate", gate, "F32", (1, 2, 3))
    _check(what, "up", up, "F32", (1, 2, 3))
    if gate.shape != up.shape:
        raise UnsupportedError(f"{what}: gate and up differ in shape: {gate.shape} and {up.shape}")
    if len(gate.shape) == 3:  # a mixture of experts' [T, k, d] (contiguous): its T * k rows
        t, used, d = gate.shape
        flat = _glu(what, act, gate.view(t * used, d), up.view(t * used, d),
                    None if out is None else out.view(t * used, d), q8)
        return flat.view(t, used, d)
    d, rows = gate.shape[-1], _rows(gate)
    out = _out(what, out, gate, gate.shape)
    params = [d, rows, gate.offset, gate.stride, up.offset, up.stride]
    if q8 is not None:
        passes = records_passes(what, q8, rows, d)
        gate.dev.dispatch(gate.dev.pipeline("q8_act+swiglu_q8", {"WG": WG, "P8": passes}), [gate, up, _at(out), q8],
                          params, (-(-d // (4 * WG)), rows))
        return out
    consts = {"WG": WG, "ACT": act[0], "ALPHA": act[1], "LIMIT": act[2]}
    gate.dev.dispatch(gate.dev.pipeline("swiglu", consts), [gate, up, _at(out)], params,
                      (-(-d // WG), rows))
    return out


@_host_bridge()
def scale(x: VkTensor, scale: float, out: VkTensor | None = None) -> VkTensor:
    """out = x * scale, contiguous f32 (gemma's embedding scale)."""
    return _map1("vk scale", 0, x, scale, out)


@_host_bridge()
def softcap(x: VkTensor, cap: float, out: VkTensor | None = None) -> VkTensor:
    """out = cap * tanh(x / cap), contiguous f32 (gemma2's final-logit soft-cap)."""
    if isinstance(cap, bool) or not isinstance(cap, float | int) or not 0 < cap < float("inf"):
        raise UnsupportedError(f"vk softcap: cap must be a finite number > 0, got {cap!r}")
    return _map1("vk softcap", 1, x, cap, out)


def _map1(what: str, op: int, x: VkTensor, c: float, out: VkTensor | None) -> VkTensor:
    _check(what, "x", x, "F32", contiguous=True)
    if isinstance(c, bool) or not isinstance(c, float | int) or not math.isfinite(c):
        raise UnsupportedError(f"{what}: the constant must be a finite number, got {c!r}")
    out = _out(what, out, x, x.shape)
    if x.numel:
        x.dev.dispatch(x.dev.pipeline("map1", {"WG": WG, "OP": op}), [x, _at(out)], [x.numel, x.offset, float(c)],
                       _grid_2d(x.numel, WG))
    return out


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
