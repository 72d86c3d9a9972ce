"""The gemma family: gemma2 and gemma3 (text), as llama.cpp runs them (src/models/gemma2.cpp,
gemma3.cpp).

Per layer:  n = rmsnorm(x)                                   (attn_norm)
            q, k, v = W_q n, W_k n, W_v n;  gemma3: q, k RMS-normed per head (attn_q_norm, attn_k_norm)
            q, k = rope_neox(q), rope_neox(k) with the layer's base: sliding-window layers use
                   `rope.freq_base_swa` (default 10000) and no scaling, global layers `rope.freq_base`
                   and the file's rope scaling
            a = W_o attention(q, k, v)   scale as below; window on sliding layers; gemma2 soft-caps scores
            h = x + rmsnorm(a)                                (post_attention_norm)
            x' = h + rmsnorm(W_down (gelu_tanh(W_gate m) * W_up m)),  m = rmsnorm(h)   (ffn_norm, post_ffw_norm)
Input: the embedding row times sqrt(n_embd). Output: rmsnorm, tied (or output.weight for gemma3),
then gemma2 (and gemma3 when the file says so) soft-caps the logits: c tanh(logits / c).

Norm weights are used as stored: llama.cpp's converter already adds gemma's 1 to every
`*norm.weight` (Gemma's RMSNorm multiplies by 1 + w), so the file holds 1 + w.

Attention scale: llama.cpp's rule (it reads no query_pre_attn_scalar key): 1/sqrt(head_dim),
except the 27B models (gemma2: 46 layers, gemma3: 62 layers) whose query_pre_attn_scalar is
n_embd / n_head: 1/sqrt(n_embd / n_head).

Sliding window: `attention.sliding_window` tokens (gemma2 default 4096; gemma3 none when absent
or 0), on the layers of `attention.sliding_window_pattern`: an array of one bool per layer, or
a period n where layer i slides when i % n < n - 1 (default: gemma2 2, gemma3 6): llama.cpp's
set_swa_pattern. gemma2 soft-caps attention scores by `attn_logit_softcapping` (default 50) and
logits by `final_logit_softcapping` (default 30).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import MetadataError
from ..gguf.reader import GGUFReader
from ..graph.builder import GraphBuilder
from ..graph.ir import ROWS, TOKENS, Graph
from .llama import MAX_CONTEXT, MAX_DIM, MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, check_blocks
from .rope_scaling import RopeScaling, read_rope_scaling

MAX_SOFTCAP = 1e4
_DEFAULTS = {  # arch: (window, pattern period, attention soft-cap, final soft-cap), llama.cpp's
    "gemma2": (4096, 2, 50.0, 30.0),
    "gemma3": (0, 6, 0.0, 0.0),
}
_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


@dataclass(frozen=True)
class GemmaArgs:
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope_base: float  # global layers
    rope_base_swa: float  # sliding-window layers
    rope: RopeScaling  # global layers' scaling
    freq_scale_swa: float  # sliding layers' (llama.cpp's rope_freq_scale_train_swa: gemma3 1, gemma2 the global one)
    window: int  # 0: no sliding window
    swa_layers: tuple[bool, ...]
    attn_scale: float
    attn_softcap: float  # 0: none
    final_softcap: float  # 0: none
    qk_norm: bool
    tied_output: bool

    @classmethod
    def from_gguf(cls, r: GGUFReader) -> GemmaArgs:
        arch = r.get_str("general.architecture")
        k = f"{arch}."
        win_default, period_default, attn_cap_default, final_cap_default = _DEFAULTS[arch]
        n_layer, n_embd, n_head, head_dim = read_shape(r, k)
        n_ctx_train = r.get_int(k + "context_length", 8192)
        window = r.get_int(k + "attention.sliding_window", win_default)
        embd = r.tensors.get("token_embd.weight")
        rope = read_rope_scaling(r, k, max(1, min(n_ctx_train, MAX_CONTEXT)), MAX_CONTEXT)
        if rope.kind == "longrope":
            raise MetadataError(k + "rope.scaling.type", "longrope is supported for phi3 only")
        scale_dim = n_embd // n_head if n_layer == _27B_LAYERS[arch] else head_dim
        return cls(
            arch=arch, n_layer=n_layer, n_embd=n_embd,
            n_ff=r.get_int(k + "feed_forward_length"),
            n_head=n_head,
            n_head_kv=r.get_int(k + "attention.head_count_kv", n_head),
            head_dim=head_dim,
            n_rot=r.get_int(k + "rope.dimension_count", head_dim),
            n_vocab=embd.shape[-1] if embd is not None and len(embd.shape) == 2 else 0,
            n_ctx_train=n_ctx_train,
            rms_eps=r.get_float(k + "attention.layer_norm_rms_epsilon", 1e-6),
            rope_base=r.get_float(k + "rope.freq_base", 10000.0),
            rope_base_swa=r.get_float(k + "rope.freq_base_swa", 10000.0 if arch == "gemma3" else
                                      r.get_float(k + "rope.freq_base", 10000.0)),
            rope=rope,
            freq_scale_swa=rope.freq_scale if arch == "gemma2" else 1.0,
            window=window,
            swa_layers=swa_pattern(r, k, n_layer, period_default) if window > 0 else (False,) * n_layer,
            attn_scale=1.0 / math.sqrt(scale_dim) if scale_dim > 0 else 0.0,
            attn_softcap=r.get_float(k + "attn_logit_softcapping", attn_cap_default) if arch == "gemma2" else 0.0,
            final_softcap=r.get_float(k + "final_logit_softcapping", final_cap_default),
            qk_norm=arch == "gemma3",
            tied_output=arch == "gemma2" or "output.weight" not in r.tensors,  # gemma2: always token_embd
        )


def read_shape(r: GGUFReader, k: str) -> tuple[int, int, int, int]:
    """(n_layer, n_embd, n_head, head_dim) of `k` ("arch."), each >= 1 (the layers <= MAX_LAYERS) before
    anything divides by them; head_dim from key_length (default n_embd / n_head), value_length equal."""
    n_layer = r.get_int(k + "block_count")
    n_embd = r.get_int(k + "embedding_length")
    n_head = r.get_int(k + "attention.head_count")
    for key, v in (("block_count", n_layer), ("embedding_length", n_embd), ("attention.head_count", n_head)):
        if v < 1:
            raise MetadataError(k + key, f"must be >= 1, found {v}")
    if n_layer > MAX_LAYERS:
        raise MetadataError(k + "block_count", f"must be in 1..{MAX_LAYERS}, found {n_layer}")
    head_dim = r.get_int(k + "attention.key_length", n_embd // n_head)
    if r.get_int(k + "attention.value_length", head_dim) != head_dim:
        raise MetadataError(k + "attention.value_length", f"must equal key_length {head_dim}")
    return n_layer, n_embd, n_head, head_dim


def swa_pattern(r: GGUFReader, k: str, n_layer: int, period: int) -> tuple[bool, ...]:
    """llama.cpp's load_swa_pattern: an array of one flag per layer, else a period n (layer i
    slides when i % n < n - 1; n = 0: every layer slides)."""
    key = k + "attention.sliding_window_pattern"
    raw = r.metadata.get(key, period)
    if isinstance(raw, list):
        if len(raw) != n_layer or not all(isinstance(v, (bool, int)) for v in raw):
            raise MetadataError(key, f"must be {n_layer} flags (one per layer), found {len(raw)} values")
        return tuple(bool(v) for v in raw)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= MAX_LAYERS:
        raise MetadataError(key, f"must be a layer period in 0..{MAX_LAYERS} or {n_layer} flags, found {raw!r}")
    return tuple(raw == 0 or i % raw < raw - 1 for i in range(n_layer))


def bound(k: str, key: str, v: int, hi: int, lo: int = 1) -> None:
    """MetadataError unless lo <= v <= hi (`k`: the "arch." key prefix)."""
    if not lo <= v <= hi:
        raise MetadataError(k + key, f"must be in {lo}..{hi}, found {v}")


def check_attention_args(a, r: GGUFReader) -> None:
    """The checks every family with its own Args shares (gemma, gpt-oss): widths, heads, head size,
    RoPE dimensions and training context bounded, and the embedding's shape against n_embd."""
    k = f"{a.arch}."
    bound(k, "embedding_length", a.n_embd, MAX_DIM)
    bound(k, "attention.head_count", a.n_head, MAX_HEADS)
    bound(k, "attention.head_count_kv", a.n_head_kv, a.n_head)
    if a.n_head % a.n_head_kv:
        raise MetadataError(k + "attention.head_count_kv", f"{a.n_head_kv} does not divide head_count {a.n_head}")
    bound(k, "attention.key_length", a.head_dim, MAX_HEAD_DIM)
    bound(k, "rope.dimension_count", a.n_rot, a.head_dim, lo=2)
    if a.n_rot % 2:
        raise MetadataError(k + "rope.dimension_count", f"must be even, found {a.n_rot}")
    bound(k, "context_length", a.n_ctx_train, MAX_CONTEXT)
    embd = r.tensors.get("token_embd.weight")
    if embd is not None and (len(embd.shape) != 2 or embd.shape[0] != a.n_embd):
        raise MetadataError(k + "embedding_length", f"is {a.n_embd}, token_embd.weight has shape {list(embd.shape)}")


