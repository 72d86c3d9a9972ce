"""The WGSL row selection and greedy pick (vk_row_select, vk_argmax: select.fkc.md): the rows a
step returns, and each row's argmax on the device."""

from __future__ import annotations

from ...errors import UnsupportedError
from ._common import MAX_GROUPS, SHADERS, WG, VkTensor, _at, _check, _host_bridge, _out

REVISION_SOURCES = SHADERS
ARGMAX_WG = 256  # argmax: 4 elements an invocation, a row over many workgroups, then a merge


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
