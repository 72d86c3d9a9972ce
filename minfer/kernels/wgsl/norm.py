"""The WGSL RMSNorms (vk_rms_norm, vk_add_rms_norm: norm.fkc.md), optionally writing their output's
int8 records (`q8=`, a quantize.q8_records buffer) for the qmv8 GEMV after them."""

from __future__ import annotations

from ...errors import UnsupportedError
from ._common import MAX_GROUPS, SHADERS, VkTensor, _at, _check, _grid_2d, _host_bridge, _out, _rows
from .quantize import records_passes

REVISION_SOURCES = SHADERS
NORM_WG = 256  # rms_norm: 16 elements an invocation per round (4 quads, loads first): a 7B row in 1 round


@_host_bridge()
def rms_norm(x: VkTensor, w: VkTensor, eps: float, out: VkTensor | None = None,
             q8: VkTensor | None = None, group: int | None = None) -> VkTensor:
    """out [rows, d] = x * rsqrt(mean(x^2) + eps) * w per row; x may be row-strided. q8: a
    q8_records buffer (d a multiple of 32) the same dispatch fills with out's int8 records
    (q8_act.wgsl) for the qmv8 GEMV it feeds. `group`: each run of `group` values of a row normed
    on its own, w [group] shared by the runs (the per-head q / k norms; no records then)."""
    what = "vk rms_norm"
    _check(what, "x", x, "F32", (1, 2))
    _check(what, "w", w, "F32", (1,), contiguous=True)
    width = x.shape[-1]
    d = width if group is None else group
    if w.numel != d or width % d or (group is not None and q8 is not None):
        raise UnsupportedError(f"{what}: w must be [{d}] and divide x's width {width} (group {group}; a grouped "
                               f"norm writes no int8 records), got w {w.shape}")
    if not (isinstance(eps, float | int) and eps >= 0):
        raise UnsupportedError(f"{what}: eps must be a number >= 0, got {eps!r}")
    rows = _rows(x)
    out = _out(what, out, x, x.shape)
    if q8 is not None:
        if rows > MAX_GROUPS:
            raise UnsupportedError(f"{what}: {rows} rows exceed one dispatch")
        passes = records_passes(what, q8, rows, d)
        pipe = x.dev.pipeline("rms_sumsq+q8_act+rms_norm_q8+norm_q8_main", {"WG": NORM_WG, "P8": passes})
        x.dev.dispatch(pipe, [x, w, _at(out), q8], [d, x.offset, x.stride, float(eps)],
                       (-(-d // (4 * NORM_WG)), rows))  # 4 elements an invocation: many workgroups a row
        return out
    groups = width // d
    n_rows = rows * groups
    if n_rows:
        pipe = x.dev.pipeline("rms_sumsq+rms_norm", {"WG": NORM_WG})
        x.dev.dispatch(pipe, [x, w, _at(out)], [d, x.offset, x.stride, float(eps), groups, n_rows],
                       _grid_2d(n_rows, 1))
    return out


@_host_bridge(mutates=("sum_out",))
def add_rms_norm(x: VkTensor, y: VkTensor, w: VkTensor, eps: float, out: VkTensor | None = None,
                 sum_out: VkTensor | None = None, q8: VkTensor | None = None) -> VkTensor:
    """out [rows, d] = RMSNorm(h) per row and h = x + y written to `sum_out` (a fresh tensor, then
    dropped, when None): the residual add and the norm after it in one dispatch, h bit-equal to
    `add`'s and out (and the records it writes into `q8`) to `rms_norm`'s of h. x, y contiguous.

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
    if q8 is not None:
        passes = records_passes(what, q8, rows, d)
        pipe = x.dev.pipeline("add_norm_io+rms_sumsq+q8_act+add_rms_norm_q8+norm_q8_main",
                              {"WG": NORM_WG, "P8": passes})
        x.dev.dispatch(pipe, [x, y, w, _at(out), _at(sum_out), q8], params, (-(-d // (4 * NORM_WG)), rows))
        return out
    pipe = x.dev.pipeline("add_norm_io+rms_sumsq+add_rms_norm", {"WG": NORM_WG})
    x.dev.dispatch(pipe, [x, y, w, _at(out), _at(sum_out)], params, (rows,))
    return out
