"""Embedding gather with dequant: out[t, :] = decode(weight row ids[t]) for every quant type.

The first op of every forward (seed 000 §3.3). `weight` is the token-embedding tensor as raw
GGUF blocks: n_vocab rows of n_embd elements, row-major, each row a run of quant blocks, so row
`id` starts at byte id * row_bytes. Token ids are int32 on the device, so a decode step needs no
host round trip and can be captured in a CUDA graph.

Grid: axis 0 is the token (one id load per program), axis 1 walks the row's quant blocks in
chunks of BLOCK; each program decodes a [BLOCK, NSUB, SUBLEN] tile with the shared per-type
decoder `decode_block` of dequant.py (no copy of the block layouts here). Offsets are int64.

Out-of-range ids: the kernel never reads outside the table. A program whose id is outside
[0, n_vocab) reads row 0 instead (an in-bounds address) and writes NaN for the whole output row:
the bad token is visible downstream, never silently replaced by another token's vector (which
is what clamping would do). With `validate=True` (the default) the launcher also checks the ids
with one torch reduction and raises UnsupportedError naming the first bad id; that costs a
device-to-host sync, so the decode loop (CUDA-graph capture) passes validate=False.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import UnsupportedError
from ..quant.types import GGMLType
from ._common import cdiv, check_device, check_grid, check_int, check_tensor, make_out
from .dequant import blocks_per_program, decode_block, kernel_source, resolve_qtype, tile_meta

NUM_WARPS = 4


@triton.jit
def _embed_kernel(
    w_ptr,
    ids_ptr,
    out_ptr,
    n_vocab,
    blocks_per_row,
    QTYPE: tl.constexpr,
    BLOCK_BYTES: tl.constexpr,
    NSUB: tl.constexpr,
    SUBLEN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    tok = tl.load(ids_ptr + t).to(tl.int64)
    valid = (tok >= 0) & (tok < n_vocab)
    tok = tl.where(valid, tok, 0)
    b = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    b3 = b[:, None, None]
    mask = b3 < blocks_per_row
    sub = tl.arange(0, NSUB)[None, :, None]
    l = tl.arange(0, SUBLEN)[None, None, :]
    src = w_ptr + (tok * blocks_per_row + b3) * BLOCK_BYTES
    vals = decode_block(src, sub, l, mask, QTYPE)
    vals = tl.where(valid, vals, float("nan"))
    row_elems = blocks_per_row * (NSUB * SUBLEN)
    dst = out_ptr + t * row_elems + b3 * (NSUB * SUBLEN) + sub * SUBLEN + l
    tl.store(dst, vals, mask=mask)


def embed_rows(
    weight_u8: torch.Tensor,
    qtype: GGMLType | int | str,
    ids: torch.Tensor,
    n_embd: int,
    out: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Rows `ids` of the [n_vocab, n_embd] table stored as GGUF blocks of `qtype`, as f32 [n_ids, n_embd].

    `weight_u8`: contiguous uint8 tensor, a whole number of rows (n_vocab = bytes / row_bytes).
    `ids`: contiguous int32 tensor of token ids (any shape; flattened) on the same device.
    `validate`: check ids on the host (one reduction + sync); see the module doc for what an
    out-of-range id does without it.
    """
    what = "embed_rows"
    info = resolve_qtype(what, qtype)
    check_tensor(what, "weight_u8", weight_u8, (torch.uint8,))
    check_tensor(what, "ids", ids, (torch.int32,))
    check_int(what, "n_embd", n_embd, 1)
    if n_embd % info.block_elems:
        raise UnsupportedError(
            f"{what}: {info.name} rows must be whole blocks: "
            f"n_embd={n_embd} is not a multiple of {info.block_elems}"
        )
    blocks_per_row = n_embd // info.block_elems
    row_bytes = blocks_per_row * info.block_bytes
    if weight_u8.numel() % row_bytes:
        raise UnsupportedError(
            f"{what}: {weight_u8.numel()} bytes is not a whole number of {info.name} rows "
            f"of {n_embd} elements ({row_bytes} bytes)"
        )
    n_vocab = weight_u8.numel() // row_bytes
    device = check_device(what, weight_u8=weight_u8, ids=ids, out=out)
    n_ids = ids.numel()
    out = make_out(what, out, (n_ids, n_embd), torch.float32, device)
    if validate and n_ids:
        bad = (ids < 0) | (ids >= n_vocab)
        if bool(bad.any()):
            first = int(ids.reshape(-1)[bad.reshape(-1)][0])
            raise UnsupportedError(f"{what}: token id {first} is outside the vocabulary [0, {n_vocab})")
    if n_ids:
        src, block_stride = kernel_source(what, weight_u8, info)
        block = min(blocks_per_program(info), triton.next_power_of_2(blocks_per_row))
        grid = check_grid(what, (n_ids, cdiv(blocks_per_row, block)))
        _embed_kernel[grid](
            src, ids, out, n_vocab, blocks_per_row, BLOCK_BYTES=block_stride, BLOCK=block,
            **tile_meta(info), num_warps=NUM_WARPS, enable_fp_fusion=False,
        )
    return out
