"""The int8 MMQ matmul (kernels/triton/mmq.py) against float64 math on the reference-decoded weights, for
every type it reads: against the exact product within the int8 quantization of x, and against
the product of x quantized as the kernel quantizes it (`quantized_x`), within f32 rounding and a
rare flip of one q at a near-tie (x * 127 / amax a hair from k + 0.5: ~1e-4 on the row), which
catches a wrong code, scale or offset that the first tolerance would hide (those are >= 1e-2)."""


from __future__ import annotations

import pytest
import torch

from minfer.contracts.harness import random_blocks
from minfer.errors import UnsupportedError
from minfer.kernels.triton import mmq
from minfer.kernels.triton.lut4 import LUT4_TYPES
from minfer.kernels.triton.q4_0 import repack_q4_0
from minfer.kernels.triton.qmatmul import repack_gemv
from minfer.quant import reference
from minfer.quant.types import QUANT_TABLE, GGMLType

# small tiles for the interpreter: 16 x 16, 2 blocks per step (KB=3: a partial last step)
TIGHT = 5e-4
CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16, "KB": 2, "GROUP_M": 2, "num_warps": 4}


def quantized_x(x: torch.Tensor) -> torch.Tensor:
    """x as the kernel quantizes it per 32 values (d = amax / 127, q = round half away from zero of
    x * (127 / amax), all in f32), dequantized: the kernel's exact input."""
    b = x.reshape(x.shape[0], -1, 32)
    amax = b.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    y = b * inv
    q = torch.sign(y) * torch.floor(y.abs() + 0.5)
    return (q * (amax * (1.0 / 127.0))).reshape(x.shape)


def _case(t: GGMLType, n: int, k: int, gen):
    raw = random_blocks(QUANT_TABLE[t], n, k, gen)
    return raw, reference.dequantize(raw.reshape(-1), t, (n, k)).double()


