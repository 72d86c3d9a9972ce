"""The WGSL kernels of the qwen3 / gemma / phi3 ops against the cpu backend's reference math
(backends/cpu/ops.py), on whatever Vulkan adapter wgpu finds (lavapipe in CI): grouped RMSNorm,
GeGLU, Scale, SoftCap, and attention with a sliding window and soft-capped scores or gpt-oss's sinks,
split over the context and single-pass. Fresh random inputs, outputs poisoned with NaN; tolerances the
contracts'."""

from __future__ import annotations

import math
import os
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
    """Fresh random inputs every run; a failing test's captured output names its seed, and
    MINFER_FRESH_SEED=<seed> replays it."""
    seed = int(os.environ.get("MINFER_FRESH_SEED") or secrets.randbits(31))
    print(f"random seed {seed} (replay: MINFER_FRESH_SEED={seed})")
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
    assert _rel(capped, cpu_ops.softcap(x.double(), c)) < 1e-6
    # the kernel holds the cap in float32: |out| <= float32(c), which may round above the double c
    assert float(capped.abs().max()) <= torch.tensor(c, dtype=torch.float32).item()
    with pytest.raises(UnsupportedError, match="cap must be a finite number > 0"):
        ew.softcap(x=dev.upload(x), cap=-1.0)


@pytest.mark.parametrize("split, hd", [(True, 64), (False, 64), (True, 256)],
                         ids=["split", "single-pass", "split-hd256"])
@pytest.mark.parametrize("window, softcap", [(0, 0.0), (7, 0.0), (130, 0.0), (0, 5.0), (7, 50.0)])
def test_attention_window_and_softcap(dev, gen, monkeypatch, split, hd, window, softcap):
    """Rows at the context's last position, its first, and chunk edges; chunks of 64 positions, so a
    window of 7 leaves a row's earlier chunks empty; gemma's head_dim 256 on the split kernel."""
    _check_attention(dev, gen, monkeypatch, split, hd, window, softcap, None)


@pytest.mark.parametrize("split", [True, False], ids=["split", "single-pass"])
@pytest.mark.parametrize("window", [0, 7])
def test_attention_sinks(dev, gen, monkeypatch, split, window):
    """gpt-oss's per-head sink logits (some far above the scores: most weight on the sink) in the
    split merge and at the single-pass kernel's end, with and without a window (head_dim 64)."""
    sinks = torch.randn(4, generator=gen) * 2 + torch.tensor([0.0, 4.0, -3.0, 1.0])
    _check_attention(dev, gen, monkeypatch, split, 64, window, 0.0, sinks)


def _check_attention(dev, gen, monkeypatch, split, hd, window, softcap, sinks):
    from minfer.kernels.wgsl import attention as vk_attention

    monkeypatch.setattr(dev, "attn", {**vk_attention.ATTN, "CH": 64, "split": split})
    n_kv, ctx = 2, 300
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
                                               ref_v[0, slots[r], :, :pos[r] + 1], pos[r], scale, window, softcap,
                                               sinks) for r in range(4)])
    up, i32 = dev.upload, torch.int32
    got = vk_attention.attention(q=up(q), k=up(k), v=up(v), cache_k=up(ck), cache_v=up(cv),
                                 row_slots=up(torch.tensor(slots, dtype=i32)),
                                 positions=up(torch.tensor(pos, dtype=i32)),
                                 layer=0, n_head=n_head, n_head_kv=n_kv, head_dim=hd, scale=scale,
                                 out=_poisoned(dev, (4, n_head * hd)), window=window, softcap=softcap,
                                 sinks=None if sinks is None else up(sinks)).cpu()
    assert _rel(got, want) < 1e-5


def test_weights_larger_than_a_binding_run_in_chunks_of_rows(tiny_gguf, raw, monkeypatch):
    """A device that binds fewer bytes than a weight holds (lavapipe's 128 MiB against Gemma 3's 178 MB
    vocabulary): the gather and the matmuls run one call per chunk of whole rows, into one output, and
    give the logits of the whole-weight run exactly (calls.type_runs, bindings._get_rows_chunks)."""
    from minfer.api import load
    from minfer.backends.calls import type_runs
    from minfer.backends.vulkan.backend import WGPUBackend
    from minfer.graph.ir import WeightRef
    from minfer.quant.types import GGMLType

    w = WeightRef("w", (256, 1000))  # f32 rows of 1 KiB
    runs = type_runs(w, lambda name: GGMLType.F32, max_bytes=300 * 1024)
    assert [(r.rows, a, b) for r, _, a, b in runs] == [((0, 300), 0, 300), ((300, 600), 300, 600),
                                                       ((600, 900), 600, 900), ((900, 1000), 900, 1000)]
    assert type_runs(w, lambda name: GGMLType.F32, max_bytes=1 << 20) == [(w, GGMLType.F32, 0, 1000)]

    path = tiny_gguf("tiny-gemma3", "f32")
    prompt = [3, 17, 42, 99, 5, 250, 7, 311, 64, 128]
    with load(path, "vulkan", n_ctx=64, progress=False) as whole:
        want = raw.prefill(whole.engine, 0, prompt).cpu()
        want_step = raw.decode(whole.engine, 0, 9, len(prompt)).cpu()
    init = WGPUBackend.__init__

    def small_bindings(self, *a, **k):
        init(self, *a, **k)
        self.max_weight_bytes = 200 * 1024  # the 512 KiB embedding in 3 chunks, q / k / v and gate+up too

    monkeypatch.setattr(WGPUBackend, "__init__", small_bindings)
    with load(path, "vulkan", n_ctx=64, progress=False) as chunked:
        names = {r["kernel"] for r in chunked.engine.backend.plan_rows(1)}
        got = raw.prefill(chunked.engine, 0, prompt).cpu()
        got_step = raw.decode(chunked.engine, 0, 9, len(prompt)).cpu()
    assert any("+" in n for n in names)  # a node launching several kernels: its chunks
    assert torch.equal(got, want) and torch.equal(got_step, want_step)
