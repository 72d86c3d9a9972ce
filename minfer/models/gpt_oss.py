"""The gpt-oss family (gpt-oss-20b, gpt-oss-120b; GGUF arch `gpt-oss`), as llama.cpp runs it
(src/models/openai-moe.cpp, LLM_ARCH_OPENAI_MOE).

Per layer:  n = rmsnorm(x)                                            (attn_norm)
            q, k, v = W_q n + b_q, W_k n + b_k, W_v n + b_v          (biases on all three)
            q, k = rope_neox(q), rope_neox(k)   YaRN (`rope.scaling.*`), the same base and scaling
                                                on every layer (llama.cpp: freq_base_swa = freq_base)
            a = attention(q, k, v) with sinks    scale 1/sqrt(head_dim); each head's learned logit
                                                `attn_sinks` [n_head] joins the softmax's denominator;
                                                sliding-window layers see the last
                                                `attention.sliding_window` keys (128)
            h = x + W_o a + b_o
            x' = h + moe(rmsnorm(h))            (post_attention_norm; models/moe.py: router with a
                                                bias, top-k of the logits then a softmax over the k
                                                chosen (gating "softmax_weight", no normalisation),
                                                expert biases, the clamped SwiGLU swiglu_oai)
then logits = output.weight · rmsnorm(x_last) (untied).

Sliding window: llama.cpp's load_swa_pattern with period 2 (`attention.sliding_window_pattern`
overrides it, a period or one flag per layer): layer i slides when i % 2 == 0, so layers 0, 2, ...
slide and 1, 3, ... see every key, as gpt-oss's config alternates sliding_attention /
full_attention. Head size from `attention.key_length` (64 with n_embd 2880 and 64 heads: q is
4096 wide, wider than the model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import MetadataError
from ..gguf.reader import GGUFReader
from ..graph.builder import GraphBuilder
from ..graph.ir import ROWS, TOKENS, Graph
from .gemma import check_attention_args, read_shape, swa_pattern
from .llama import MAX_CONTEXT, check_blocks
from .moe import MoEArgs, build_moe_ffn, check_moe, read_moe
from .rope_scaling import RopeScaling, read_rope_scaling

__all__ = ["GptOssArgs", "from_gguf", "check_args", "build_graph"]

SWA_PERIOD = 2  # llama.cpp's load_swa_pattern(ml, 2) for LLM_ARCH_OPENAI_MOE


@dataclass(frozen=True)
class GptOssArgs:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope_base: float
    rope: RopeScaling
    window: int  # attention.sliding_window (required, as llama.cpp)
    swa_layers: tuple[bool, ...]
    moe: MoEArgs


def from_gguf(r: GGUFReader) -> GptOssArgs:
    """Fill from `gpt-oss.*` metadata (llama.cpp's load_arch_hparams: the window, the expert width
    and the norm epsilon are required keys)."""
    arch = r.get_str("general.architecture")
    k = f"{arch}."
    n_layer, n_embd, n_head, head_dim = read_shape(r, k)
    n_ctx_train = r.get_int(k + "context_length", 131072)
    rope = read_rope_scaling(r, k, max(1, min(n_ctx_train, MAX_CONTEXT)), MAX_CONTEXT)
    if rope.kind == "longrope":
        raise MetadataError(k + "rope.scaling.type", "longrope is supported for phi3 only")
    window = r.get_int(k + "attention.sliding_window")
    if not 1 <= window <= MAX_CONTEXT:
        raise MetadataError(k + "attention.sliding_window", f"must be in 1..{MAX_CONTEXT}, found {window}")
    embd = r.tensors.get("token_embd.weight")
    moe = read_moe(r, arch, n_ff=r.get_int(k + "expert_feed_forward_length"), norm=False, gating="softmax_weight",
                   required=True, biases=True, act="swiglu_oai")
    return GptOssArgs(
        arch=arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
        n_head_kv=r.get_int(k + "attention.head_count_kv", n_head),
        head_dim=head_dim,
        n_rot=r.get_int(k + "rope.dimension_count", head_dim),
        n_vocab=embd.shape[-1] if embd is not None and len(embd.shape) == 2 else 0,
        n_ctx_train=n_ctx_train,
        rms_eps=r.get_float(k + "attention.layer_norm_rms_epsilon"),
        rope_base=r.get_float(k + "rope.freq_base", 10000.0),
        rope=rope,
        window=window,
        swa_layers=swa_pattern(r, k, n_layer, SWA_PERIOD),
        moe=moe,
    )


def check_args(a: GptOssArgs, r: GGUFReader) -> None:
    """MetadataError for a hyperparameter out of bounds or disagreeing with the tensors: widths
    against the embedding and blk.0's q / sinks, the experts against the router and expert tensors
    (models/moe.py), the layer count against the blk.N tensors."""
    k = f"{a.arch}."
    check_attention_args(a, r)
    sane = (("rope.freq_base", a.rope_base, a.rope_base > 0),
            ("attention.layer_norm_rms_epsilon", a.rms_eps, 0 <= a.rms_eps < 1))
    for key, v, ok in sane:
        if not (math.isfinite(v) and ok):
            raise MetadataError(k + key, f"is not a sane value: {v}")
    check_blocks(k, a.n_layer, a.n_head, a.head_dim, r)
    sinks = r.tensors.get("blk.0.attn_sinks.weight")
    if sinks is not None and tuple(sinks.shape) != (a.n_head,):
        raise MetadataError(k + "attention.head_count", f"says {a.n_head} heads, blk.0.attn_sinks.weight has shape "
                            f"{list(sinks.shape)}")
    check_moe(a.moe, a.arch, a.n_embd, r)


def build_graph(a: GptOssArgs, part=None) -> Graph:
    """The forward pass. Inputs: tokens [T], positions [T], out_rows [R]."""
    meta = {"arch": a.arch, "n_vocab": a.n_vocab, "n_layer": a.n_layer, "n_head_kv": a.n_head_kv,
            "head_dim": a.head_dim, "n_ctx_train": a.n_ctx_train}
    b = GraphBuilder(meta=meta)
    d, hd, nq, nkv = a.n_embd, a.head_dim, a.n_head * a.head_dim, a.n_head_kv * a.head_dim
    tokens = b.input("tokens", (TOKENS,), "I32")
    positions = b.input("positions", (TOKENS,), "I32")
    out_rows = b.input("out_rows", (ROWS,), "I32")
    x = b.embed(b.weight("token_embd.weight", (d, a.n_vocab)), tokens, "token_embd")
    rope = dict(head_dim=hd, n_rot=a.n_rot, style="neox", base=a.rope_base, freq_scale=a.rope.freq_scale,
                freq_factors=None, **a.rope.rope_kwargs())
    for i in range(a.n_layer):
        p = f"blk.{i}."

        def w(name: str, *shape: int, p: str = p):
            return b.weight(p + name, shape)

        n = b.rms_norm(x, w("attn_norm.weight", d), a.rms_eps, p + "attn_norm", i)
        q = b.matmul(n, w("attn_q.weight", d, nq), p + "attn_q", i, w("attn_q.bias", nq))
        k = b.matmul(n, w("attn_k.weight", d, nkv), p + "attn_k", i, w("attn_k.bias", nkv))
        v = b.matmul(n, w("attn_v.weight", d, nkv), p + "attn_v", i, w("attn_v.bias", nkv))
        q = b.rope(q, positions, n_heads=a.n_head, name=p + "rope_q", layer=i, **rope)
        k = b.rope(k, positions, n_heads=a.n_head_kv, name=p + "rope_k", layer=i, **rope)
        att = b.attention(q, k, v, positions, n_head=a.n_head, n_head_kv=a.n_head_kv, head_dim=hd, kv_layer=i,
                          name=p + "attn", layer=i, window=a.window if a.swa_layers[i] else 0,
                          sinks=w("attn_sinks.weight", a.n_head))
        o = b.matmul(att, w("attn_output.weight", nq, d), p + "attn_output", i, w("attn_output.bias", d))
        h = b.add(x, o, p + "attn_residual", i)
        m = b.rms_norm(h, w("post_attention_norm.weight", d), a.rms_eps, p + "post_attention_norm", i)
        x = b.add(h, build_moe_ffn(b, m, p, i, a.moe, d), p + "ffn_residual", i)

    last = b.get_rows(x, out_rows, "select_rows")
    n = b.rms_norm(last, b.weight("output_norm.weight", (d,)), a.rms_eps, "output_norm")
    return b.build(b.matmul(n, b.weight("output.weight", (d, a.n_vocab)), "output"))