def check_args(a: GemmaArgs, r: GGUFReader) -> None:
    """MetadataError for a hyperparameter out of bounds or disagreeing with the tensors."""
    k = f"{a.arch}."
    check_attention_args(a, r)
    bound(k, "feed_forward_length", a.n_ff, MAX_DIM)
    bound(k, "attention.sliding_window", a.window, MAX_CONTEXT, lo=0)
    sane = (("rope.freq_base", a.rope_base, a.rope_base > 0),
            ("rope.freq_base_swa", a.rope_base_swa, a.rope_base_swa > 0),
            ("attention.layer_norm_rms_epsilon", a.rms_eps, 0 <= a.rms_eps < 1),
            ("attn_logit_softcapping", a.attn_softcap, 0 <= a.attn_softcap <= MAX_SOFTCAP),
            ("final_logit_softcapping", a.final_softcap, 0 <= a.final_softcap <= MAX_SOFTCAP))
    for key, v, ok in sane:
        if not (math.isfinite(v) and ok):
            raise MetadataError(k + key, f"is not a sane value: {v}")
    if a.arch == "gemma2" and not (a.attn_softcap > 0 and a.final_softcap > 0):
        raise MetadataError(k + "final_logit_softcapping", "gemma2 soft-caps attention and logits: must be > 0, "
                            f"found {a.attn_softcap} / {a.final_softcap}")
    check_blocks(k, a.n_layer, a.n_head, a.head_dim, r)


