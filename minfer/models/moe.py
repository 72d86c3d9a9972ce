"""The mixture-of-experts feed-forward, as llama.cpp's build_moe_ffn computes it
(src/llama-graph.cpp), for every family whose layers route tokens to experts (qwen3moe; mixtral,
which is GGUF arch `llama` with expert tensors; gpt-oss: router and expert biases, softmax over
the chosen logits, the clamped SwiGLU).

Per layer, with m = rmsnorm(h) (ffn_norm) and E experts of which k run per token:

    logits = W_router m (+ b_router)                      ffn_gate_inp [n_embd, E] (llama.cpp never quantizes it)
    probs  = softmax(logits) | sigmoid(logits) | logits   expert_gating_func 1 | 2 | 3 (3: gpt-oss, the
                                                          chosen weights softmaxed after the top-k)
    ids    = top-k of probs (+ exp_probs_b, the selection bias, where the file has one)
    w      = probs[ids], / sum(w) (expert_weights_norm), * expert_weights_scale
    y_j    = W_down[ids_j] (silu(W_gate[ids_j] m) * W_up[ids_j] m)   ffn_{gate,up,down}_exps: 3-D, one
                                                                      [n_ff_exp, n_embd] matrix per expert
             (gpt-oss: each matmul + its expert's bias ffn_*_exps.bias, and swiglu_oai for silu * up)
    out    = sum_j w_j y_j                                (slot order: the largest weight first)

The graph ops are MoERoute (gating, bias, top-k, norm, scale: weights and ids), MoEMatMul (the
chosen experts' rows only; ids stay where the backend computes) and MoESum (graph/ir.py). The
hyperparameters are read from `{arch}.expert_*` with each family's llama.cpp defaults (it
hard-codes softmax gating and normalised weights for qwen3moe and mixtral; a file that says
otherwise is honoured), bounded, and checked against the router's and the experts' shapes
before anything is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import MetadataError
from ..gguf.reader import GGUFReader
from ..graph.builder import GraphBuilder

MAX_EXPERTS = 1024  # llama.cpp's LLAMA_MAX_EXPERTS
MAX_EXPERT_FF = 1 << 17
SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT = 1.702, 7.0  # llama.cpp's constants for LLM_FFN_SWIGLU_OAI_MOE
GATING_FUNCS = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}  # llama.cpp's expert_gating_func values


@dataclass(frozen=True)
class MoEArgs:
    n_expert: int  # expert_count (E)
    n_used: int  # expert_used_count (k)
    n_ff: int  # each expert's FFN width (expert_feed_forward_length, or the family's default)
    gating: str = "softmax"  # GATING_FUNCS
    norm: bool = True  # expert_weights_norm: the k weights divided by their sum
    scale: float = 1.0  # expert_weights_scale (0 in a file: not applied, as llama.cpp)
    selection_bias: bool = False  # the file has exp_probs_b.bias (DeepSeek-V3 style selection bias)
    biases: bool = False  # router and experts have biases (gpt-oss: ffn_gate_inp.bias, ffn_{gate,up,down}_exps.bias)
    act: str = "swiglu"  # the experts' activation: "swiglu" or gpt-oss's "swiglu_oai" (alpha 1.702, limit 7)


def read_moe(r: GGUFReader, arch: str, *, n_ff: int, norm: bool = True, gating: str = "softmax",
             required: bool = False, biases: bool = False, act: str = "swiglu") -> MoEArgs | None:
    """The expert hyperparameters of `arch`, or None when the file has no experts (expert_count
    absent or 0; a MetadataError when `required`). `n_ff`, `norm`, `gating`: the family's
    defaults for the expert width, the weights' normalisation and the gating function; `biases`,
    `act`: the family's router / expert biases and activation (fixed by the family, as llama.cpp)."""
    k = f"{arch}."
    n_expert = r.get_int(k + "expert_count", 0)
    if n_expert == 0:
        if required:
            raise MetadataError(k + "expert_count", f"{arch} routes tokens to experts: expected 1..{MAX_EXPERTS}, "
                                "found none")
        return None
    n_used = r.get_int(k + "expert_used_count", 0)
    code = r.get_int(k + "expert_gating_func", 0)
    if code and code not in GATING_FUNCS:
        raise MetadataError(k + "expert_gating_func", f"must be one of {sorted(GATING_FUNCS)} "
                            f"({', '.join(GATING_FUNCS.values())}) or absent, found {code}")
    scale = r.get_float(k + "expert_weights_scale", 0.0)
    return MoEArgs(
        n_expert=n_expert,
        n_used=n_used,
        n_ff=r.get_int(k + "expert_feed_forward_length", n_ff),
        gating=GATING_FUNCS[code] if code else gating,
        norm=r.get_bool(k + "expert_weights_norm", norm),
        scale=1.0 if scale == 0.0 else scale,
        selection_bias="blk.0.exp_probs_b.bias" in r.tensors,
        biases=biases,
        act=act,
    )


