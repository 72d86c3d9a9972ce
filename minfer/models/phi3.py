"""The phi3 family (Phi-3 / Phi-3.5 mini and medium, Phi-4 mini), as llama.cpp runs it
(src/models/phi3.cpp): the llama layer with

- q, k, v in one matrix `attn_qkv` ([n_embd, n_embd + 2 n_embd_kv], q rows first), split by
  column slices (files with separate attn_q / attn_k / attn_v load too);
- gate and up in one matrix `ffn_up` ([n_embd, 2 n_ff]): the first n_ff outputs are the gate
  (silu), the last n_ff the up projection (ggml_swiglu's halves);
- NEOX RoPE; LongRoPE for the 128k models: per-frequency divisors `rope_factors_short.weight`
  and `rope_factors_long.weight` ([n_rot / 2]), the long ones when the context allocated exceeds
  `rope.scaling.original_context_length` (llama.cpp's get_rope_factors by n_ctx_seq), cos and
  sin times `rope.scaling.attn_factor` (the converter's sqrt(1 + ln(s) / ln(orig)));
- `attention.sliding_window` is read and ignored, as llama.cpp does (its Phi SWA is disabled).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import MetadataError
from ..gguf.reader import GGUFReader
from ..graph.builder import GraphBuilder
from ..graph.ir import ROWS, TOKENS, Graph
from .llama import LlamaArgs
from .llama import check_args as llama_check_args
from .rope_scaling import read_rope_scaling

LONG, SHORT = "rope_factors_long.weight", "rope_factors_short.weight"


@dataclass(frozen=True)
class Phi3Args:
    base: LlamaArgs  # the llama hyperparameters (neox RoPE, freq scale, attn factor)
    fused_qkv: bool  # attn_qkv (else attn_q / attn_k / attn_v)
    long_rope: bool  # the file holds the LongRoPE factors
    n_ctx_orig: int  # LongRoPE's switch point

    def __getattr__(self, name: str):  # the llama fields read through (arch, n_layer, ...)
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)


def from_gguf(r: GGUFReader) -> Phi3Args:
    base = LlamaArgs.from_gguf(r, rope_style="neox")
    k = f"{base.arch}."
    scaling = read_rope_scaling(r, k, max(1, base.n_ctx_train), 1 << 30)
    return Phi3Args(base, "blk.0.attn_qkv.weight" in r.tensors, LONG in r.tensors or SHORT in r.tensors,
                    scaling.n_ctx_orig)


def check_args(a: Phi3Args, r: GGUFReader) -> None:
    """llama's checks (layers, widths, heads, RoPE) and the fused matrices' and factors' shapes."""
    llama_check_args(a.base, r)
    k = f"{a.arch}."
    width = a.n_head * a.head_dim + 2 * a.n_head_kv * a.head_dim
    qkv = r.tensors.get("blk.0.attn_qkv.weight")
    if qkv is not None and tuple(qkv.shape) != (a.n_embd, width):
        raise MetadataError(k + "attention.head_count", f"{a.n_head} heads + 2 x {a.n_head_kv} kv heads of "
                            f"{a.head_dim} make {width} q+k+v outputs, blk.0.attn_qkv.weight has shape "
                            f"{list(qkv.shape)}")
    up = r.tensors.get("blk.0.ffn_up.weight")
    if up is not None and tuple(up.shape) != (a.n_embd, 2 * a.n_ff):
        raise MetadataError(k + "feed_forward_length", f"{a.n_ff} needs blk.0.ffn_up.weight of shape "
                            f"[{a.n_embd}, {2 * a.n_ff}] (gate and up), found {list(up.shape)}")
    if a.long_rope and not (LONG in r.tensors and SHORT in r.tensors):
        raise MetadataError(k + "rope.scaling", f"LongRoPE needs both {LONG} and {SHORT}")
    if a.rope_freqs:
        raise MetadataError(k + "rope", "rope_freqs.weight is not a phi3 tensor (LongRoPE has its own factors)")


