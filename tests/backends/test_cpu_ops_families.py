"""The reference math of the qwen3 / gemma / phi3 ops (backends/cpu/ops.py) against direct,
element-by-element transcriptions of llama.cpp's definitions (ggml-cpu ops.cpp rope_yarn and
ggml_rope_yarn_corr_dims, llama-hparams is_masked_swa, gemma2's soft-cap), and the graph rules
around them (passes, the GPU backends' refusal)."""

from __future__ import annotations

import math

import pytest
import torch

from minfer.backends.cpu import ops as cpu_ops
from minfer.graph.builder import GraphBuilder
from minfer.graph.fuse import optimize
from minfer.graph.ir import TOKENS, Op


def _ggml_rope_row(pos: int, n_rot: int, base: float, freq_scale: float, ext: float, attn: float,
                   orig: int, factors=None) -> list[tuple[float, float]]:
    """(cos, sin) of each pair at `pos`, transcribed from ggml_rope_cache_init / rope_yarn."""
    def corr_dim(n):
        return n_rot * math.log(orig / (n * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(0, math.floor(corr_dim(32.0))), min(n_rot - 1, math.ceil(corr_dim(1.0)))
    theta_scale = base ** (-2.0 / n_rot)
    theta = float(pos)
    out = []
    for i0 in range(0, n_rot, 2):
        ff = factors[i0 // 2] if factors is not None else 1.0
        extrap = theta / ff
        interp = freq_scale * extrap
        t, mscale = interp, attn
        if ext != 0.0:
            y = (i0 // 2 - low) / max(0.001, high - low)
            mix = (1 - min(1, max(0, y))) * ext
            t = interp * (1 - mix) + extrap * mix
            mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
        out.append((math.cos(t) * mscale, math.sin(t) * mscale))
        theta *= theta_scale
    return out


@pytest.mark.parametrize("freq_scale,yarn,attn", [(1.0, None, 1.0), (0.25, (1.0, 128, 32.0, 1.0), 1.0),
                                                  (0.5, None, 1.25), (1 / 32, (1.0, 4096, 32.0, 1.0), 0.9)])
def test_rope_table_is_ggml_rope_yarn(freq_scale, yarn, attn):
    n_rot, base = 64, 1e6
    factors = torch.linspace(1.0, 5.0, n_rot // 2)
    cos, sin = cpu_ops.rope_table(300, n_rot, base, freq_scale, factors, attn, yarn)
    for pos in (0, 1, 17, 299):
        ext, orig = (yarn[0], yarn[1]) if yarn else (0.0, 4096)
        want = _ggml_rope_row(pos, n_rot, base, freq_scale, ext, attn, orig, factors.tolist())
        assert torch.allclose(cos[pos], torch.tensor([c for c, _ in want]), atol=2e-6)
        assert torch.allclose(sin[pos], torch.tensor([s for _, s in want]), atol=2e-6)


def _naive_attention(q, keys, values, start, scale, window, softcap):
    """One query and head at a time: scores of the visible keys, soft-cap, softmax, weighted sum."""
    n, n_head, hd = q.shape
    n_kv = keys.shape[0]
    out = torch.zeros(n, n_head, hd, dtype=torch.float64)
    for i in range(n):
        p = start + i
        for h in range(n_head):
            kv = h // (n_head // n_kv)
            seen = [j for j in range(p + 1) if not (window and p - j >= window)]  # llama.cpp is_masked_swa
            s = torch.stack([(q[i, h].double() @ keys[kv, j].double()) * scale for j in seen])
            if softcap:
                s = softcap * torch.tanh(s / softcap)
            w = torch.softmax(s, 0)
            out[i, h] = sum(w[t] * values[kv, j].double() for t, j in enumerate(seen))
    return out.reshape(n, n_head * hd).float()


@pytest.mark.parametrize("start,n", [(0, 9), (5, 4), (12, 1)])
@pytest.mark.parametrize("window,softcap", [(4, 0.0), (0, 0.7), (3, 0.5), (100, 0.0)])
def test_attention_window_and_softcap(start, n, window, softcap):
    g = torch.Generator().manual_seed(start * 31 + n)
    n_head, n_kv, hd = 4, 2, 8
    q = torch.randn(n, n_head, hd, generator=g)
    keys = torch.randn(n_kv, start + n + 3, hd, generator=g)  # cache rows past start + n are never read
    values = torch.randn(n_kv, start + n + 3, hd, generator=g)
    ours = cpu_ops.attention(q, keys, values, start, 0.3, window, softcap)
    want = _naive_attention(q, keys, values, start, 0.3, window, softcap)
    assert torch.allclose(ours, want, atol=1e-5)


def test_geglu_softcap_scale_and_grouped_norm():
    x = torch.linspace(-6, 6, 97)
    gelu = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    assert torch.allclose(cpu_ops.geglu(x.clone(), torch.full_like(x, 2.0)), 2 * gelu, atol=1e-6)
    assert torch.allclose(cpu_ops.softcap(x, 2.5), 2.5 * torch.tanh(x / 2.5))
    assert torch.equal(cpu_ops.scale(x, 3.0), x * 3.0)
    t = torch.randn(3, 4 * 16)
    w = torch.rand(16) + 0.5
    ours = cpu_ops.RMSNorm(w, 1e-6, group=16)(t)
    heads = t.view(3, 4, 16)
    want = heads / torch.sqrt((heads * heads).mean(-1, keepdim=True) + 1e-6) * w
    assert torch.allclose(ours, want.view(3, 64), atol=1e-6)


def _two_ropes(**k_extra):
    b = GraphBuilder(meta={"arch": "test"})
    x = b.input("x", (TOKENS, 32), "F32")
    pos = b.input("positions", (TOKENS,), "I32")
    w = b.weight("w", (32, 48))
    qkv = b.matmul(x, w, "qkv")
    q, k = b.slice(qkv, 0, 32, "q"), b.slice(qkv, 32, 48, "k")
    common = dict(head_dim=16, n_rot=16, style="neox", base=1e4, freq_scale=1.0, freq_factors=None)
    rq = b.rope(q, pos, n_heads=2, name="rope_q", **common)
    rk = b.rope(k, pos, n_heads=1, name="rope_k", **{**common, **k_extra})
    return b.build(b.add(b.slice(rq, 0, 16, "q0"), rk, "sum"))


def test_rope_pairs_fuse_only_when_their_params_agree():
    assert sum(n.op == Op.ROPE for n in optimize(_two_ropes()).nodes) == 1
    for extra in ({"base": 1e6}, {"attn_factor": 1.2}, {"yarn": (1.0, 64, 32.0, 1.0)}):
        assert sum(n.op == Op.ROPE for n in optimize(_two_ropes(**extra)).nodes) == 2, extra