def check_moe(a: MoEArgs, arch: str, n_embd: int, r: GGUFReader) -> None:
    """MetadataError for an expert hyperparameter out of bounds, or disagreeing with blk.0's router
    (ffn_gate_inp [n_embd, E]) or experts (ffn_gate_exps / ffn_up_exps [n_embd, n_ff, E],
    ffn_down_exps [n_ff, n_embd, E]); the other layers' tensors are checked against the graph's
    shapes (models/registry.py check_tensors)."""
    k = f"{arch}."
    if not 1 <= a.n_expert <= MAX_EXPERTS:
        raise MetadataError(k + "expert_count", f"must be in 1..{MAX_EXPERTS}, found {a.n_expert}")
    if not 1 <= a.n_used <= a.n_expert:
        raise MetadataError(k + "expert_used_count", f"must be in 1..{a.n_expert} (expert_count), found {a.n_used}")
    if not 1 <= a.n_ff <= MAX_EXPERT_FF:
        raise MetadataError(k + "expert_feed_forward_length", f"must be in 1..{MAX_EXPERT_FF}, found {a.n_ff}")
    if not (math.isfinite(a.scale) and a.scale > 0):
        raise MetadataError(k + "expert_weights_scale", f"must be a finite number > 0 (or 0: none), found {a.scale}")
    router = r.tensors.get("blk.0.ffn_gate_inp.weight")
    if router is not None and tuple(router.shape) != (n_embd, a.n_expert):
        raise MetadataError(k + "expert_count", f"says {a.n_expert} experts of input {n_embd}, "
                            f"blk.0.ffn_gate_inp.weight has shape {list(router.shape)}")
    want = {"ffn_gate_exps": (n_embd, a.n_ff, a.n_expert), "ffn_up_exps": (n_embd, a.n_ff, a.n_expert),
            "ffn_down_exps": (a.n_ff, n_embd, a.n_expert)}
    for name, shape in want.items():
        t = r.tensors.get(f"blk.0.{name}.weight")
        if t is None or tuple(t.shape) == shape:
            continue
        key = "expert_count" if len(t.shape) != 3 or t.shape[2] != a.n_expert else "expert_feed_forward_length"
        raise MetadataError(k + key, f"{a.n_expert} experts of width {a.n_ff} (input {n_embd}) need "
                            f"blk.0.{name}.weight of shape {list(shape)}, found {list(t.shape)}")
    biases = {"exp_probs_b.bias": (a.n_expert,)}
    if a.biases:
        biases.update({"ffn_gate_inp.bias": (a.n_expert,), "ffn_gate_exps.bias": (a.n_ff, a.n_expert),
                       "ffn_up_exps.bias": (a.n_ff, a.n_expert), "ffn_down_exps.bias": (n_embd, a.n_expert)})
    for name, shape in biases.items():
        t = r.tensors.get(f"blk.0.{name}")
        if t is not None and tuple(t.shape) != shape:
            key = "expert_count" if t.shape[-1:] != (a.n_expert,) else "expert_feed_forward_length"
            raise MetadataError(k + key, f"{a.n_expert} experts of width {a.n_ff} (input {n_embd}) need "
                                f"blk.0.{name} of shape {list(shape)}, found {list(t.shape)}")


def build_moe_ffn(b: GraphBuilder, m: int, p: str, layer: int, a: MoEArgs, n_embd: int) -> int:
    """The expert FFN of layer `layer` (tensor prefix `p`, "blk.N.") on its normed input m [T, n_embd]."""

    def w(name: str, *shape: int):
        return b.weight(p + name, shape)

    def bias(name: str, *shape: int):
        return w(name + ".bias", *shape) if a.biases else None

    d, ff, e = n_embd, a.n_ff, a.n_expert
    logits = b.matmul(m, w("ffn_gate_inp.weight", d, e), p + "ffn_moe_logits", layer, bias("ffn_gate_inp", e))
    sel = w("exp_probs_b.bias", e) if a.selection_bias else None
    weights, ids = b.moe_route(logits, n_used=a.n_used, gating=a.gating, norm=a.norm, scale=a.scale,
                               name=p + "ffn_moe_route", layer=layer, bias=sel)
    gate = b.moe_matmul(m, ids, w("ffn_gate_exps.weight", d, ff, e), p + "ffn_moe_gate", layer,
                        bias("ffn_gate_exps", ff, e))
    up = b.moe_matmul(m, ids, w("ffn_up_exps.weight", d, ff, e), p + "ffn_moe_up", layer, bias("ffn_up_exps", ff, e))
    if a.act == "swiglu_oai":
        act = b.swiglu_oai(gate, up, p + "ffn_moe_swiglu_oai", layer, alpha=SWIGLU_OAI_ALPHA, limit=SWIGLU_OAI_LIMIT)
    else:
        act = b.swiglu(gate, up, p + "ffn_moe_swiglu", layer)
    down = b.moe_matmul(act, ids, w("ffn_down_exps.weight", ff, d, e), p + "ffn_moe_down", layer,
                        bias("ffn_down_exps", d, e))
    return b.moe_sum(down, weights, p + "ffn_moe_out", layer)
