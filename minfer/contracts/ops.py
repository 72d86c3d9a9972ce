"""The closed vocabulary registrable contracts speak: op kinds, their interfaces, and dtype names.

An op kind fixes the *interface* every kernel implementing it shares: the names of its tensor
inputs and launch parameters (the launcher is called with exactly these keywords, plus
`out=` when it takes one), and the dimension symbols its contracts may use in cost formulas
and predicates, with how to compute them from real shapes and params. Two kernels of one op
kind are therefore interchangeable to the caller, and the picker can choose between them.

Describe-only sections (`registrable: false`, e.g. the seed's Vulkan kernels) may name op
kinds outside this vocabulary; their formulas may use the conventional symbols `CONVENTIONAL_DIMS`.

Dtype names are the contracts' spelling (`F32`, `U8`...); a quantized byte stream is declared
as `U8` plus an `fdx.quant` block naming its ggml storage type.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..quant.types import QUANT_TABLE, by_name, quant_info

DTYPES = ("F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U32", "U8", "BOOL")
STORAGE_TYPES = tuple(q.contract_name for q in QUANT_TABLE.values())
CONVENTIONAL_DIMS = frozenset({"m", "n", "k", "n_blocks", "n_elements", "rows", "cols"})

Shapes = Mapping[str, tuple[int, ...]]


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


@dataclass(frozen=True)
class OpSpec:
    """One op kind: interface names, dimension symbols and how to derive them."""

    name: str
    fused: bool  # True: a fused op (contracts name it with `fused_op:`), else `op_kind:`
    inputs: tuple[str, ...]  # tensor keyword arguments, in order
    params: tuple[str, ...]  # non-tensor keyword arguments
    dims: tuple[str, ...]  # symbols its contracts' formulas and predicates may use
    summary: str
    derive: Callable[[Shapes, Mapping[str, Any]], dict[str, int]]

    def dims_of(self, shapes: Shapes, params: Mapping[str, Any]) -> dict[str, int]:
        """Dimension values for concrete input shapes and params (KeyError/ValueError if malformed)."""
        return {k: int(v) for k, v in self.derive(shapes, params).items()}


def _elementwise(first: str) -> Callable[[Shapes, Mapping[str, Any]], dict[str, int]]:
    return lambda s, p: {"n": _numel(s[first])}


def _qmatmul(s: Shapes, p: Mapping[str, Any]) -> dict[str, int]:
    x = s["x"]
    return {"m": _numel(x[:-1]) if len(x) > 1 else 1, "n": p["n"], "k": p["k"]}


def _dequant(s: Shapes, p: Mapping[str, Any]) -> dict[str, int]:
    n = p["rows"] * p["cols"]
    return {"rows": p["rows"], "cols": p["cols"], "n": n, "src_bytes": _numel(s["raw_u8"]),
            "out_bytes": n * p["out_dtype"].itemsize}


def _get_rows(s: Shapes, p: Mapping[str, Any]) -> dict[str, int]:
    return {"n_ids": _numel(s["ids"]), "n_embd": p["n_embd"],
            "row_bytes": _quant(p["qtype"]).nbytes(p["n_embd"])}


def _quant(qtype: Any):
    """Quant table row of a qtype given as GGMLType, ggml id or name."""
    return by_name(qtype) if isinstance(qtype, str) else quant_info(qtype)


def _add_bias(s: Shapes, p: Mapping[str, Any]) -> dict[str, int]:
    return {"rows": p["n_rows"], "n": _numel(s["b"])}


def _rows_of(x: tuple[int, ...]) -> int:
    return _numel(x[:-1]) if len(x) > 1 else 1


def _attention(s: Shapes, p: Mapping[str, Any]) -> dict[str, int]:
    ck = s["cache_k"]  # [layers, slots, kv heads, ctx, head_dim]
    return {"rows": _rows_of(s["q"]), "ctx": ck[3], "n_head": p["n_head"], "n_head_kv": p["n_head_kv"],
            "head_dim": p["head_dim"], "cache_item": 2, "window": p.get("window") or 0}


def _moe_matmul(s: Shapes, p: Mapping[str, Any]) -> dict[str, int]:
    t, used = s["ids"]
    return {"m": t, "n_used": used, "slots": t * used, "n": p["n"], "k": p["k"], "n_expert": p["n_expert"]}


OPS: dict[str, OpSpec] = {
    o.name: o
    for o in [
        OpSpec("Add", False, ("x", "y"), (), ("n",), "out = x + y (same shapes)", _elementwise("x")),
        OpSpec("Mul", False, ("x", "y"), (), ("n",), "out = x * y (same shapes)", _elementwise("x")),
        OpSpec(
            "AddBias", False, ("y", "b"), ("n_rows",), ("rows", "n"),
            "y[r, :] += b for every row r (in place)", _add_bias,
        ),
        OpSpec("Silu", False, ("x",), (), ("n",), "out = x * sigmoid(x)", _elementwise("x")),
        OpSpec(
            "SwiGLU", True, ("gate", "up"), (), ("n",), "out = silu(gate) * up (fused)", _elementwise("gate"),
        ),
        OpSpec(
            "GeGLU", True, ("gate", "up"), (), ("n",), "out = gelu_tanh(gate) * up (fused; gemma's feed-forward)",
            _elementwise("gate"),
        ),
        OpSpec(
            "SwiGLUOAI", True, ("gate", "up"), ("alpha", "limit"), ("n",),
            "out = g * sigmoid(alpha * g) * (u + 1), g = min(gate, limit), u = clamp(up, -limit, limit) (fused; "
            "gpt-oss's clamped SwiGLU, ggml's swiglu_oai)", _elementwise("gate"),
        ),
        OpSpec("Scale", False, ("x",), ("scale",), ("n",), "out = x * scale (gemma's embedding scale)",
               _elementwise("x")),
        OpSpec("SoftCap", False, ("x",), ("cap",), ("n",), "out = cap * tanh(x / cap) (gemma2's logit soft-cap)",
               _elementwise("x")),
        OpSpec("Convert", False, ("x",), (), ("n",), "out = x rounded to another float dtype",
               _elementwise("x")),
        OpSpec(
            "Dequantize", False, ("raw_u8",), ("qtype", "rows", "cols", "out_dtype"),
            ("rows", "cols", "n", "src_bytes", "out_bytes"),
            "[rows, cols] ggml block stream -> dense float", _dequant,
        ),
        OpSpec(
            "GetRows", False, ("weight_u8", "ids"), ("qtype", "n_embd"), ("n_ids", "n_embd", "row_bytes"),
            "out[i] = dequant(weight row ids[i]) (embedding gather)", _get_rows,
        ),
        OpSpec(
            "QuantizeQ8_0", False, ("x_f32",), (), ("n", "cols"), "f32 rows -> Q8_0 blocks (d = max|x|/127)",
            lambda s, p: {"n": _numel(s["x_f32"]), "cols": s["x_f32"][-1] if s["x_f32"] else 1},
        ),
        OpSpec(
            "QMatMul", False, ("x", "w"), ("n", "k", "qtype"), ("m", "n", "k"),
            "out[m, n] = x[m, k] @ dequant(w)[n, k]^T (w's storage type: qtype)", _qmatmul,
        ),
        OpSpec(
            "QMatMulSwiGLU", True, ("x", "w"), ("n", "k", "qtype"), ("m", "n", "k"),
            "out[m, :n/2] = silu(y[m, :n/2]) * y[m, n/2:], y = x @ dequant(w)^T: a fused gate+up projection "
            "with the SwiGLU after it (n: both halves' rows)", _qmatmul,
        ),
        OpSpec(
            "QMatMulGeGLU", True, ("x", "w"), ("n", "k", "qtype"), ("m", "n", "k"),
            "out[m, :n/2] = gelu_tanh(y[m, :n/2]) * y[m, n/2:], y = x @ dequant(w)^T: gemma's gate+up projection "
            "with the GeGLU after it", _qmatmul,
        ),
        OpSpec(
            "QMatMulRoPE", True, ("x", "w", "b", "positions", "cos", "sin"),
            ("n", "k", "qtype", "n_heads", "head_dim", "n_rot", "neox"), ("m", "n", "k"),
            "out = x @ dequant(w)^T + b, then RoPE (cos/sin tables, at positions) of its first n_heads * head_dim "
            "columns: a fused q+k+v projection with its bias and the rotation of q and k", _qmatmul,
        ),
        OpSpec(
            "QMatMulAddNorm", True, ("x", "w", "res", "w_n"), ("n", "k", "qtype"), ("m", "n", "k"),
            "a deferred RMSNorm's writer: h = res + x @ dequant(w)^T stored over res, out = h * w_n (the norm's "
            "numerator; the matmuls after it read it with `rstd_in` and divide by h's rms, from the row tiles' "
            "sums of h^2 it also writes into `ss`)", _qmatmul,
        ),
        OpSpec(
            "RMSNorm", False, ("x", "w"), ("eps", "group"), ("rows", "d", "group"),
            "out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w; with `group` each run of `group` values of a "
            "row on its own, w [group] shared by the runs (qwen3's and gemma3's per-head q / k norms)",
            lambda s, p: {"rows": _rows_of(s["x"]), "d": s["x"][-1], "group": p.get("group") or s["x"][-1]},
        ),
        OpSpec(
            "AddRMSNorm", True, ("x", "y", "w"), ("eps",), ("rows", "d"),
            "out = RMSNorm(x + y) (the residual add and the next norm, fused)",
            lambda s, p: {"rows": _rows_of(s["x"]), "d": s["x"][-1]},
        ),
        OpSpec(
            "NormAddRMSNorm", True, ("x", "y", "w_y", "w"), ("eps",), ("rows", "d"),
            "out = RMSNorm(x + RMSNorm(y) with w_y) with w (gemma's post-norm, the residual add and the next norm)",
            lambda s, p: {"rows": _rows_of(s["x"]), "d": s["x"][-1]},
        ),
        OpSpec(
            "NormRoPE", True, ("x", "w_q", "w_k", "positions", "cos", "sin"),
            ("n_heads", "n_heads_k", "head_dim", "n_rot", "neox", "eps"), ("rows", "n"),
            "out = RoPE of x's first n_heads (q) and next n_heads_k (k) heads, each RMS-normed on its own with "
            "w_q / w_k first (qwen3's and gemma3's per-head q / k norms with the rotation after them)",
            lambda s, p: {"rows": s["x"][0], "n": (p["n_heads"] + p["n_heads_k"]) * p["head_dim"]},
        ),
        OpSpec(
            "RoPE", False, ("x", "positions", "cos", "sin"), ("n_heads", "head_dim", "n_rot", "neox"),
            ("rows", "n"), "rotary position embedding of [rows, n_heads * head_dim] at positions (cos/sin tables)",
            lambda s, p: {"rows": s["x"][0], "n": p["n_heads"] * p["head_dim"]},
        ),
        OpSpec(
            "Attention", False, ("q", "k", "v", "cache_k", "cache_v", "row_slots", "positions"),
            ("layer", "n_head", "n_head_kv", "head_dim", "scale", "spans", "window", "softcap"),
            ("rows", "ctx", "n_head", "n_head_kv", "head_dim", "cache_item", "window"),
            "write each row's k, v at (slot, position) of the layer's cache, then causal GQA attention of "
            "its q over positions 0..position of its slot (`spans`: the host's (first row, slot, start, rows) "
            "of each sequence, or None); `window` > 0: only the last `window` positions (sliding-window "
            "layers); `softcap` > 0: scores s become softcap * tanh(s / softcap) before the softmax", _attention,
        ),
        OpSpec(
            "MoERoute", False, ("logits", "bias"), ("n_used", "gating", "norm", "scale"),
            ("rows", "n_expert", "n_used"),
            "(weights [rows, n_used] f32, ids [rows, n_used] i32): the n_used experts of largest gating(logits) + "
            "bias (softmax, sigmoid or the logits themselves; bias zeros for none), largest first; their gating "
            "values (softmaxed for softmax_weight), divided by their sum when norm, times scale",
            lambda s, p: {"rows": _rows_of(s["logits"]), "n_expert": s["logits"][-1], "n_used": p["n_used"]},
        ),
        OpSpec(
            "MoEMatMul", False, ("x", "ids", "w"), ("n", "k", "qtype", "n_expert"),
            ("m", "n_used", "slots", "n", "k", "n_expert"),
            "out[t, j, :] = x[t] (x [m, k]) or x[t, j] (x [m, n_used, k]) @ dequant(w)[ids[t, j]]^T: w the "
            "n_expert matrices [n, k] of a 3-D expert tensor (qtype), only the chosen ones read", _moe_matmul,
        ),
        OpSpec(
            "MoEMatMulGLU", True, ("x", "ids", "w"), ("n", "k", "qtype", "n_expert", "glu", "alpha", "limit"),
            ("m", "n_used", "slots", "n", "k", "n_expert"),
            "out[t, j, :] = glu(x[t] @ G[e]^T, x[t] @ U[e]^T), e = ids[t, j]: w stacks the n_expert gate matrices "
            "G [n, k], then the n_expert up matrices U (qtype), only the chosen ones read; glu 'swiglu' (silu(g) u) "
            "or 'swiglu_oai' (gpt-oss: g' sigmoid(alpha g') (clamp(u, -limit, limit) + 1), g' = min(g, limit)); "
            "with expert_bias, `bias` holds 2 n_expert n values (the gate experts', then the up experts'), added "
            "before the glu: an expert layer's gate and up projections and the GLU after them", _moe_matmul,
        ),
        OpSpec(
            "MoESum", False, ("y", "weights"), (), ("rows", "n_used", "n"),
            "out[t, :] = sum over j = 0..n_used-1, in that order, of weights[t, j] * y[t, j, :]",
            lambda s, p: {"rows": s["y"][0], "n_used": s["y"][1], "n": s["y"][2]},
        ),
        OpSpec(
            "RowSelect", False, ("x", "rows"), (), ("n_rows", "width"), "out[i, :] = x[rows[i], :]",
            lambda s, p: {"n_rows": _numel(s["rows"]), "width": s["x"][-1]},
        ),
        OpSpec(
            "Sample", False, ("x", "params"), (), ("rows", "width"),
            "out[r] = the token drawn from row r's logits under its packed sampling parameters (top-k, top-p, "
            "min-p, temperature, the counter-based uniform of minfer.rng; the argmax at temperature 0)",
            lambda s, p: {"rows": _rows_of(s["x"]), "width": s["x"][-1]},
        ),
        OpSpec(
            "Argmax", False, ("x",), (), ("rows", "width"),
            "out[r] = the index of row r's largest value (the first of equal ones): greedy decoding's token",
            lambda s, p: {"rows": _rows_of(s["x"]), "width": s["x"][-1]},
        ),
    ]
}


@dataclass(frozen=True)
class Capability:
    """Something a kernel can do beyond its op, declared in its contract (`caps.also`) and asked
    for by the compiler (backends/compile.py) when a fusion of graph/fuse.py pairs two nodes. The
    launcher takes `keywords` for it (the validator checks)."""

    name: str
    keywords: tuple[str, ...]
    summary: str


CAPABILITIES: dict[str, Capability] = {
    c.name: c
    for c in [
        Capability("q8_out", ("q8",), "also writes its output's int8 records into `q8` (a buffer of "
                   "quantize_act_q8's / q8_records' layout) for the matmul that reads them"),
        Capability("q8_in", ("xq",), "reads x's int8 records from `xq` (written by the node before it) instead of "
                   "quantizing x; `caps.q8_passes` names the function giving the passes it reads for a weight"),
        Capability("kv_out_f16", ("cache_k", "cache_v", "row_slots", "layer", "n_head_kv"),
                   "a fused q+k+v projection that also writes the row's k and v into an f16 KV cache"),
        Capability("kv_skip", ("kv_written",), "an attention that skips its own KV write (`kv_written=True`) "
                   "when the projection before it wrote the row's k and v"),
        Capability("row_chunk", ("first_row", "total_rows"), "a gather whose table is rows first_row.. of a "
                   "larger one of total_rows rows: it writes only the ids that fall in its rows (ids outside "
                   "0..total_rows-1 taken as the nearest edge row, as the whole table's gather does), so one call "
                   "per chunk fills the output (a table larger than the device binds at once)"),
        Capability("sinks", ("sinks",), "an attention with one learned logit per query head (`sinks` f32 "
                   "[n_head], gpt-oss; ggml_soft_max_add_sinks): it joins the softmax's max and denominator and "
                   "adds no value"),
        Capability("expert_bias", ("bias",), "an expert matmul that adds each chosen expert's bias in its "
                   "epilogue: `bias` f32 [n_expert * n] (expert e's n values at e * n), row ids[t, j] of it "
                   "added to out[t, j] (gpt-oss's ffn_*_exps.bias), the ids read on the device"),
        Capability("rstd_in", ("rstd",), "a matmul whose x is a deferred RMSNorm's h * w (QMatMulAddNorm's "
                   "value): `rstd` = (the row tiles' sums of h^2 it wrote, eps), each output divided by "
                   "sqrt(their sum / k + eps) before the store (and any epilogue)"),
        Capability("residual_in_place", ("sum_out",), "a fused add + norm whose sum `sum_out` may be x itself "
                   "(the residual written over in place)"),
    ]
}


def op_spec(name: str) -> OpSpec | None:
    """The op kind or fused op called `name`, or None."""
    return OPS.get(name)


def torch_dtype(name: str):
    """torch dtype for a contract dtype name (KeyError if it has none)."""
    import torch

    return {
        "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
        "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
        "U32": torch.uint32, "U8": torch.uint8, "BOOL": torch.bool,
    }[name]


def dtype_name(dtype: Any) -> str:
    """Contract dtype name of a torch dtype or a name string (KeyError if unknown)."""
    if isinstance(dtype, str):
        key = dtype.upper()
        if key in DTYPES:
            return key
        raise KeyError(dtype)
    for name in DTYPES:
        if torch_dtype(name) == dtype:
            return name
    raise KeyError(str(dtype))