def build_graph(a: Phi3Args, part=None) -> Graph:
    """The forward pass. Inputs: tokens [T], positions [T], out_rows [R]."""
    meta = {"arch": a.arch, "n_vocab": a.n_vocab, "n_layer": a.n_layer, "n_head_kv": a.n_head_kv,
            "head_dim": a.head_dim, "n_ctx_train": a.n_ctx_train}
    b = GraphBuilder(meta=meta)
    d, hd, ff = a.n_embd, a.head_dim, a.n_ff
    nq, nkv = a.n_head * hd, a.n_head_kv * hd
    tokens = b.input("tokens", (TOKENS,), "I32")
    positions = b.input("positions", (TOKENS,), "I32")
    out_rows = b.input("out_rows", (ROWS,), "I32")
    embd = b.weight("token_embd.weight", (d, a.n_vocab))
    rope = dict(head_dim=hd, n_rot=a.n_rot, style="neox", base=a.rope_base, freq_scale=a.rope_freq_scale,
                attn_factor=a.rope_attn_factor, yarn=a.rope_yarn, freq_factors=None)
    if a.long_rope:
        rope.update(freq_factors=b.weight(SHORT, (a.n_rot // 2,)), long_factors=b.weight(LONG, (a.n_rot // 2,)),
                    n_ctx_orig=a.n_ctx_orig)
    x = b.embed(embd, tokens, "token_embd")
    for i in range(a.n_layer):
        p = f"blk.{i}."

        def w(name: str, *shape: int, p: str = p):
            return b.weight(p + name, shape)

        n = b.rms_norm(x, w("attn_norm.weight", d), a.rms_eps, p + "attn_norm", i)
        if a.fused_qkv:
            qkv = b.matmul(n, w("attn_qkv.weight", d, nq + 2 * nkv), p + "attn_qkv", i)
            q = b.slice(qkv, 0, nq, p + "attn_q", i)
            k = b.slice(qkv, nq, nq + nkv, p + "attn_k", i)
            v = b.slice(qkv, nq + nkv, nq + 2 * nkv, p + "attn_v", i)
        else:
            q = b.matmul(n, w("attn_q.weight", d, nq), p + "attn_q", i)
            k = b.matmul(n, w("attn_k.weight", d, nkv), p + "attn_k", i)
            v = b.matmul(n, w("attn_v.weight", d, nkv), p + "attn_v", i)
        q = b.rope(q, positions, n_heads=a.n_head, name=p + "rope_q", layer=i, **rope)
        k = b.rope(k, positions, n_heads=a.n_head_kv, name=p + "rope_k", layer=i, **rope)
        att = b.attention(q, k, v, positions, n_head=a.n_head, n_head_kv=a.n_head_kv, head_dim=hd, kv_layer=i,
                          name=p + "attn", layer=i)
        h = b.add(x, b.matmul(att, w("attn_output.weight", nq, d), p + "attn_output", i), p + "attn_residual", i)
        m = b.rms_norm(h, w("ffn_norm.weight", d), a.rms_eps, p + "ffn_norm", i)
        gu = b.matmul(m, w("ffn_up.weight", d, 2 * ff), p + "ffn_up", i)
        act = b.swiglu(b.slice(gu, 0, ff, p + "ffn_gate", i), b.slice(gu, ff, 2 * ff, p + "ffn_up_half", i),
                       p + "ffn_swiglu", i)
        x = b.add(h, b.matmul(act, w("ffn_down.weight", ff, d), p + "ffn_down", i), p + "ffn_residual", i)

    last = b.get_rows(x, out_rows, "select_rows")
    n = b.rms_norm(last, b.weight("output_norm.weight", (d,)), a.rms_eps, "output_norm")
    out_w = embd if a.tied_output else b.weight("output.weight", (d, a.n_vocab))
    return b.build(b.matmul(n, out_w, "output"))
