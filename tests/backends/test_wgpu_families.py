"""The WGSL kernels of the qwen3 / gemma / phi3 ops against the cpu backend's reference math
(backends/cpu/ops.py), on whatever Vulkan adapter wgpu finds (lavapipe in CI): grouped RMSNorm,
GeGLU, Scale, SoftCap, and attention with a sliding window and soft-capped scores, split over the
context and single-pass. Fresh random inputs, outputs poisoned with NaN; tolerances the contracts'."""

from __future__ import annotations

import math
import secrets

import pytest
import torch

from minfer.backends.cpu import ops as cpu_ops
from minfer.errors import UnsupportedError


@pytest.fixture(scope="module")
def dev():
    from minfer.contracts.registry import default_registry
    from minfer.kernels.wgpu.device import Device, adapters

    default_registry()  # (triton before a lavapipe device: wgpu/device.py)
    if not adapters("Vulkan"):
        pytest.fail("wgpu finds no Vulkan adapter (no GPU: apt-get install mesa-vulkan-drivers)")
    return Device("vulkan")


@pytest.fixture
def gen() -> torch.Generator:
    seed = secrets.randbits(31)
    print(f"random seed {seed}")
    return torch.Generator().manual_seed(seed)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _poisoned(dev, shape):
    return dev.upload(torch.full(shape, float("nan")))


@pytest.mark.parametrize("rows, heads, hd", [(1, 4, 128), (5, 2, 64), (3, 8, 256)])
def test_grouped_rms_norm_of_strided_rows(dev, gen, rows, heads, hd):
    from minfer.kernels.wgsl import norm

    qkv = torch.randn(rows, heads * hd + 96, generator=gen) * 3
    w = torch.randn(hd, generator=gen) + 1
    x = dev.upload(qkv).cols(0, heads * hd)  # q's columns of a stacked q+k+v output: rows strided
    out = norm.rms_norm(x=x, w=dev.upload(w), eps=1e-6, out=_poisoned(dev, (rows, heads * hd)), group=hd).cpu()
    want = cpu_ops.RMSNorm(w, 1e-6, c=False, group=hd)(qkv[:, :heads * hd].contiguous())
    assert _rel(out, want) < 1e-6
    with pytest.raises(UnsupportedError, match="divide x's width"):
        norm.rms_norm(x=dev.upload(torch.randn(2, 100)), w=dev.upload(torch.randn(48)), eps=1e-6, group=48)


def test_geglu_scale_softcap(dev, gen):
    from minfer.kernels.wgsl import elementwise as ew

    rows, ff = 3, 700
    gu = torch.randn(rows, 2 * ff, generator=gen) * 3
    g = dev.upload(gu)
    out = ew.geglu(gate=g.cols(0, ff), up=g.cols(ff, 2 * ff), out=_poisoned(dev, (rows, ff))).cpu()
    assert _rel(out, cpu_ops.geglu(gu[:, :ff].double(), gu[:, ff:].double())) < 2e-6
    x = torch.randn(3, 640, generator=gen) * 20
    c = float(torch.rand((), generator=gen)) * 30 + 1
    scaled = ew.scale(x=dev.upload(x), scale=c, out=_poisoned(dev, x.shape)).cpu()
    assert torch.equal(scaled, cpu_ops.scale(x, torch.tensor(c, dtype=torch.float32).item()))
    capped = ew.softcap(x=dev.upload(x), cap=c, out=_poisoned(dev, x.shape)).cpu()
    assert _rel(capped, cpu_ops.softcap(x.double(), c)) < 1e-6 and float(capped.abs().max()) <= c
    with pytest.raises(UnsupportedError, match="cap must be a finite number > 0"):
        ew.softcap(x=dev.upload(x), cap=-1.0)


@pytest.mark.parametrize("split", [True, False], ids=["split", "single-pass"])
@pytest.mark.parametrize("window, softcap", [(0, 0.0), (7, 0.0), (130, 0.0), (0, 5.0), (7, 50.0)])
def test_attention_window_and_softcap(dev, gen, monkeypatch, split, window, softcap):
    """Rows at the context's last position, its first, and chunk edges; chunks of 64 positions, so a
    window of 7 leaves a row's earlier chunks empty."""
    from minfer.kernels.wgsl import attention as vk_attention

    monkeypatch.setattr(dev, "attn", {**vk_attention.ATTN, "CH": 64, "split": split})
    n_kv, hd, ctx = 2, 64, 300
    n_head = 2 * n_kv
    ck = torch.randn(1, 2, n_kv, ctx, hd, generator=gen)
    cv = torch.randn(1, 2, n_kv, ctx, hd, generator=gen)
    pos, slots = [ctx - 1, 0, ctx // 2, 64], [0, 1, 1, 0]
    q = torch.randn(4, n_head * hd, generator=gen)
    k = torch.randn(4, n_kv * hd, generator=gen)
    v = torch.randn(4, n_kv * hd, generator=gen)
    scale = 1 / math.sqrt(hd)
    ref_k, ref_v = ck.clone(), cv.clone()
    for r in range(4):
        ref_k[0, slots[r], :, pos[r]] = k[r].view(n_kv, hd)
        ref_v[0, slots[r], :, pos[r]] = v[r].view(n_kv, hd)
    want = torch.cat([cpu_ops.attention_masked(q[r].view(1, n_head, hd), ref_k[0, slots[r], :, :pos[r] + 1],
                                               ref_v[0, slots[r], :, :pos[r] + 1], pos[r], scale, window, softcap)
                      for r in range(4)])
    up, i32 = dev.upload, torch.int32
    got = vk_attention.attention(q=up(q), k=up(k), v=up(v), cache_k=up(ck), cache_v=up(cv),
                                 row_slots=up(torch.tensor(slots, dtype=i32)),
                                 positions=up(torch.tensor(pos, dtype=i32)),
                                 layer=0, n_head=n_head, n_head_kv=n_kv, head_dim=hd, scale=scale,
                                 out=_poisoned(dev, (4, n_head * hd)), window=window, softcap=softcap).cpu()
    assert _rel(got, want) < 1e-5
