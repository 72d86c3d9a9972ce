"""A synthetic traced run: a tiny llama-shaped transformer with random weights, no model file needed.

`run_demo` executes a real forward pass (RMSNorm, RoPE, grouped-query causal attention with a KV
cache, SwiGLU, residual adds, output head) node by node through `TraceRecorder`, with the same
call sequence the engine uses: one prefill step over the prompt, then one decode step per sampled
token. It feeds the viewer's browser tests, `scripts/trace_screenshot.py`, and `minfer trace demo`
(a way to look at the viewer without a model).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .recorder import TraceRecorder

_SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "qu", "ba", "do", "fe", "gi", "ho", "ju"]


def demo_token_text(i: int) -> str:
    """Deterministic pronounceable text for synthetic token id `i` (a leading space on even ids)."""
    s = _SYLLABLES[i % 16] + _SYLLABLES[(i // 16) % 16] + ("" if i < 256 else str(i // 256))
    return (" " if i % 2 == 0 else "") + s


@dataclass(frozen=True)
class DemoShape:
    """Sizes of the synthetic model (defaults: small enough for a test, shaped like SmolLM2)."""

    layers: int = 4
    dim: int = 64
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 160
    vocab: int = 512


class _Graph:
    """Node table in execution order; `op(...)` runs a node's function, times it, and records it."""

    def __init__(self, rec: TraceRecorder, matmul_kernel: Callable[[], str]):
        self.rec = rec
        self.nodes: list[dict] = []
        self.matmul_kernel = matmul_kernel

    def add(self, name: str, op: str, inputs: list[int], shape: list[int], layer: int | None, **extra) -> int:
        kernel = extra.pop("kernel", f"cpu:{op.lower()}")
        nid = len(self.nodes)
        self.nodes.append({"id": nid, "name": name, "op": op, "inputs": inputs, "shape": shape,
                           "dtype": extra.pop("dtype", "f32"), "layer": layer, "kernel": kernel, **extra})
        return nid

    def run(self, nid: int, fn: Callable[..., torch.Tensor], *args) -> torch.Tensor:
        t0 = time.perf_counter()
        out = fn(*args)
        dt = time.perf_counter() - t0
        kernel = self.matmul_kernel() if self.nodes[nid]["op"] == "MatMul" else None
        self.rec.node(nid, out, dt, kernel=kernel)
        return out


