"""The Triton kernels of the qwen3 / gemma / phi3 ops against the cpu backend's reference math
(backends/cpu/ops.py): grouped RMSNorm (per-head q / k norms), GeGLU, Scale, SoftCap, and
attention with a sliding window and soft-capped scores (decode rows over a split context, prompt
tiles, torch SDPA). Fresh random inputs, outputs poisoned with NaN; tolerances are the contracts'."""

from __future__ import annotations

import math

import pytest
import torch

from minfer.backends.cpu import ops as cpu_ops
from minfer.errors import UnsupportedError
from minfer.kernels.triton import attention as attn
from minfer.kernels.triton import elementwise as ew
from minfer.kernels.triton import norm, torch_ops


def _randn(shape, gen, device, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(device)


@pytest.mark.parametrize("rows, heads, hd", [(1, 4, 128), (5, 2, 64), (3, 8, 256)])
def test_grouped_rms_norm_of_strided_rows(rows, heads, hd, device, gen, check):
    """q's columns of a stacked q+k+v output (rows strided), each head normed on its own."""
    qkv = _randn((rows, heads * hd + 96), gen, device, 3.0)
    x = qkv[:, :heads * hd]  # a column slice: row stride heads * hd + 96
    w = _randn((hd,), gen, device) + 1.0
    out = norm.rms_norm(x, w, 1e-6, out=check.poisoned((rows, heads * hd), torch.float32, device), group=hd)
    want = cpu_ops.RMSNorm(w.cpu(), 1e-6, c=False, group=hd)(x.cpu().contiguous())
    assert out.shape == (rows, heads * hd) and check.rel_err(out, want) < 1e-6


def test_grouped_rms_norm_refuses_a_group_that_does_not_divide(device, gen):
    with pytest.raises(UnsupportedError, match="group 48 must be w's length 48 and divide"):
        norm.rms_norm(_randn((2, 100), gen, device), _randn((48,), gen, device), 1e-6, group=48)


@pytest.mark.parametrize("rows, ff", [(1, 700), (6, 1100)])
def test_geglu_rows_of_the_gate_up_halves(rows, ff, device, gen, check):
    gu = _randn((rows, 2 * ff), gen, device, 3.0)
    gate, up = gu[:, :ff], gu[:, ff:]
    out = ew.geglu_rows(gate, up, out=check.poisoned((rows, ff), torch.float32, device))
    want = cpu_ops.geglu(gate.cpu().double(), up.cpu().double())
    assert check.rel_err(out, want) < 2e-6


@pytest.mark.parametrize("shape", [(1,), (3, 640), (ew.BLOCK + 5,)])
def test_scale_and_softcap(shape, device, gen, check):
    x = _randn(shape, gen, device, 20.0)
    c = float(torch.rand((), generator=gen)) * 30 + 1
    out = ew.scale_f32(x, c, out=check.poisoned(shape, torch.float32, device))
    check.same_values(out, cpu_ops.scale(x.cpu(), torch.tensor(c, dtype=torch.float32).item()))
    capped = ew.softcap_f32(x, c, out=check.poisoned(shape, torch.float32, device))
    assert check.rel_err(capped, cpu_ops.softcap(x.cpu().double(), c)) < 1e-6
    # the kernel holds the cap in float32: |out| <= float32(c), which may round above the double c
    assert float(capped.abs().max()) <= torch.tensor(c, dtype=torch.float32).item()
    with pytest.raises(UnsupportedError, match="cap must be a finite number > 0"):
        ew.softcap_f32(x, 0.0)


def _cache_case(gen, device, n_ctx, n_kv, hd, slots, positions):
    """An f16 cache of random history, and each row's q, k, v (the kernel writes k, v first)."""
    n_head = 2 * n_kv
    rows = len(positions)
    ck = (torch.randn(1, 2, n_kv, n_ctx, hd, generator=gen)).half().to(device)
    cv = (torch.randn(1, 2, n_kv, n_ctx, hd, generator=gen)).half().to(device)
    q = _randn((rows, n_head * hd), gen, device)
    k = _randn((rows, n_kv * hd), gen, device)
    v = _randn((rows, n_kv * hd), gen, device)
    i32 = torch.int32
    return dict(q=q, k=k, v=v, cache_k=ck, cache_v=cv, row_slots=torch.tensor(slots, dtype=i32, device=device),
                positions=torch.tensor(positions, dtype=i32, device=device), layer=0, n_head=n_head,
                n_head_kv=n_kv, head_dim=hd, scale=1 / math.sqrt(hd))


def _reference(case, window, softcap) -> torch.Tensor:
    """cpu_ops.attention_masked per row over the caches after the write, f16 inputs as the kernels read."""
    ck, cv = case["cache_k"].cpu().float().clone(), case["cache_v"].cpu().float().clone()
    n_kv, hd = case["n_head_kv"], case["head_dim"]
    slots, pos = case["row_slots"].tolist(), case["positions"].tolist()
    for r, (s, p) in enumerate(zip(slots, pos, strict=True)):
        ck[0, s, :, p] = case["k"][r].cpu().half().float().view(n_kv, hd)
        cv[0, s, :, p] = case["v"][r].cpu().half().float().view(n_kv, hd)
    q = case["q"].cpu().half().float()
    return torch.cat([cpu_ops.attention_masked(q[r].view(1, -1, hd), ck[0, s, :, :p + 1], cv[0, s, :, :p + 1], p,
                                               case["scale"], window, softcap)
                      for r, (s, p) in enumerate(zip(slots, pos, strict=True))])


# window 0 / softcap 0 are the base math; the decode cases span 3 splits (SPLIT_LEN 512): a row whose
# window starts in a later split leaves the earlier ones empty
@pytest.mark.parametrize("window, softcap", [(0, 0.0), (7, 0.0), (600, 0.0), (0, 5.0), (7, 50.0)])
def test_attention_rows_window_and_softcap(window, softcap, device, gen, check):
    case = _cache_case(gen, device, 1100, 1, 64, [0, 1, 1, 0], [1099, 0, 700, 64])
    out = attn.attention_rows(**case, out=check.poisoned((4, 128), torch.float32, device), window=window,
                              softcap=softcap)
    assert check.rel_err(out, _reference(case, window, softcap)) < 5e-3


@pytest.mark.parametrize("window, softcap", [(0, 0.0), (5, 0.0), (70, 3.0), (0, 2.0)])
def test_attention_prefill_window_and_softcap(window, softcap, device, gen, check):
    """Two spans: 80 rows from position 30 of slot 1 (two tiles; the second tile's window starts past
    its first key tiles), 3 rows from 0 of slot 0."""
    pos = list(range(30, 110)) + [0, 1, 2]
    slots = [1] * 80 + [0] * 3
    case = _cache_case(gen, device, 128, 2, 32, slots, pos)
    out = attn.attention_prefill(**case, out=check.poisoned((83, 128), torch.float32, device), window=window,
                                 softcap=softcap)
    assert check.rel_err(out, _reference(case, window, softcap)) < 5e-3


@pytest.mark.parametrize("window", [0, 9])
def test_attention_sdpa_window(window, device, gen, check):
    pos = list(range(20, 50))
    case = _cache_case(gen, device, 64, 1, 32, [1] * 30, pos)
    out = torch_ops.attention_sdpa(**case, out=check.poisoned((30, 64), torch.float32, device), window=window)
    assert check.rel_err(out, _reference(case, window, 0.0)) < 5e-3
    with pytest.raises(UnsupportedError, match="no soft-cap"):
        torch_ops.attention_sdpa(**case, softcap=1.0)
