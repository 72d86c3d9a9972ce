"""Embedding gather with dequant: out[t, :] = decode(weight row ids[t]) for every quant type.

The first op of every forward (seed 000 §3.3). `weight` is the token-embedding tensor as raw
GGUF blocks: n_vocab rows of n_embd elements, row-major, each row a run of quant blocks, so row
`id` starts at byte id * row_bytes. Token ids are int32 on the device, so a decode step needs no
host round trip and can be captured in a CUDA graph.

The kernel is dequant's (`_dequant_kernel` with GATHER on, so both share every decoder): its
programs walk the flat output blocks of all rows (full programs whatever the row length), and each
block finds its token as block // blocks_per_row; offsets are int64.

Out-of-range ids: the kernel never reads outside the table. A program whose id is outside
[0, n_vocab) reads row 0 instead (an in-bounds address) and writes NaN for the whole output row:
the bad token is visible downstream, never silently replaced by another token's vector (which is
what clamping would do). That device-side guard is the default and costs nothing. With
`validate=True` the launcher also checks the ids on the host first (one min/max reduction and a
device-to-host sync) and raises UnsupportedError naming the first bad id: for callers outside the
hot loop (tests, tools), never for a decode step.
"""

from __future__ import annotations

import torch

from ...errors import UnsupportedError
from ...quant.types import GGMLType
from ._common import cdiv, check_device, check_grid, check_int, check_tensor, make_out
from .dequant import (
    MAGIC,
    NUM_WARPS,
    _dequant_kernel,
    blocks_per_program,
    gather_tile,
    kernel_source,
    resolve_qtype,
)


def _check_ids(what: str, ids: torch.Tensor, n_vocab: int) -> None:
    """Raise UnsupportedError naming the first id outside [0, n_vocab) (one reduction + sync)."""
    lo, hi = (int(v) for v in torch.aminmax(ids.reshape(-1)))
    if lo < 0 or hi >= n_vocab:
        flat = ids.reshape(-1)
        first = int(flat[(flat < 0) | (flat >= n_vocab)][0])
        raise UnsupportedError(f"{what}: token id {first} is outside the vocabulary [0, {n_vocab})")


def embed_rows(
    weight_u8: torch.Tensor,
    qtype: GGMLType | int | str,
    ids: torch.Tensor,
    n_embd: int,
    out: torch.Tensor | None = None,
    validate: bool = False,
) -> torch.Tensor:
    """Rows `ids` of the [n_vocab, n_embd] table stored as GGUF blocks of `qtype`, as f32 [n_ids, n_embd].

    `weight_u8`: contiguous uint8 tensor, a whole number of rows (n_vocab = bytes / row_bytes),
    4-byte aligned. `ids`: contiguous int32 tensor of token ids (any shape; flattened) on the same
    device. `validate`: also check the ids on the host and raise on a bad one (a device sync; see
    the module doc); by default a bad id yields a NaN row and no sync.
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
        _check_ids(what, ids, n_vocab)
    if n_ids:
        src, block_stride = kernel_source(what, weight_u8, info)
        run, meta = gather_tile(info, n_embd)
        bpr = n_embd // run  # gather blocks per row
        n_blocks = n_ids * bpr
        if n_blocks >= 2**31:
            raise UnsupportedError(f"{what}: {n_ids} ids x {bpr} blocks per row is past the 2^31 block limit")
        block = blocks_per_program(info) * info.block_elems // run  # dequant's elements per program
        grid = check_grid(what, (cdiv(n_blocks, block),))
        _dequant_kernel[grid](
            src, out, ids, n_blocks, bpr, n_vocab, MAGIC,
            BLOCK_BYTES=block_stride * (run // info.block_elems),
            BLOCK=block, EVEN=n_blocks % block == 0, GATHER=True, **meta, num_warps=NUM_WARPS,
            enable_fp_fusion=False,
        )
    return out