def _rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def _rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """NeoX-style rotary embedding of x [T, heads, hd] at positions pos [T]."""
    hd = x.shape[-1]
    freqs = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    ang = pos[:, None].float() * freqs[None]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def _attention_probs(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Causal softmax(q k^T / sqrt(hd)) for q [T, heads, hd] against the cache k [S, heads, hd]."""
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(q.shape[-1])
    future = pos[:, None] < torch.arange(k.shape[0])[None, :]
    return torch.softmax(scores.masked_fill(future, -math.inf), dim=-1)


def _attention_mix(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Probabilities [heads, T, S] times values [S, heads, hd] -> [T, heads * hd]."""
    return torch.einsum("hts,shd->thd", p, v).reshape(p.shape[1], -1)


def _swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(gate) * up


def run_demo(
    path: str | Path,
    *,
    shape: DemoShape | None = None,
    prompt_len: int = 12,
    new_tokens: int = 24,
    seed: int = 0,
    temperature: float = 0.9,
    **recorder_kwargs,
) -> Path:
    """Run the synthetic model on a random prompt, sample `new_tokens`, write the trace to `path`."""
    s = shape or DemoShape()
    g = torch.Generator().manual_seed(seed)
    hd = s.dim // s.heads

    def w(*dims: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*dims, generator=g) * (scale / math.sqrt(dims[-1]))

    embd = torch.randn(s.vocab, s.dim, generator=g)
    layers = [
        dict(an=1 + 0.1 * torch.randn(s.dim, generator=g), fn=1 + 0.1 * torch.randn(s.dim, generator=g),
             q=w(s.heads * hd, s.dim), k=w(s.kv_heads * hd, s.dim), v=w(s.kv_heads * hd, s.dim),
             o=w(s.dim, s.heads * hd), gate=w(s.ffn, s.dim), up=w(s.ffn, s.dim), down=w(s.dim, s.ffn))
        for _ in range(s.layers)
    ]
    out_norm = torch.ones(s.dim)
    head = w(s.vocab, s.dim, scale=6.0)

    step_kind = ["prefill"]
    rec = TraceRecorder(path, detokenize=demo_token_text,
                        model_info={"name": "minfer synthetic demo", "arch": "llama", "n_layer": s.layers,
                                    "n_embd": s.dim, "n_head": s.heads, "n_head_kv": s.kv_heads, "n_ff": s.ffn,
                                    "n_vocab": s.vocab, "device": "cpu", "seed": seed},
                        **recorder_kwargs)
    gr = _Graph(rec, lambda: "cpu:gemm" if step_kind[0] == "prefill" else "cpu:gemv")
    T = "n_tokens"
    ids: dict[str, int] = {"embd": gr.add("token_embd", "GetRows", [], [T, s.dim], None, dtype="q8_0->f32")}
    prev = ids["embd"]
    for li in range(s.layers):
        p = f"blk.{li}."

        def a(name, op, inputs, shp, li=li, p=p, **kw):
            ids[p + name] = gr.add(p + name, op, inputs, shp, li, **kw)
            return ids[p + name]

        n1 = a("attn_norm", "RmsNorm", [prev], [T, s.dim])
        q = a("attn_q", "MatMul", [n1], [T, s.heads * hd], contract="matmul_q4_1")
        k = a("attn_k", "MatMul", [n1], [T, s.kv_heads * hd], contract="matmul_q4_1")
        v = a("attn_v", "MatMul", [n1], [T, s.kv_heads * hd], contract="matmul_q4_1")
        qr = a("q_rope", "Rope", [q], [T, s.heads, hd])
        kr = a("k_rope", "Rope", [k], [T, s.kv_heads, hd])
        kq = a("kq_softmax", "SoftMax", [qr, kr], [s.heads, T, "n_past+n_tokens"])
        kqv = a("kqv", "MatMul", [kq, v], [T, s.heads * hd], kernel="cpu:attn_v")
        o = a("attn_output", "MatMul", [kqv], [T, s.dim], contract="matmul_q4_1")
        r1 = a("attn_residual", "Add", [prev, o], [T, s.dim])
        n2 = a("ffn_norm", "RmsNorm", [r1], [T, s.dim])
        ga = a("ffn_gate", "MatMul", [n2], [T, s.ffn], contract="matmul_q4_1")
        up = a("ffn_up", "MatMul", [n2], [T, s.ffn], contract="matmul_q4_1")
        sw = a("ffn_swiglu", "SwiGLU", [ga, up], [T, s.ffn])
        dn = a("ffn_down", "MatMul", [sw], [T, s.dim], contract="matmul_q4_1")
        prev = a("ffn_residual", "Add", [r1, dn], [T, s.dim])
    ids["out_norm"] = gr.add("output_norm", "RmsNorm", [prev], [T, s.dim], None)
    ids["logits"] = gr.add("output", "MatMul", [ids["out_norm"]], [1, s.vocab], None, contract="matmul_q6_k")
    rec.set_graph(gr.nodes)

    kcache = [torch.zeros(0, s.kv_heads, hd) for _ in range(s.layers)]
    vcache = [torch.zeros(0, s.kv_heads, hd) for _ in range(s.layers)]
    tokens = torch.randint(0, s.vocab, (prompt_len,), generator=g)
    n_past = 0
    for step in range(new_tokens):
        kind = "prefill" if step == 0 else "decode"
        step_kind[0] = kind
        n = tokens.numel()
        rec.begin_step(step, kind, n)
        pos = torch.arange(n_past, n_past + n)
        x = gr.run(ids["embd"], torch.index_select, embd, 0, tokens)
        for li, L in enumerate(layers):
            p = f"blk.{li}."
            h = gr.run(ids[p + "attn_norm"], _rms_norm, x, L["an"])
            q = gr.run(ids[p + "attn_q"], torch.matmul, h, L["q"].T)
            k = gr.run(ids[p + "attn_k"], torch.matmul, h, L["k"].T)
            v = gr.run(ids[p + "attn_v"], torch.matmul, h, L["v"].T)
            qr = gr.run(ids[p + "q_rope"], _rope, q.view(n, s.heads, hd), pos)
            kr = gr.run(ids[p + "k_rope"], _rope, k.view(n, s.kv_heads, hd), pos)
            kcache[li] = torch.cat([kcache[li], kr])
            vcache[li] = torch.cat([vcache[li], v.view(n, s.kv_heads, hd)])
            rep = s.heads // s.kv_heads
            kk, vv = kcache[li].repeat_interleave(rep, 1), vcache[li].repeat_interleave(rep, 1)
            att = gr.run(ids[p + "kq_softmax"], _attention_probs, qr, kk, pos)
            kqv = gr.run(ids[p + "kqv"], _attention_mix, att, vv)
            o = gr.run(ids[p + "attn_output"], torch.matmul, kqv, L["o"].T)
            r1 = gr.run(ids[p + "attn_residual"], torch.add, x, o)
            h2 = gr.run(ids[p + "ffn_norm"], _rms_norm, r1, L["fn"])
            ga = gr.run(ids[p + "ffn_gate"], torch.matmul, h2, L["gate"].T)
            up = gr.run(ids[p + "ffn_up"], torch.matmul, h2, L["up"].T)
            sw = gr.run(ids[p + "ffn_swiglu"], _swiglu, ga, up)
            dn = gr.run(ids[p + "ffn_down"], torch.matmul, sw, L["down"].T)
            x = gr.run(ids[p + "ffn_residual"], torch.add, r1, dn)
        hn = gr.run(ids["out_norm"], _rms_norm, x[-1:], out_norm)
        logits = gr.run(ids["logits"], torch.matmul, hn, head.T)
        probs = torch.softmax(logits[0] / temperature, dim=-1)
        tok = int(torch.multinomial(probs, 1, generator=g))
        rec.end_step(tok, logits, demo_token_text(tok))
        n_past += n
        tokens = torch.tensor([tok])
    rec.close()
    return Path(path)
