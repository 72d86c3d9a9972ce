"""F32 -> Q8_0 on the device against minfer.quant.reference.quantize (ggml's quantizer), bit for bit."""

from __future__ import annotations

import pytest
import torch

from minfer.errors import UnsupportedError
from minfer.kernels.triton.dequant import dequant
from minfer.kernels.triton.quantize import BLOCK, quantize_q8_0
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


# ---- the int8 activations of the dp4a GEMVs (quantize_act_q8) -----------------------------------


def decode_act(codes: torch.Tensor, scales: torch.Tensor, passes: int) -> torch.Tensor:
    """x_hat [m, k] float64 from quantize_act_q8's output, decoded from the layout its docstring
    states (pass p's word j byte t: element 8 t + j; word 4 + j byte t: element 8 t + 4 + j)."""
    m, nb, _ = codes.shape
    c = codes.cpu().reshape(m, nb, passes, 8).contiguous().view(torch.int8).reshape(m, nb, passes, 2, 4, 4)
    # [.., pass, h (word // 4), j (word % 4), t (byte)] -> element 8 t + 4 h + j
    q = c.permute(0, 1, 2, 5, 3, 4).reshape(m, nb, passes, 32).double()
    s = scales.cpu().double()
    x = q[:, :, 0] * s[:, :, 0, None]
    if passes == 2:
        x += q[:, :, 1] * s[:, :, 1, None]
    return x.reshape(m, nb * 32)


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("shape", [(1, 32), (3, 160), (2, 32 * 70)])
def test_quantize_act_q8(shape, passes, device, gen, check):
    from minfer.kernels.triton.quantize import quantize_act_q8

    x = _rows(shape, gen, -3, 3)
    m, k = shape
    poison = (torch.full((m, k // 32, 8 * passes), -1, dtype=torch.int32, device=device),
              check.poisoned((m, k // 32, 4), torch.float32, device))
    codes, scales = quantize_act_q8(x.to(device), passes, out=poison)
    xb = x.double().view(m, -1, 32)
    amax = xb.abs().amax(-1)
    d1 = scales[..., 0].cpu().double()
    assert torch.allclose(d1, amax / 127, rtol=1e-6)
    x_hat = decode_act(codes, scales, passes).view(m, -1, 32)
    err = (x_hat - xb).abs().amax(-1)
    # one pass: round to nearest, |err| <= d1 / 2; two: the residue's own step (about d1 / 254), plus
    # the f32 rounding of the residue x - d1 q1 (a few ulp of max|x|)
    if passes == 1:
        bound = d1 * (0.5 + 1e-5)
    else:
        bound = scales[..., 1].cpu().double() * (0.5 + 1e-5) + amax * 2.0**-21
    assert (err <= bound).all()
    assert check.rel_err(scales[..., 2], x_hat.sum(-1)) < 1e-6  # s = the decoded block's sum
    assert scales[..., 3].eq(0).all()
    if passes == 2:
        assert (scales[..., 1] <= scales[..., 0] / 250).all()


def test_quantize_act_q8_zero_blocks_and_misuse(device):
    from minfer.kernels.triton.quantize import quantize_act_q8

    codes, scales = quantize_act_q8(torch.zeros(1, 64, device=device), 2)
    assert codes.eq(0).all() and scales.eq(0).all()  # an all-zero block: zero scales, zero codes
    with pytest.raises(UnsupportedError, match="multiple of 32"):
        quantize_act_q8(torch.zeros(1, 48, device=device))
    with pytest.raises(UnsupportedError, match="passes must be 1 or 2"):
        quantize_act_q8(torch.zeros(1, 32, device=device), 3)
