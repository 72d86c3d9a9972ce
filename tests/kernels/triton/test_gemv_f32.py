"""gemv_f32 (kernels/triton/gemv_f32.py) beyond its contract: a row's result does not depend on the
rows beside it (the routers' logits choose experts: B=1 and B=16 must choose alike), every row and
column is written, and what it refuses."""

from __future__ import annotations

import pytest
import torch

from minfer.errors import UnsupportedError
from minfer.kernels.triton.gemv_f32 import gemv_f32


@pytest.mark.parametrize("n, k", [(128, 2048), (32, 2880), (7, 100)], ids=["qwen3moe", "gpt-oss", "odd"])
def test_rows_alone_and_together_and_the_f64_product(n, k, device, gen, check):
    w = torch.randn(n, k, generator=gen)
    x = torch.randn(16, k, generator=gen)
    raw = w.view(torch.uint8).reshape(-1).to(device)
    out = check.poisoned((16, n), torch.float32, device)
    gemv_f32(x.to(device), raw, n, k, "F32", out=out)
    assert check.rel_err(out, x.double() @ w.double().T) < 1e-6
    for r in (0, 9, 15):  # each row alone: the same bits
        alone = gemv_f32(x[r].to(device), raw, n, k, "F32")
        assert torch.equal(alone.cpu()[0], out.cpu()[r])


def test_refuses_other_weights_and_shapes(device):
    raw = torch.zeros(8 * 64 * 4, dtype=torch.uint8, device=device)
    x = torch.zeros(2, 64, device=device)
    with pytest.raises(UnsupportedError, match="reads F32 weights"):
        gemv_f32(x, raw, 8, 64, "F16")
    with pytest.raises(UnsupportedError, match="x must be contiguous"):
        gemv_f32(torch.zeros(2, 32, device=device), raw, 8, 64, "F32")
    with pytest.raises(UnsupportedError, match="contiguous bytes"):
        gemv_f32(x, raw[:-4], 8, 64, "F32")
    assert gemv_f32(x[:0], raw, 8, 64, "F32").shape == (0, 8)
