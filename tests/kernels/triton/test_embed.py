"""Embedding gather with dequant against rows of the reference-decoded table, bit for bit."""

from __future__ import annotations

import pytest
import torch

from minfer.errors import UnsupportedError
from minfer.kernels.triton.dequant import blocks_per_program
from minfer.kernels.triton.embed import embed_rows
from minfer.quant import reference
from minfer.quant.types import QUANT_TABLE, GGMLType

TYPES = list(QUANT_TABLE.values())
N_VOCAB = 9


def _table(info, n_embd, gen):
    n_bytes = N_VOCAB * n_embd // info.block_elems * info.block_bytes
    raw = torch.randint(0, 256, (n_bytes,), dtype=torch.uint8, generator=gen)
    return raw, reference.dequantize(raw, info.type, (N_VOCAB, n_embd))


@pytest.mark.parametrize("info", TYPES, ids=lambda i: i.name)
def test_embed_matches_reference(info, device, gen, check):
    n_embd = 45 if info.block_elems == 1 else 2 * info.block_elems
    raw, table = _table(info, n_embd, gen)
    ids = torch.randint(0, N_VOCAB, (6,), dtype=torch.int32, generator=gen)
    ids[-1] = ids[0]  # a repeated token
    out = check.poisoned((6, n_embd), torch.float32, device)
    embed_rows(raw.to(device), info.type, ids.to(device), n_embd, out=out)
    check.same_values(out, table[ids.long()])


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.F16])
def test_rows_longer_than_a_program(qtype, device, gen, check):
    info = QUANT_TABLE[qtype]
    n_embd = (blocks_per_program(info) + 1) * info.block_elems  # two programs per row, the second partial
    raw, table = _table(info, n_embd, gen)
    ids = torch.tensor([N_VOCAB - 1, 0], dtype=torch.int32)
    out = check.poisoned((2, n_embd), torch.float32, device)
    embed_rows(raw.to(device), qtype, ids.to(device), n_embd, out=out)
    check.same_values(out, table[ids.long()])


def test_out_of_range_ids(device, gen, check):
    info = QUANT_TABLE[GGMLType.Q8_0]
    raw, table = _table(info, 64, gen)
    ids = torch.tensor([2, -1, N_VOCAB, 5], dtype=torch.int32, device=device)
    with pytest.raises(UnsupportedError, match=f"token id -1 is outside the vocabulary \\[0, {N_VOCAB}\\)"):
        embed_rows(raw.to(device), GGMLType.Q8_0, ids, 64, validate=True)
    with pytest.raises(UnsupportedError, match=f"token id {N_VOCAB} is outside"):
        embed_rows(raw.to(device), GGMLType.Q8_0, ids[2:], 64, validate=True)
    out = embed_rows(raw.to(device), GGMLType.Q8_0, ids, 64)  # the default: no host sync, NaN rows
    check.same_values(out[[0, 3]], table[[2, 5]])
    assert torch.isnan(out[[1, 2]]).all()


def test_empty_ids(device):
    table = torch.zeros(3 * 34, dtype=torch.uint8, device=device)
    out = embed_rows(table, GGMLType.Q8_0, torch.empty(0, dtype=torch.int32, device=device), 32)
    assert out.shape == (0, 32)


def test_invariants(device):
    w = torch.zeros(4 * 18, dtype=torch.uint8, device=device)  # 2 rows of 64 Q4_0 values
    ids = torch.zeros(3, dtype=torch.int32, device=device)
    with pytest.raises(UnsupportedError, match="dtype int32"):
        embed_rows(w, GGMLType.Q4_0, ids.long(), 64)
    with pytest.raises(UnsupportedError, match="multiple of 32"):
        embed_rows(w, GGMLType.Q4_0, ids, 48)
    with pytest.raises(UnsupportedError, match="whole number"):
        embed_rows(w, GGMLType.Q4_0, ids, 96)
    with pytest.raises(UnsupportedError, match="shape"):
        embed_rows(w, GGMLType.Q4_0, ids, 64, out=torch.empty(3, 32, device=device))
    k_table = torch.zeros(2 * 144 + 2, dtype=torch.uint8, device=device)[2:]  # Q4_K rows, 2-byte aligned
    with pytest.raises(UnsupportedError, match="4-byte aligned"):
        embed_rows(k_table, GGMLType.Q4_K, ids, 256)