def _k(t: GGMLType, blocks32: int) -> int:
    """k of about `blocks32` 32-element blocks in whole blocks of t (K-quants: 256)."""
    per = QUANT_TABLE[t].block_elems
    return max(per, blocks32 * 32 // per * per)


# every type at 2 .. 33 rows; the lookup types (their words' own element order, the table) once (their
# conformance cases, mmq.fkc.md's mmq_lut4, run each at 1-17 rows)
EVERY_TYPE = [(t, m) for m in (2, 5, 16, 33) for t in mmq.MMQ_TYPES if t not in LUT4_TYPES] + [(GGMLType.IQ4_XS, 33)]


@pytest.mark.parametrize("t, m", EVERY_TYPE, ids=lambda v: v.name if isinstance(v, GGMLType) else str(v))
def test_mmq_every_type(t, m, device, gen, check):
    n, k = 24, _k(t, 13)  # 13 blocks: a partial last K step for the 32-element types
    raw, w = _case(t, n, k, gen)
    x = torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen)
    out = check.poisoned((m, n), torch.float32, device)
    mmq.mmq_matmul(x.to(device), repack_gemv(raw.to(device), n, k, t), n, k, t, out=out, config=CONFIG)
    assert check.rel_err(out, x.double() @ w.T) < 2e-2  # int8 x: ~5e-3 here (contract: 5e-2)
    assert check.rel_err(out, quantized_x(x).double() @ w.T) < TIGHT  # the rest is f32 rounding


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("config", [
    {"BLOCK_M": 16, "BLOCK_N": 32, "KB": 3, "GROUP_M": 8, "num_warps": 4},
    {"BLOCK_M": 32, "BLOCK_N": 16, "KB": 1, "GROUP_M": 1, "num_warps": 4},
], ids=["kb3", "bm32"])
def test_mmq_split_k_and_tails(t, config, device, gen, check):
    """K split across programs (few tiles), a partial last step (KB=3), rows and columns not a
    multiple of the tile; twice, the second launch reusing the self-reset arrival counters."""
    n, k = 40, _k(t, 64)
    raw, w = _case(t, n, k, gen)
    packed = repack_gemv(raw.to(device), n, k, t)
    bm, bn, kb = config["BLOCK_M"], config["BLOCK_N"], config["KB"]
    assert mmq._split(64, n, k // 32, bm, bn, kb)[0] > 1
    for m in (33, 7):
        x = torch.randn(m, k, generator=gen)
        out = check.poisoned((m, n), torch.float32, device)
        mmq.mmq_matmul(x.to(device), packed, n, k, t, out=out, config=config)
        assert check.rel_err(out, quantized_x(x).double() @ w.T) < TIGHT
    assert not packed.counters.any()


def test_mmq_raw_bytes_typed_entries_and_zero_rows(device, gen, check):
    n, k = 16, 256
    raw, w = _case(GGMLType.Q4_K, n, k, gen)
    x = torch.randn(3, k, generator=gen)
    out = mmq.mmq_int4(x.to(device), raw.to(device), n, k, GGMLType.Q4_K, config=CONFIG)  # repacked per call
    assert check.rel_err(out, quantized_x(x).double() @ w.T) < TIGHT
    raw0, w0 = _case(GGMLType.Q4_0, n, k, gen)
    out = mmq.mmq_q4_0(x.to(device), repack_q4_0(raw0.to(device), n, k), n, k, config=CONFIG)
    assert check.rel_err(out, quantized_x(x).double() @ w0.T) < TIGHT
    assert mmq.mmq_matmul(torch.zeros(0, k, device=device), raw.to(device), n, k, "Q4_K").shape == (0, n)


def test_mmq_zero_rows_of_x_give_zero(device, gen):
    """An all-zero block of x (amax 0) quantizes to 0, not NaN."""
    n, k = 16, 64
    raw, _ = _case(GGMLType.Q8_0, n, k, gen)
    x = torch.zeros(2, k)
    out = mmq.mmq_q8_0(x.to(device), raw.to(device), n, k, config=CONFIG)
    assert torch.equal(out.cpu(), torch.zeros(2, n))


def test_mmq_refuses_what_it_cannot_read(device, gen):
    n, k = 16, 256
    raw, _ = _case(GGMLType.Q4_K, n, k, gen)
    packed = repack_gemv(raw.to(device), n, k, GGMLType.Q4_K)
    x = torch.zeros(2, k, device=device)
    with pytest.raises(UnsupportedError, match="reads"):
        mmq.mmq_matmul(x, packed, n, k, GGMLType.F16)
    with pytest.raises(UnsupportedError, match="reads"):
        mmq.mmq_q4_0(x, packed, n, k, GGMLType.Q4_K)  # the Q4_0 entry point refuses other types
    with pytest.raises(UnsupportedError, match="packed Q4_K"):
        mmq.mmq_int4(x, packed, n, k, GGMLType.Q4_1)  # a Q4_K weight is not misread as Q4_1
    with pytest.raises(UnsupportedError, match="packed Q4_K"):
        mmq.mmq_int4(x, packed, 8, k, GGMLType.Q4_K)
    with pytest.raises(UnsupportedError, match=r"x must be \[m, 256\]"):
        mmq.mmq_int4(torch.zeros(2, 512, device=device), packed, n, k, GGMLType.Q4_K)
    with pytest.raises(UnsupportedError, match="dtype float32"):
        mmq.mmq_int4(x.half(), packed, n, k, GGMLType.Q4_K)
    with pytest.raises(UnsupportedError, match="out must have shape"):
        mmq.mmq_int4(x, packed, n, k, GGMLType.Q4_K, out=torch.empty(2, 8, device=device))
    with pytest.raises(UnsupportedError, match="packed GEMV weight"):
        mmq.mmq_int4(x, [packed], n, k, GGMLType.Q4_K)


def test_split_plan():
    # few tiles: K split, every part whole loop steps, no more than MAX_SPLIT parts
    split, per = mmq._split(16, 3584, 112, 16, 64, 4)
    assert split > 1 and per % 4 == 0 and split * per >= 112 and (split - 1) * per < 112
    assert split <= mmq.MAX_SPLIT
    assert mmq._split(512, 37888, 112, 128, 128, 1) == (1, 112)  # enough tiles: no split
    assert mmq._split(16, 64, 4, 16, 64, 4) == (1, 4)  # too few steps to split
