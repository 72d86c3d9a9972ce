"""F32 -> Q8_0 on the device against minfer.quant.reference.quantize (ggml's quantizer), bit for bit."""

from __future__ import annotations

import pytest
import torch

from minfer.errors import UnsupportedError
from minfer.kernels.dequant import dequant
from minfer.kernels.quantize import BLOCK, quantize_q8_0
from minfer.quant import reference
from minfer.quant.types import GGMLType


def _rows(shape, gen, lo=-6, hi=6):
    """Normal values with one magnitude per 32-block, from 10^lo to 10^hi."""
    x = torch.randn(shape, generator=gen)
    blocks = x.view(-1, 32)
    blocks *= torch.logspace(lo, hi, blocks.shape[0])[torch.randperm(blocks.shape[0], generator=gen)][:, None]
    return x


@pytest.mark.parametrize("shape", [(1, 32), (7, 96), (3, 2, 64), (1, 32 * (BLOCK + 1))])
def test_quantize_matches_reference(shape, device, gen, check):
    x = _rows(shape, gen)
    n_bytes = shape[-1] // 32 * 34
    out = quantize_q8_0(x.to(device), out=check.poisoned((*shape[:-1], n_bytes), torch.uint8, device))
    assert torch.equal(out.cpu(), reference.quantize(x, GGMLType.Q8_0))


def test_zero_block_and_ties(device, check):
    x = torch.zeros(2, 32)
    # block 1: max|x| = 127, so d = 1 and x/d lands exactly on halves: they round away from zero
    x[1, :6] = torch.tensor([127.0, 63.5, -63.5, 0.5, -0.5, -2.5])
    out = quantize_q8_0(x.to(device)).cpu()
    assert torch.equal(out, reference.quantize(x, GGMLType.Q8_0))
    assert out[0].eq(0).all()  # all-zero block: d = 0 and zero codes
    assert out[1, 2:8].view(torch.int8).tolist() == [127, 64, -64, 1, -1, -3]


def test_round_trip_through_dequant(device, gen):
    """Q8_0 as KV-cache storage: each value comes back within about half a step d of itself.

    |q * f16(d) - x| <= |q * d - x| + |q| * |f16(d) - d| <= d / 2 + 127 * d * 2^-11 while d is a
    normal f16 (block maxima 1e-2 .. 1e4 here).
    """
    x = _rows((4, 128), gen, -2, 4)
    back = dequant(quantize_q8_0(x.to(device)), GGMLType.Q8_0, 4, 128, torch.float32).cpu()
    d = x.view(-1, 32).abs().amax(dim=1, keepdim=True) / 127
    err = (back - x).abs().view(-1, 32)
    assert (err <= d * (0.5 + 127 * 2**-11) * (1 + 2**-20)).all()


def test_invariants(device):
    x = torch.zeros(2, 48, device=device)
    with pytest.raises(UnsupportedError, match="multiple of 32"):
        quantize_q8_0(x)
    with pytest.raises(UnsupportedError, match="dtype float32"):
        quantize_q8_0(x[:, :32].half())
    with pytest.raises(UnsupportedError, match="shape"):
        quantize_q8_0(x[:, :32].contiguous(), out=torch.empty(2, 32, dtype=torch.uint8, device=device))
