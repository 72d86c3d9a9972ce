"""The WGSL embedding gather and dequantizers (vk_get_rows, vk_dequant_*: dequant.fkc.md): GGUF
blocks decoded to f32 by the storage type's `q_<type>.wgsl` decoder."""

from __future__ import annotations

import torch

from ...errors import UnsupportedError
from ._common import MAX_GROUPS, SHADERS, WG, VkTensor, _check, _host_bridge, _out, _qinfo

REVISION_SOURCES = SHADERS


@_host_bridge()
def get_rows(weight_u8: VkTensor, ids: VkTensor, qtype, n_embd: int, out: VkTensor | None = None,
             first_row: int = 0, total_rows: int | None = None) -> VkTensor:
    """out [n_ids, n_embd] f32 = the table rows `ids` decoded (the embedding gather). A chunk
    (`first_row`, `total_rows`: the table is rows first_row.. of one of total_rows rows) writes only
    the ids in its rows, into the `out` every chunk's call shares."""
    what = "vk get_rows"
    q = _qinfo(what, qtype)
    _check(what, "weight_u8", weight_u8, "U8", contiguous=True)
    _check(what, "ids", ids, "I32", (1,), contiguous=True)
    row_bytes = q.nbytes(n_embd)
    n_rows = weight_u8.numel // row_bytes
    if n_rows * row_bytes != weight_u8.numel or weight_u8.offset:
        raise UnsupportedError(f"{what}: the table must be whole rows of {row_bytes} bytes from byte 0")
    total = n_rows if total_rows is None else total_rows
    if not (isinstance(first_row, int) and isinstance(total, int) and 0 <= first_row
            and first_row + n_rows <= total):
        raise UnsupportedError(f"{what}: a chunk of {n_rows} rows from row {first_row} does not fit a table of "
                               f"{total} rows")
    n_ids = ids.numel
    out = _out(what, out, ids, (n_ids, n_embd))
    pipe = ids.dev.pipeline("get_rows", {"WG": WG}, q.name)
    ids.dev.dispatch(pipe, [weight_u8, ids, out], [n_embd, row_bytes, n_rows, out.offset, first_row, total],
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
