"""Device dequant of every ggml type against minfer.quant.reference, bit for bit.

Inputs are random bytes: every bit pattern of the quant fields is fair game, including scales
that decode to inf/NaN (the kernel and the reference must agree on those too). f32 output must
equal the reference exactly; f16/bf16 output must equal the reference rounded to nearest even.
"""

from __future__ import annotations

import pytest
import torch

from minfer.errors import UnsupportedError
from minfer.kernels.triton.dequant import blocks_per_program, dequant
from minfer.quant import reference
from minfer.quant.types import QUANT_TABLE, GGMLType, QuantInfo

TYPES = list(QUANT_TABLE.values())
OUT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _raw(info: QuantInfo, rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    n = rows * cols // info.block_elems * info.block_bytes
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)


def _shapes(info: QuantInfo) -> list[tuple[int, int]]:
    """A partial last program (3 rows of 5 blocks; floats: 37 elements) and exactly one full one."""
    per_program = blocks_per_program(info)
    if info.block_elems == 1:
        return [(3, 37), (2, per_program // 2)]
    return [(3, 5 * info.block_elems), (1, per_program * info.block_elems)]


@pytest.mark.parametrize("info", TYPES, ids=lambda i: i.name)
def test_dequant_matches_reference(info, device, gen, check):
    for rows, cols in _shapes(info):
        raw = _raw(info, rows, cols, gen)
        ref = reference.dequantize(raw, info.type, (rows, cols))
        for dtype in OUT_DTYPES:
            out = check.poisoned((rows, cols), dtype, device)
            dequant(raw.to(device), info.type, rows, cols, dtype, out=out)
            check.same_values(out, ref.to(dtype))


@pytest.mark.parametrize(
    "qtype, ggml",
    [(GGMLType.Q4_0, GGMLType.Q4_0), ("q6_k", GGMLType.Q6_K), ("Q4K", GGMLType.Q4_K), (1, GGMLType.F16)],
)
def test_one_block_and_qtype_spellings(qtype, ggml, device, gen, check):
    info = QUANT_TABLE[ggml]
    raw = _raw(info, 1, info.block_elems, gen)
    out = dequant(raw.to(device), qtype, 1, info.block_elems, torch.float32)
    check.same_values(out, reference.dequantize(raw, info.type, (1, info.block_elems)))


def test_realistic_weights(device, gen, check):
    """Quantized normal weights (what a model holds), through Q4_0 and Q8_0 into bf16."""
    w = torch.randn(6, 256, generator=gen)
    for qtype in (GGMLType.Q4_0, GGMLType.Q8_0):
        raw = reference.quantize(w, qtype)
        out = dequant(raw.to(device), qtype, 6, 256, torch.bfloat16)
        check.same_values(out, reference.dequantize(raw, qtype, (6, 256)).to(torch.bfloat16))


def test_empty(device):
    out = dequant(torch.empty(0, dtype=torch.uint8, device=device), GGMLType.Q4_K, 0, 512)
    assert out.shape == (0, 512) and out.dtype == torch.float16


def test_invariants(device):
    raw = torch.zeros(4 * 18, dtype=torch.uint8, device=device)
    with pytest.raises(UnsupportedError, match="multiple of 32"):
        dequant(raw, GGMLType.Q4_0, 2, 48)
    with pytest.raises(UnsupportedError, match="needs 54 bytes, got 72"):
        dequant(raw, GGMLType.Q4_0, 1, 96)
    with pytest.raises(UnsupportedError, match="dtype uint8"):
        dequant(raw.to(torch.int8), GGMLType.Q4_0, 2, 64)
    with pytest.raises(UnsupportedError, match="unknown ggml type id 99"):
        dequant(raw, 99, 2, 64)
    with pytest.raises(UnsupportedError, match="out_dtype"):
        dequant(raw, GGMLType.Q4_0, 2, 64, torch.int32)
    with pytest.raises(UnsupportedError, match="shape"):
        dequant(raw, GGMLType.Q4_0, 2, 64, out=torch.empty(64, 2, dtype=torch.float16, device=device))
    with pytest.raises(UnsupportedError, match="float32"):  # f32 data that is not 4-byte aligned
        dequant(torch.zeros(17, dtype=torch.uint8, device=device)[1:], GGMLType.F32, 2, 2)
