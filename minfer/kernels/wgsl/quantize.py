"""The WGSL quantizers: f32 to GGML Q8_0 blocks (vk_quantize_q8_0: quantize.fkc.md), and x's int8
records for the qmv8 GEMV (`quantize_q8_1`, q8_act.wgsl), which the norms, SwiGLU and attention
feeding such a GEMV write into a `q8_records` buffer in their own dispatch instead (their `q8=`;
the GEMV reads it as its `xq=`; the compiler pairs the two, backends/compile.py)."""

from __future__ import annotations

import dataclasses

from ...errors import UnsupportedError
from ._common import SHADERS, WG, VkTensor, _check, _grid_2d, _host_bridge, _rows

REVISION_SOURCES = SHADERS


def q8_layout(passes: int) -> str:
    return f"q8_1x{passes}"


def q8_records(dev, rows: int, k: int, passes: int) -> VkTensor:
    """An empty buffer of x's int8 records (q8_act.wgsl): per row and 32-block 2 * passes + 1 16-byte words,
    in planes (word w of a row's block b at w * k / 32 + b)."""
    return dataclasses.replace(dev.empty((rows, k // 32 * (2 * passes + 1) * 16), "U8"), layout=q8_layout(passes))


def records_passes(what: str, rec: VkTensor, rows: int, k: int) -> int:
    """The passes of a q8_records buffer meant for `rows` rows of `k` (UnsupportedError otherwise)."""
    for passes in (1, 2):
        if rec.layout == q8_layout(passes) and rec.shape == (rows, k // 32 * (2 * passes + 1) * 16) and k % 32 == 0:
            return passes
    raise UnsupportedError(f"{what}: q8 records must be q8_records(dev, {rows}, {k}, passes) (k a multiple of 32), "
                           f"got a {rec.layout} buffer of {rec.shape}")


@_host_bridge()
def quantize_q8_1(x: VkTensor, passes: int = 2, out: VkTensor | None = None) -> VkTensor:
    """x [m, k] f32 (row-strided) -> its int8 records (q8_act.wgsl): per 32-block the codes of
    `passes` passes (the second quantizes the first's rounding error) and (d, s = d * sum(codes));
    into `out` (a q8_records buffer) when given."""
    what = "vk quantize_q8_1"
    _check(what, "x", x, "F32", (1, 2))
    m, k = _rows(x), x.shape[-1]
    if k % 32 or passes not in (1, 2):
        raise UnsupportedError(f"{what}: x's rows must be a multiple of 32 long (got {k}), passes 1 or 2")
    if out is None:
        out = q8_records(x.dev, m, k, passes)
    elif records_passes(what, out, m, k) != passes:
        raise UnsupportedError(f"{what}: out holds records of another passes count than {passes}")
    gx, gy = _grid_2d(m * (k // 4), WG)  # an invocation per 4 elements (q8_act.wgsl's q8_quad)
    x.dev.dispatch(x.dev.pipeline("q8_act+quantize_q8_1", {"WG": WG, "P8": passes}), [x, out],
                   [m, k, x.offset, x.stride, gx], (gx, gy))
    return out


def _q8_of(x: VkTensor, passes: int, xq: VkTensor | None = None) -> VkTensor:
    """x's int8 records: `xq`, the ones its producer wrote (rms_norm / swiglu / attention with q8=),
    else quantized now (one dispatch)."""
    if xq is not None:
        if records_passes("vk matmul", xq, _rows(x), x.shape[-1]) != passes:
            raise UnsupportedError(f"vk matmul: xq holds records of another passes count than {passes}")
        return xq
    return quantize_q8_1(x=x, passes=passes)


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
