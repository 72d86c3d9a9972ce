"""Elementwise kernels against torch (exact f32 IEEE results) and float64 math (SiLU, SwiGLU)."""

from __future__ import annotations

import pytest
import torch

from minfer.errors import UnsupportedError
from minfer.kernels.triton import elementwise as ew

# 1 element, a partial program, exactly one program, one more than a program, 2-D
SHAPES = [(1,), (7, 33), (ew.BLOCK,), (ew.BLOCK + 1,), (3, 1500)]


def _randn(shape, gen, device, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(device)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op, ref", [(ew.add_f32, torch.add), (ew.mul_f32, torch.mul)])
def test_add_mul_exact(shape, op, ref, device, gen, check):
    x, y = _randn(shape, gen, device, 10.0), _randn(shape, gen, device, 10.0)
    out = op(x, y, out=check.poisoned(shape, torch.float32, device))
    check.same_values(out, ref(x, y))  # one IEEE rounding, as torch's f32 op


def test_add_in_place(device, gen, check):
    x, y = _randn((5, 9), gen, device), _randn((5, 9), gen, device)
    want = x + y
    assert ew.add_f32(x, y, out=x) is x
    check.same_values(x, want)


@pytest.mark.parametrize("shape", [(1,), (7, 33), (ew.BLOCK + 1,)])
def test_silu(shape, device, gen, check):
    x = _randn(shape, gen, device, 4.0)
    out = ew.silu_f32(x, out=check.poisoned(shape, torch.float32, device))
    assert check.rel_err(out, torch.nn.functional.silu(x.double())) < 2e-6  # f32 exp + divide


@pytest.mark.parametrize(
    "dtype, tol",
    [(torch.float32, 2e-6), (torch.float16, 2**-10), (torch.bfloat16, 2**-7)],  # f32 math, one final rounding
)
def test_swiglu(dtype, tol, device, gen, check):
    shape = (5, 700)
    gate, up = _randn(shape, gen, device, 3.0).to(dtype), _randn(shape, gen, device, 3.0).to(dtype)
    out = ew.swiglu(gate, up, out=check.poisoned(shape, dtype, device))
    ref = torch.nn.functional.silu(gate.double()) * up.double()
    assert out.dtype == dtype and check.rel_err(out, ref) < tol


@pytest.mark.parametrize(
    "op, dtype", [(ew.convert_f32_f16, torch.float16), (ew.convert_f32_bf16, torch.bfloat16)]
)
def test_convert_exact(op, dtype, device, gen, check):
    x = torch.randn(3000, generator=gen) * torch.logspace(-9, 6, 3000)  # f16 subnormals .. overflow
    # ties: halfway between two neighbours of the narrow type must round to the even one
    x[:4] = torch.tensor([1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8, 1 + 3 * 2**-8])
    x[4:8] = torch.tensor([float("inf"), float("-inf"), float("nan"), 3.0e38])
    x = x.to(device)
    out = op(x, out=check.poisoned(x.shape, dtype, device))
    check.same_values(out, x.to(dtype))


@pytest.mark.parametrize("n_rows, d", [(1, 5), (7, 1500), (3, ew.BIAS_BLOCK)])
def test_add_bias(n_rows, d, device, gen, check):
    y, b = _randn((n_rows, d), gen, device), _randn((d,), gen, device)
    want = y + b
    assert ew.add_bias_f32(y, b, n_rows) is y
    check.same_values(y, want)


def test_add_bias_rejects_element_count(device, gen):
    y, b = _randn((4, 6), gen, device), _randn((6,), gen, device)
    before = y.clone()
    with pytest.raises(UnsupportedError, match="row count"):
        ew.add_bias_f32(y, b, y.numel())  # the seed 000 §3.1 trap: elements instead of rows
    assert torch.equal(y, before)


def test_invariants(device, gen):
    x = _randn((4, 6), gen, device)
    with pytest.raises(UnsupportedError, match="dtype"):
        ew.add_f32(x.half(), x.half())
    with pytest.raises(UnsupportedError, match="same shape"):
        ew.mul_f32(x, x[:2])
    with pytest.raises(UnsupportedError, match="contiguous"):
        ew.silu_f32(x.t())
    with pytest.raises(UnsupportedError, match="shape"):
        ew.add_f32(x, x, out=torch.empty(24, device=device))
    with pytest.raises(UnsupportedError, match="dtype"):
        ew.convert_f32_f16(x, out=torch.empty(4, 6, dtype=torch.bfloat16, device=device))
    with pytest.raises(UnsupportedError, match="dtype"):
        ew.swiglu(x, x.half())
    with pytest.raises(UnsupportedError, match="rank 1"):
        ew.add_bias_f32(x, x, 4)
    with pytest.raises(UnsupportedError, match="n_rows"):
        ew.add_bias_f32(x, x[0], -1)


def test_empty(device):
    x = torch.empty(0, 5, device=device)
    assert ew.add_f32(x, x).shape == (0, 5)


def test_add_rms_norm_writes_the_sum_where_asked(device, gen, check):
    from minfer.kernels.triton.norm import add_rms_norm, rms_norm

    x, y = torch.randn(3, 40, generator=gen).to(device), torch.randn(3, 40, generator=gen).to(device)
    w = torch.randn(40, generator=gen).to(device)
    want_sum = x.double() + y.double()
    want = want_sum / torch.sqrt((want_sum ** 2).mean(-1, keepdim=True) + 1e-5) * w.double()
    x0 = x.clone()
    pure = add_rms_norm(x, y, w, 1e-5)
    assert check.rel_err(pure, want) < 1e-6 and torch.equal(x, x0)  # without sum_out, x is not touched
    out = add_rms_norm(x, y, w, 1e-5, sum_out=x)  # the residual updated in place
    assert torch.equal(out, pure) and torch.equal(x, x0 + y)
    assert torch.equal(rms_norm(x, w, 1e-5), out)  # the same as the two kernels one after the other


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("d", [64, 896, 3584])
def test_rms_norms_write_the_int8_form_of_their_output(d, passes, device, gen):
    """With q8= buffers, rms_norm and add_rms_norm also store their output's int8 form: the very
    codes and scales quantize_act_q8 computes from the output (what the GEMV after them reads)."""
    from minfer.kernels.triton.norm import add_rms_norm, rms_norm
    from minfer.kernels.triton.quantize import quantize_act_q8

    x, y = (torch.randn(2, d, generator=gen).to(device) for _ in range(2))
    w = torch.randn(d, generator=gen).to(device)
    for norm in (lambda q8: rms_norm(x, w, 1e-5, q8=q8), lambda q8: add_rms_norm(x, y, w, 1e-5, q8=q8)):
        q8 = (torch.full((2, d // 32, 8 * passes), -1, dtype=torch.int32, device=device),
              torch.full((2, d // 32, 4), float("nan"), device=device))
        out = norm(q8)
        codes, scales = quantize_act_q8(out, passes)
        assert torch.equal(q8[0], codes) and torch.equal(q8[1], scales)
    with pytest.raises(UnsupportedError, match="multiple of 32"):
        rms_norm(torch.randn(1, 48, device=device), torch.randn(48, device=device), 1e-5,
                 q8=(torch.zeros(1, 1, 8, dtype=torch.int32, device=device), torch.zeros(1, 1, 4, device=device)))
