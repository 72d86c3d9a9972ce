"""The cpu reference ops against float64 math written out loop by loop."""

from __future__ import annotations

import math

import pytest
import torch

from minfer.backends.cpu import ops as cpu_ops

torch.manual_seed(0)


def test_rms_norm_matches_float64_formula():
    x = torch.randn(5, 48)
    w = torch.randn(48)
    eps = 1e-5
    x64 = x.double()
    want = x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + eps) * w.double()
    got = cpu_ops.rms_norm(x, w, eps)
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6)


def test_swiglu_is_silu_gate_times_up():
    g, u = torch.randn(3, 16), torch.randn(3, 16)
    g64 = g.double()
    want = g64 / (1 + torch.exp(-g64)) * u.double()
    assert torch.allclose(cpu_ops.swiglu(g.clone(), u).double(), want, rtol=1e-6, atol=1e-7)


def test_rope_table_angles():
    factors = torch.tensor([1.0, 2.0, 4.0])
    cos, sin = cpu_ops.rope_table(8, 6, base=10000.0, freq_scale=0.5, freq_factors=factors)
    for p in range(8):
        for i in range(3):
            ang = p * 0.5 * 10000.0 ** (-2 * i / 6) / [1.0, 2.0, 4.0][i]
            assert cos[p, i].item() == pytest.approx(math.cos(ang), abs=1e-6)
            assert sin[p, i].item() == pytest.approx(math.sin(ang), abs=1e-6)


def _rope_loops(x, positions, n_heads, hd, n_rot, style, base):
    """Rotation of each pair, element by element, in float64."""
    out = x.double().clone()
    for t, p in enumerate(positions):
        for h in range(n_heads):
            for i in range(n_rot // 2):
                ang = p * base ** (-2 * i / n_rot)
                a, b = (2 * i, 2 * i + 1) if style == "normal" else (i, i + n_rot // 2)
                x0, x1 = x[t, h * hd + a].item(), x[t, h * hd + b].item()
                out[t, h * hd + a] = x0 * math.cos(ang) - x1 * math.sin(ang)
                out[t, h * hd + b] = x0 * math.sin(ang) + x1 * math.cos(ang)
    return out


@pytest.mark.parametrize("style", ["normal", "neox"])
@pytest.mark.parametrize("n_rot", [8, 4])
def test_rope_rotates_the_right_pairs(style, n_rot):
    n_heads, hd, base = 3, 8, 500.0
    positions = [0, 1, 7, 30]
    x = torch.randn(len(positions), n_heads * hd)
    cos, sin = cpu_ops.rope_table(64, n_rot, base, 1.0)
    pos = torch.tensor(positions)
    got = cpu_ops.rope(x, cos[pos], sin[pos], n_heads, hd, n_rot, style)
    want = _rope_loops(x, positions, n_heads, hd, n_rot, style, base)
    assert torch.allclose(got.double(), want, atol=1e-5)


def test_rope_accepts_a_column_slice():
    """Fused graphs rotate views of a wider tensor (q and k columns of a qkv matmul)."""
    wide = torch.randn(2, 40)
    cos, sin = cpu_ops.rope_table(4, 8, 100.0, 1.0)
    pos = torch.tensor([1, 3])
    got = cpu_ops.rope(wide[:, 8:32], cos[pos], sin[pos], 3, 8, 8, "normal")
    want = cpu_ops.rope(wide[:, 8:32].contiguous(), cos[pos], sin[pos], 3, 8, 8, "normal")
    assert torch.equal(got, want)


def _attention_loops(q, k, v, start, scale):
    """Causal GQA attention in float64: query t (position start+t) sees keys 0..start+t."""
    n, n_head, hd = q.shape
    n_kv = k.shape[0]
    out = torch.zeros(n, n_head * hd, dtype=torch.float64)
    for t in range(n):
        for h in range(n_head):
            g = h // (n_head // n_kv)
            keys = range(start + t + 1)
            s = [scale * sum(q[t, h, d].item() * k[g, j, d].item() for d in range(hd)) for j in keys]
            m = max(s)
            e = [math.exp(x - m) for x in s]
            z = sum(e)
            for d in range(hd):
                out[t, h * hd + d] = sum(e[j] / z * v[g, j, d].item() for j in keys)
    return out


@pytest.mark.parametrize("start,n", [(0, 1), (0, 5), (4, 1), (3, 4)])
def test_attention_causal_gqa_with_cache_offset(start, n):
    n_head, n_kv, hd = 4, 2, 8
    q = torch.randn(n, n_head, hd)
    k = torch.randn(n_kv, 16, hd)
    v = torch.randn(n_kv, 16, hd)
    got = cpu_ops.attention(q, k, v, start, hd ** -0.5)
    want = _attention_loops(q, k, v, start, hd ** -0.5)
    assert got.shape == (n, n_head * hd)
    assert torch.allclose(got.double(), want, atol=1e-5)


@pytest.mark.parametrize("pos", [0, 9])
def test_single_query_attention_matches_loops(pos):
    n_head, n_kv, hd = 6, 2, 8
    q = torch.randn(1, n_head, hd)
    k = torch.randn(n_kv, 16, hd)
    v = torch.randn(n_kv, 16, hd)
    got = cpu_ops.attention_one(q[0], k[:, :pos + 1], v[:, :pos + 1], hd ** -0.5)
    assert torch.allclose(got.double(), _attention_loops(q, k, v, pos, hd ** -0.5), atol=1e-5)