def build_graph(a: GemmaArgs, part=None) -> Graph:
    """The forward pass. Inputs: tokens [T], positions [T], out_rows [R]."""
    meta = {"arch": a.arch, "n_vocab": a.n_vocab, "n_layer": a.n_layer, "n_head_kv": a.n_head_kv,
            "head_dim": a.head_dim, "n_ctx_train": a.n_ctx_train}
    b = GraphBuilder(meta=meta)
    d, hd, nq, nkv = a.n_embd, a.head_dim, a.n_head * a.head_dim, a.n_head_kv * a.head_dim
    tokens = b.input("tokens", (TOKENS,), "I32")
    positions = b.input("positions", (TOKENS,), "I32")
    out_rows = b.input("out_rows", (ROWS,), "I32")
    embd = b.weight("token_embd.weight", (d, a.n_vocab))
    x = b.scale(b.embed(embd, tokens, "token_embd"), math.sqrt(d), "token_embd_scale")
    for i in range(a.n_layer):
        p = f"blk.{i}."

        def w(name: str, *shape: int, p: str = p):
            return b.weight(p + name, shape)

        def norm(t: int, name: str, width: int = d, group: int | None = None, i: int = i, p: str = p) -> int:
            return b.rms_norm(t, w(name + ".weight", width), a.rms_eps, p + name, i, group=group)

        swa = a.swa_layers[i]
        rope = dict(head_dim=hd, n_rot=a.n_rot, style="neox", freq_factors=None, layer=i,
                    base=a.rope_base_swa if swa else a.rope_base,
                    freq_scale=a.freq_scale_swa if swa else a.rope.freq_scale, **a.rope.rope_kwargs())
        n = norm(x, "attn_norm")
        q = b.matmul(n, w("attn_q.weight", d, nq), p + "attn_q", i)
        k = b.matmul(n, w("attn_k.weight", d, nkv), p + "attn_k", i)
        v = b.matmul(n, w("attn_v.weight", d, nkv), p + "attn_v", i)
        if a.qk_norm:
            q = norm(q, "attn_q_norm", hd, hd)
            k = norm(k, "attn_k_norm", hd, hd)
        q = b.rope(q, positions, n_heads=a.n_head, name=p + "rope_q", **rope)
        k = b.rope(k, positions, n_heads=a.n_head_kv, name=p + "rope_k", **rope)
        att = b.attention(q, k, v, positions, n_head=a.n_head, n_head_kv=a.n_head_kv, head_dim=hd, kv_layer=i,
                          name=p + "attn", layer=i, scale=a.attn_scale, window=a.window if swa else 0,
                          softcap=a.attn_softcap)
        o = norm(b.matmul(att, w("attn_output.weight", nq, d), p + "attn_output", i), "post_attention_norm")
        h = b.add(x, o, p + "attn_residual", i)
        m = norm(h, "ffn_norm")
        gate = b.matmul(m, w("ffn_gate.weight", d, a.n_ff), p + "ffn_gate", i)
        up = b.matmul(m, w("ffn_up.weight", d, a.n_ff), p + "ffn_up", i)
        down = b.matmul(b.geglu(gate, up, p + "ffn_geglu", i), w("ffn_down.weight", a.n_ff, d), p + "ffn_down", i)
        x = b.add(h, norm(down, "post_ffw_norm"), p + "ffn_residual", i)

    last = b.get_rows(x, out_rows, "select_rows")
    n = b.rms_norm(last, b.weight("output_norm.weight", (d,)), a.rms_eps, "output_norm")
    out_w = embd if a.tied_output else b.weight("output.weight", (d, a.n_vocab))
    logits = b.matmul(n, out_w, "output")
    if a.final_softcap:
        logits = b.softcap(logits, a.final_softcap, "output_softcap")
    return b.build(logits)
