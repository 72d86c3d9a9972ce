"""Per-op test material shared by the conformance harness and the judge.

For every op kind of ops.py: the sizes to exercise (CI size classes `tiny` / `odd` / `boundary`,
and the layer sizes of real models), an input builder drawing fresh random tensors on the
generator's device, ONE float64 reference function built from minfer.quant.reference and plain
torch ops, and the op's compulsory memory traffic for the judge (`traffic`: every operand byte
read once, the output written once, counted from the real tensors, so it follows their dtypes).
Quantized inputs are random valid blocks: every bit pattern of the quants, finite f16 scales
(E8M0 exponents of model-like size).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..quant import reference
from ..quant.types import GGMLType, QuantInfo, by_name, quant_info
from .ops import torch_dtype

SIZE_CLASSES = ("tiny", "odd", "boundary")
PREFILL_TOKENS = 512
# The size class of weights above 2^24 values (kernels/triton/gemv.py Q8_MIN_WEIGHTS), where the Q4 GEMVs read x
# as two int8 passes and their contracts' bound is 1e-4 (f32 x: 1e-5); with --full only: under the Triton
# interpreter one such case takes minutes.
LARGE = "large"
LARGE_K = 1536  # 6 K-quant super-blocks (SmolLM2's FFN width)
LARGE_N = 10944  # the first multiple of 64 rows above 2^24 / LARGE_K


@dataclass(frozen=True)
class ModelDims:
    """Layer sizes of one model: hidden size, FFN size, vocabulary."""

    d: int
    ffn: int
    vocab: int


MODELS = {
    "SmolLM2-135M": ModelDims(576, 1536, 49152),
    "Qwen2.5-0.5B": ModelDims(896, 4864, 151936),
    "Qwen2.5-7B": ModelDims(3584, 18944, 152064),
    # a mixture of experts (the MoE ops' model sizes: 128 experts of 768, 8 used; ffn: its dense width 6144)
    "Qwen3-30B-A3B": ModelDims(2048, 6144, 151936),
}
MOE_MODELS = {"Qwen3-30B-A3B": (128, 8, 768)}  # (experts, used, expert width)


@dataclass(frozen=True)
class Setting:
    """Sizes of one case: input shapes (a quant operand: its [rows, cols] of elements) and the
    numeric params; `size` names its size class or model; `needs`: the capabilities (ops.py
    CAPABILITIES) the case's extra inputs ask of a kernel (only kernels whose contract declares
    them in `caps.also` run it)."""

    size: str
    shapes: dict[str, tuple[int, ...]]
    params: dict[str, int] = field(default_factory=dict)
    needs: tuple[str, ...] = ()


Builder = Callable[[Setting, dict[str, str], "str | None", torch.Generator], tuple[dict, dict]]
Reference = Callable[[Mapping[str, torch.Tensor], Mapping[str, Any], Mapping[str, str]], torch.Tensor]
# (inputs, params) -> {input name: (mask of the elements the op writes, their expected new values or None)}
Writes = Callable[[Mapping[str, torch.Tensor], Mapping[str, Any]],
                  dict[str, tuple[torch.Tensor, "torch.Tensor | None"]]]


Reads = Callable[[Mapping[str, torch.Tensor], Mapping[str, Any]], int]


def _whole_inputs(inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> int:
    """Bytes read when every input is read once, whole."""
    return sum(t.numel() * t.element_size() for t in inputs.values())


@dataclass(frozen=True)
class OpHarness:
    """How to exercise one op kind."""

    settings: Callable[[str, QuantInfo | None], list[Setting]]  # CI size class -> settings
    model: Callable[[str, ModelDims, QuantInfo | None], list[Setting]]  # model layer sizes -> settings
    build: Builder  # (setting, input dtypes, output dtype choice, generator) -> (inputs, params)
    reference: Reference  # (inputs, params, input dtypes) -> float64 expected output
    reads: Reads = _whole_inputs  # (inputs, params) -> bytes the op must read
    # inputs the op updates besides its output (the KV cache): which elements, and what they become;
    # every other element of every input must keep its bytes
    writes: Writes | None = None
    large: Callable[[QuantInfo | None], list[Setting]] | None = None  # the LARGE size class's settings


def traffic(op: str, inputs: Mapping[str, torch.Tensor], params: Mapping[str, Any], out_bytes: int) -> int:
    """Compulsory bytes of one call of `op`: its reads plus its `out_bytes` output written once."""
    return HARNESS[op].reads(inputs, params) + out_bytes


# ---- random inputs ----------------------------------------------------------------------------

FLOAT_STORAGE = {GGMLType.F32: torch.float32, GGMLType.F16: torch.float16, GGMLType.BF16: torch.bfloat16}


def random_blocks(info: QuantInfo, rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """[rows, row_bytes] uint8 on gen's device: random valid `info` blocks in the row-major
    [rows][cols] layout of a GGUF tensor (every quant bit pattern, finite scales)."""
    row_bytes = info.nbytes(cols)
    dev = gen.device
    if info.type in FLOAT_STORAGE:
        vals = torch.randn(rows, cols, generator=gen, device=dev).to(FLOAT_STORAGE[info.type])
        return vals.view(torch.uint8).reshape(rows, row_bytes)
    n_blocks = rows * cols // info.block_elems
    blocks = torch.randint(0, 256, (n_blocks, info.block_bytes), generator=gen, dtype=torch.uint8, device=dev)
    for off in info.f16_offsets:  # finite random scales (random bytes could spell inf/NaN)
        scales = (torch.randn(n_blocks, generator=gen, device=dev) * 0.05).to(torch.float16)
        blocks[:, off : off + 2] = scales.view(torch.uint8).reshape(n_blocks, 2)
    for off in info.e8m0_offsets:  # shared exponents 2^-10 .. 2^-4 (MXFP4 weights of |x| up to 0.75)
        blocks[:, off] = torch.randint(118, 125, (n_blocks,), generator=gen, dtype=torch.uint8, device=dev)
    return blocks.reshape(rows, row_bytes)


def _randn(shape, dtype: str, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen, device=gen.device).to(torch_dtype(dtype))


def _info(qtype: Any) -> QuantInfo:
    return by_name(qtype) if isinstance(qtype, str) else quant_info(qtype)


def _decode(raw: torch.Tensor, qtype: Any, cols: int) -> torch.Tensor:
    """Rows of `qtype` blocks, `cols` elements each, decoded by the reference codec, float64."""
    info = _info(qtype)
    return reference.dequantize(raw, info.type, (raw.numel() // info.nbytes(cols), cols)).double()


def _silu64(x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    return x * torch.sigmoid(x)


def _swiglu_oai64(gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """ggml's swiglu_oai in float64: g = min(gate, limit), u = clamp(up, -limit, limit), g sigmoid(alpha g) (u + 1)."""
    g = gate.double().clamp(max=limit)
    return g * torch.sigmoid(alpha * g) * (up.double().clamp(-limit, limit) + 1.0)


def _gelu64(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x.double(), approximate="tanh")


def _with_params(pair: tuple[Callable, Callable], **params) -> tuple[Callable, Callable]:
    """_flat's (settings, model) with constant params added to every case."""
    settings, model = pair

    def add(cases: list[Setting]) -> list[Setting]:
        return [Setting(c.size, c.shapes, {**c.params, **params}) for c in cases]

    return (lambda size, q: add(settings(size, q))), (lambda name, m, q: add(model(name, m, q)))


# ---- elementwise ------------------------------------------------------------------------------

_FLAT = {"tiny": [(5,)], "odd": [(3, 37)], "boundary": [(4097,), (2, 4096)]}


def _flat(*names: str, wide: bool = False) -> tuple[Callable, Callable]:
    """Settings for ops whose inputs all share one shape; `wide`: model sizes use the FFN width."""

    def settings(size: str, q) -> list[Setting]:
        return [Setting(size, dict.fromkeys(names, s)) for s in _FLAT[size]]

    def model(name: str, m: ModelDims, q) -> list[Setting]:
        width = m.ffn if wide else m.d
        return [Setting(name, dict.fromkeys(names, (t, width))) for t in (1, PREFILL_TOKENS)]

    return settings, model


def _build_floats(s: Setting, dtypes: dict[str, str], out_dtype: str | None, gen) -> tuple[dict, dict]:
    return {n: _randn(shape, dtypes[n], gen) for n, shape in s.shapes.items()}, dict(s.params)


_BIAS = {"tiny": [(1, 5)], "odd": [(3, 37)], "boundary": [(2, 1025)]}


def _bias_settings(size: str, q) -> list[Setting]:
    return [Setting(size, {"y": (r, d), "b": (d,)}, {"n_rows": r}) for r, d in _BIAS[size]]


def _bias_model(name: str, m: ModelDims, q) -> list[Setting]:
    return [Setting(name, {"y": (t, m.d), "b": (m.d,)}, {"n_rows": t}) for t in (1, PREFILL_TOKENS)]


# ---- dequant / embedding gather ---------------------------------------------------------------


def _dequant_settings(size: str, q: QuantInfo) -> list[Setting]:
    be = q.block_elems
    rows, cols = {"tiny": (1, be), "odd": (3, 3 * be), "boundary": (2, be * (1024 // be + 1))}[size]
    return [Setting(size, {"raw_u8": (rows, cols)}, {"rows": rows, "cols": cols})]


def _dequant_model(name: str, m: ModelDims, q: QuantInfo) -> list[Setting]:
    if m.ffn % q.block_elems:  # the FFN down weight [d, ffn]: rows of ffn elements
        return []
    return [Setting(name, {"raw_u8": (m.d, m.ffn)}, {"rows": m.d, "cols": m.ffn})]


def _build_dequant(s: Setting, dtypes: dict[str, str], out_dtype: str | None, gen) -> tuple[dict, dict]:
    info = by_name(dtypes["raw_u8"])
    rows, cols = s.params["rows"], s.params["cols"]
    params = {"qtype": info.type, "rows": rows, "cols": cols, "out_dtype": torch_dtype(out_dtype)}
    return {"raw_u8": random_blocks(info, rows, cols, gen)}, params


def _ref_dequant(i: Mapping[str, torch.Tensor], p: Mapping[str, Any], d: Mapping[str, str]) -> torch.Tensor:
    return _decode(i["raw_u8"], p["qtype"], p["cols"])


def _get_rows_settings(size: str, q: QuantInfo) -> list[Setting]:
    be = q.block_elems
    vocab, n_embd, n_ids = {
        "tiny": (3, be, 1),
        "odd": (7, 3 * be, 5),
        "boundary": (33, be * (1024 // be + 1), 17),
    }[size]
    return [Setting(size, {"weight_u8": (vocab, n_embd), "ids": (n_ids,)}, {"n_embd": n_embd})]


JUDGE_VOCAB_ROWS = 8192  # the gather's cost does not depend on the table's length


def _get_rows_model(name: str, m: ModelDims, q: QuantInfo) -> list[Setting]:
    if m.d % q.block_elems:
        return []
    vocab = min(m.vocab, JUDGE_VOCAB_ROWS)
    return [
        Setting(name, {"weight_u8": (vocab, m.d), "ids": (t,)}, {"n_embd": m.d}) for t in (1, PREFILL_TOKENS)
    ]


def _build_get_rows(s: Setting, dtypes: dict[str, str], out_dtype: str | None, gen) -> tuple[dict, dict]:
    info = by_name(dtypes["weight_u8"])
    vocab, n_embd = s.shapes["weight_u8"]
    n_ids = s.shapes["ids"][0]
    ids = torch.randint(0, vocab, (n_ids,), generator=gen, dtype=torch.int32, device=gen.device)
    ids[0], ids[-1] = vocab - 1, 0  # both ends of the table, every time
    weight = random_blocks(info, vocab, n_embd, gen)
    return {"weight_u8": weight, "ids": ids}, {"qtype": info.type, "n_embd": n_embd}


def _get_rows_reads(i: Mapping[str, torch.Tensor], p: Mapping[str, Any]) -> int:
    """The ids and one encoded table row per id (the rest of the table is never touched)."""
    ids = i["ids"]
    return ids.numel() * ids.element_size() + ids.numel() * _info(p["qtype"]).nbytes(p["n_embd"])


def _ref_get_rows(i: Mapping[str, torch.Tensor], p: Mapping[str, Any], d: Mapping[str, str]) -> torch.Tensor:
    row_bytes = _info(p["qtype"]).nbytes(p["n_embd"])
    rows = i["weight_u8"].reshape(-1, row_bytes)[i["ids"].long()]  # gather the bytes, decode only those
    return _decode(rows.contiguous(), p["qtype"], p["n_embd"])


# ---- quantize ---------------------------------------------------------------------------------

_Q8 = {"tiny": [(32,)], "odd": [(3, 96)], "boundary": [(4128,), (2, 2080)]}


def _quantize_settings(size: str, q) -> list[Setting]:
    return [Setting(size, {"x_f32": s}) for s in _Q8[size]]


def _quantize_model(name: str, m: ModelDims, q) -> list[Setting]:
    return [Setting(name, {"x_f32": (t, m.d)}) for t in (1, PREFILL_TOKENS)]


def _ref_quantize(i: Mapping[str, torch.Tensor], p: Mapping[str, Any], d: Mapping[str, str]) -> torch.Tensor:
    # On the CPU: torch's CUDA elementwise kernels may contract x * (1/d) into an FMA, which moves
    # a code at a rounding boundary (seen on an H200: 2-3 codes in 10M); ggml's quantizer is f32
    # with no fusion, which the CPU reference reproduces bit for bit.
    x = i["x_f32"]
    ref = reference.dequantize(reference.quantize(x.cpu(), GGMLType.Q8_0), GGMLType.Q8_0, x.shape)
    return ref.double().to(x.device)


# ---- quantized matmul -------------------------------------------------------------------------

_PAST_1024 = 1024 + 32  # the boundary class's k: one 32-value block past 1024 values (`_k_scaled`)
_MNK = {
    "tiny": [(1, 16, 32), (2, 16, 32)],
    "odd": [(1, 7, 96), (3, 7, 96)],
    "boundary": [(1, 65, _PAST_1024), (17, 65, _PAST_1024)],
}


def _mnk_for(size: str, q: QuantInfo | None) -> list[tuple[int, int, int]]:
    """The size class's (m, n, k), k in whole blocks of q (`_k_scaled`)."""
    return [(m, n, _k_scaled(k, q)) for m, n, k in _MNK[size]]


def _mnk_settings(size: str, mnk: list[tuple[int, int, int]]) -> list[Setting]:
    out = []
    for m, n, k in mnk:
        out.append(Setting(size, {"x": (m, k), "w": (n, k)}, {"n": n, "k": k}))
        if m == 1:
            out.append(Setting(size, {"x": (k,), "w": (n, k)}, {"n": n, "k": k}))
    return out


def _qmatmul_model(name: str, md: ModelDims, q: QuantInfo) -> list[Setting]:
    """FFN up (decode), FFN down (decode), FFN up (prefill); x always [m, k]."""
    mnk = [(1, md.ffn, md.d), (1, md.d, md.ffn), (PREFILL_TOKENS, md.ffn, md.d)]
    return [
        Setting(name, {"x": (m, k), "w": (n, k)}, {"n": n, "k": k})
        for m, n, k in mnk
        if k % q.block_elems == 0
    ]


def _large_gemv(q: QuantInfo | None) -> list[Setting]:
    """One decode row through a weight of LARGE_N x LARGE_K values (> 2^24)."""
    return [Setting(LARGE, {"x": (1, LARGE_K), "w": (LARGE_N, LARGE_K)}, {"n": LARGE_N, "k": LARGE_K})]


def _build_qmatmul(s: Setting, dtypes: dict[str, str], out_dtype: str | None, gen) -> tuple[dict, dict]:
    info = by_name(dtypes["w"])
    n, k = s.shapes["w"]
    inputs = {"x": _randn(s.shapes["x"], dtypes["x"], gen), "w": random_blocks(info, n, k, gen)}
    return inputs, {"n": n, "k": k, "qtype": info.type}


def _ref_qmatmul(i: Mapping[str, torch.Tensor], p: Mapping[str, Any], d: Mapping[str, str]) -> torch.Tensor:
    return i["x"].reshape(-1, p["k"]).double() @ _decode(i["w"], d["w"], p["k"]).T  # [m, n]; x [k] is m = 1


# ---- fused decode GEMVs (gemv_fused.py): + SwiGLU, + bias and RoPE ------------------------------

# (n, k) of the SwiGLU case: n the stacked gate+up rows (a whole number of 32-row tiles)
_PAIR_NK = {"tiny": [(32, 32)], "odd": [(96, 96)], "boundary": [(64, _PAST_1024)]}
# (n, k, rotated heads, head_dim, n_rot, neox): n = the rotated heads' columns + the rest (v)
_QKV = {"tiny": [(32, 32, 3, 8, 8, False)], "odd": [(96, 96, 5, 16, 12, True)],
        "boundary": [(64, _PAST_1024, 1, 32, 32, True)]}
# a model's (q heads, kv heads, head_dim)
QKV_HEADS = {"SmolLM2-135M": (9, 3, 64), "Qwen2.5-0.5B": (14, 2, 64), "Qwen2.5-7B": (28, 4, 128),
             "Qwen3-30B-A3B": (32, 4, 128)}


def _k_scaled(k: int, q: QuantInfo | None) -> int:
    """A size class's k (counted in 32-value blocks) for q's block size: as many blocks of q's
    (K-quants: 256 values each), except the boundary's one block past 1024 values, which stays one
    block of q's past 1024 (1280 for a K-quant, as dequant's and get_rows' boundary cases): the same
    tail, a block count that is not a power of two and K splits that end mid super-block, in a sixth
    of the 8448 values the scaling would give (each of those cases took 6-13 s under the interpreter)."""
    be = max(q.block_elems, 32) if q else 32  # float types: 32-value blocks like the rest (1056)
    if k == _PAST_1024:
        return 1024 + be
    return k * max(1, be // 32)


def _swiglu_settings(size: str, q) -> list[Setting]:
    return [Setting(size, {"x": (1, kk), "w": (n, kk)}, {"n": n, "k": kk})
            for n, k in _PAIR_NK[size] for kk in [_k_scaled(k, q)]]


def _swiglu_model(name: str, md: ModelDims, q: QuantInfo) -> list[Setting]:
    n, k = 2 * md.ffn, md.d
    return [Setting(name, {"x": (1, k), "w": (n, k)}, {"n": n, "k": k})] if k % q.block_elems == 0 else []


def _large_rope_mm(q: QuantInfo | None) -> list[Setting]:
    """The stacked q+k+v GEMV above 2^24 values: 160 rotated heads of 64 and 11 more (v)."""
    return [_qkv_setting(LARGE, LARGE_N, LARGE_K, 160, 64, 64, True)]


def _ref_swiglu_mm(i: Mapping[str, torch.Tensor], p: Mapping[str, Any], d: Mapping[str, str]) -> torch.Tensor:
    y = _ref_qmatmul(i, p, d)
    f = p["n"] // 2
    return _silu64(y[:, :f]) * y[:, f:]


def _ref_geglu_mm(i: Mapping[str, torch.Tensor], p: Mapping[str, Any], d: Mapping[str, str]) -> torch.Tensor:
    y = _ref_qmatmul(i, p, d)
    f = p["n"] // 2
    return _gelu64(y[:, :f]) * y[:, f:]


def _add_norm_setting(size: str, n: int, k: int) -> Setting:
    return Setting(size, {"x": (1, k), "w": (n, k), "res": (1, n), "w_n": (n,)}, {"n": n, "k": k})


def _add_norm_harness() -> OpHarness:
    """QMatMulAddNorm (a deferred RMSNorm's writer): the size classes' one-row (m, n, k), and a model's
    attention output [d, d] and FFN down [d, ffn] projections; out = (res + x W^T) * w_n, res
    overwritten with the sum (its values: the kernel tests, with the tiles' sums of squares)."""
    def settings(size: str, q) -> list[Setting]:
        return [_add_norm_setting(size, n, k) for m, n, k in _mnk_for(size, q) if m == 1]

    def model(name: str, md: ModelDims, q: QuantInfo) -> list[Setting]:
        return [_add_norm_setting(name, md.d, k) for k in (md.d, md.ffn) if k % q.block_elems == 0]

    def build(s: Setting, dtypes: dict[str, str], out_dtype: str | None, gen) -> tuple[dict, dict]:
        inputs, params = _build_qmatmul(s, dtypes, out_dtype, gen)
        inputs.update({name: _randn(shape, "F32", gen) for name, shape in s.shapes.items() if name not in inputs})
        return inputs, params

    def reference(i: Mapping[str, torch.Tensor], p: Mapping[str, Any], d: Mapping[str, str]) -> torch.Tensor:
        y = _ref_qmatmul(i, p, d)
        return (i["res"].double().reshape(y.shape) + y) * i["w_n"].double()

    def writes(i: Mapping[str, torch.Tensor], p: Mapping[str, Any]) -> dict:
        return {"res": (torch.ones(i["res"].shape, dtype=torch.bool), None)}

    return OpHarness(settings, model, build, reference, writes=writes)


def _qkv_setting(size: str, n: int, k: int, heads: int, hd: int, n_rot: int, neox: bool) -> Setting:
    return Setting(size, {"x": (1, k), "w": (n, k), "b": (n,), "positions": (1,), "cos": (ROPE_CTX, n_rot // 2),
                          "sin": (ROPE_CTX, n_rot // 2)},
                   {"n": n, "k": k, "n_heads": heads, "head_dim": hd, "n_rot": n_rot, "neox": neox})


def _rope_mm_settings(size: str, q) -> list[Setting]:
    return [_qkv_setting(size, n, _k_scaled(k, q), *rest) for n, k, *rest in _QKV[size]]


def _rope_mm_model(name: str, md: ModelDims, q: QuantInfo) -> list[Setting]:
    nh, nkv, hd = QKV_HEADS[name]
    if md.d % q.block_elems:
        return []
    return [_qkv_setting(name, (nh + 2 * nkv) * hd, md.d, nh + nkv, hd, hd, True)]


def _build_rope_mm(s: Setting, dtypes: dict[str, str], out_dtype: str | None, gen) -> tuple[dict, dict]:
    inputs, params = _build_qmatmul(s, dtypes, out_dtype, gen)
    rope_inputs, _ = _build_rope(Setting(s.size, {"x": (1, 2), "cos": s.shapes["cos"]}), dtypes, out_dtype, gen)
    inputs.update(b=_randn(s.shapes["b"], "F32", gen), positions=rope_inputs["positions"], cos=rope_inputs["cos"],
                  sin=rope_inputs["sin"])
    params.update({name: s.params[name] for name in ("n_heads", "head_dim", "n_rot", "neox")})
    return inputs, params


def _ref_rope_mm(i: Mapping[str, torch.Tensor], p: Mapping[str, Any], d: Mapping[str, str]) -> torch.Tensor:
    y = _ref_qmatmul(i, p, d) + i["b"].double()
    c = p["n_heads"] * p["head_dim"]
    qk = {"x": y[:, :c].contiguous(), "positions": i["positions"], "cos": i["cos"], "sin": i["sin"]}
    y[:, :c] = _ref_rope(qk, p, d)
    return y


# ---- RMSNorm / RoPE / row select -----------------------------------------------------------------

_NORM = {"tiny": [(1, 8)], "odd": [(3, 37)], "boundary": [(2, 4097), (5, 576)]}


def _norm_settings(size: str, q) -> list[Setting]:
    return [Setting(size, {"x": (r, d), "w": (d,)}, {"eps": 1e-5}) for r, d in _NORM[size]]


def _norm_model(name: str, m: ModelDims, q) -> list[Setting]:
    return [Setting(name, {"x": (t, m.d), "w": (m.d,)}, {"eps": 1e-6}) for t in (1, PREFILL_TOKENS)]


def _with_y(s: Setting, *weights: str) -> Setting:
    """A norm setting with a second operand y of x's shape (the fused residual add), and more
    weights of w's shape (`weights`: the post-norm's w_y)."""
    return Setting(s.size, {**s.shapes, "y": s.shapes["x"], **dict.fromkeys(weights, s.shapes["w"])}, s.params)


def _ref_norm(i: Mapping[str, torch.Tensor], p: Mapping[str, Any], d: Mapping[str, str]) -> torch.Tensor:
    x = i["x"].double()
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + p["eps"]) * i["w"].double()


# (rows, n_heads, head_dim, n_rot, neox)
_ROPE = {"tiny": [(1, 1, 8, 8, False)], "odd": [(3, 3, 16, 12, True)], "boundary": [(17, 5, 64, 64, True),
                                                                                   (9, 2, 128, 96, False)]}
ROPE_CTX = 4096


def _rope_setting(size: str, rows: int, heads: int, hd: int, n_rot: int, neox: bool) -> Setting:
    return Setting(size, {"x": (rows, heads * hd), "positions": (rows,), "cos": (ROPE_CTX, n_rot // 2),
                          "sin": (ROPE_CTX, n_rot // 2)},
                   {"n_heads": heads, "head_dim": hd, "n_rot": n_rot, "neox": neox})


def _rope_settings(size: str, q) -> list[Setting]:
    return [_rope_setting(size, *c) for c in _ROPE[size]]


def _rope_model(name: str, m: ModelDims, q) -> list[Setting]:
    hd = 64 if m.d < 1024 else 128
    return [_rope_setting(name, t, m.d // hd, hd, hd, True) for t in (1, PREFILL_TOKENS)]


def _build_rope(s: Setting, dtypes: dict[str, str], out_dtype: str | None, gen) -> tuple[dict, dict]:
    rows = s.shapes["x"][0]
    n_ctx, half = s.shapes["cos"]
    x = _randn(s.shapes["x"], "F32", gen)
    positions = torch.randint(0, n_ctx, (rows,), generator=gen, dtype=torch.int32, device=gen.device)
    positions[0] = n_ctx - 1  # the table's last row, every time
    inv = 10000.0 ** (-torch.arange(half, dtype=torch.float64) / half)
    ang = torch.arange(n_ctx, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang).float().to(gen.device), torch.sin(ang).float().to(gen.device)
    return {"x": x, "positions": positions, "cos": cos, "sin": sin}, dict(s.params)


def _ref_rope(i: Mapping[str, torch.Tensor], p: Mapping[str, Any], d: Mapping[str, str]) -> torch.Tensor:
    x = i["x"].double()
    rows, hd, n_rot = x.shape[0], p["head_dim"], p["n_rot"]
    h = x.view(rows, p["n_heads"], hd).clone()
    pos = i["positions"].long()
    c = i["cos"].double()[pos][:, None, :]
    s = i["sin"].double()[pos][:, None, :]
    half = n_rot // 2
    ia = torch.arange(half) if p["neox"] else 2 * torch.arange(half)
    ib = ia + half if p["neox"] else ia + 1
    a, b = h[..., ia].clone(), h[..., ib].clone()
    h[..., ia] = a * c - b * s
    h[..., ib] = a * s + b * c
    return h.reshape(rows, -1)


_SELECT = {"tiny": [(1, 1, 4)], "odd": [(7, 3, 37)], "boundary": [(600, 17, 1025)]}


def _select_settings(size: str, q) -> list[Setting]:
    return [Setting(size, {"x": (t, w), "rows": (r,)}) for t, r, w in _SELECT[size]]


def _select_model(name: str, m: ModelDims, q) -> list[Setting]:
    return [Setting(name, {"x": (PREFILL_TOKENS, m.d), "rows": (r,)}) for r in (1, 64)]


def _build_select(s: Setting, dtypes: dict[str, str], out_dtype: str | None, gen) -> tuple[dict, dict]:
    t = s.shapes["x"][0]
    rows = torch.randint(0, t, s.shapes["rows"], generator=gen, dtype=torch.int32, device=gen.device)
    rows[-1] = t - 1
    return {"x": _randn(s.shapes["x"], "F32", gen), "rows": rows}, {}


_ARGMAX = {"tiny": [(1, 4)], "odd": [(3, 37)], "boundary": [(64, 1025), (2, 49153)]}


def _argmax_settings(size: str, q) -> list[Setting]:
    return [Setting(size, {"x": s}) for s in _ARGMAX[size]]


def _argmax_model(name: str, m: ModelDims, q) -> list[Setting]:
    return [Setting(name, {"x": (r, m.vocab)}) for r in (1, 16, 64)]


def _build_argmax(s: Setting, dtypes: dict[str, str], out_dtype: str | None, gen) -> tuple[dict, dict]:
    x = _randn(s.shapes["x"], "F32", gen)
    x[0, -1] = x.max() + 1.0  # row 0's largest value last (the edge of the last tile)
    if x.shape[1] > 1:
        x[-1, :2] = x.max() + 2.0  # a tie: the first index of equal values wins
    return {"x": x}, {}


_SAMPLE = {"tiny": [(1, 8)], "odd": [(5, 37)], "boundary": [(64, 1025), (3, 49153)]}
_SAMPLE_PARAM_ROWS = 7


def _sample_settings(size: str, q) -> list[Setting]:
    return [Setting(size, {"x": s, "params": (_SAMPLE_PARAM_ROWS, s[0])}) for s in _SAMPLE[size]]


def _sample_model(name: str, m: ModelDims, q) -> list[Setting]:
    return [Setting(name, {"x": (r, m.vocab), "params": (_SAMPLE_PARAM_ROWS, r)}) for r in (1, 16)]


def _build_sample(s: Setting, dtypes: dict[str, str], out_dtype: str | None, gen) -> tuple[dict, dict]:
    rows, width = s.shapes["x"]
    x = _randn(s.shapes["x"], "F32", gen) * 3.0
    pick = torch.randint(0, 1 << 30, (rows, 6), generator=gen, device=gen.device).tolist()
    k = [1 + a % min(64, width) for a, *_ in pick]
    temp = [0.0 if b % 4 == 0 else 0.4 + (b % 100) / 80 for _, b, *_ in pick]
    top_p = [1.0 if c % 2 else 0.5 + (c % 50) / 100 for _, _, c, *_ in pick]
    min_p = [0.0 if d % 2 else (d % 20) / 100 for *_, d, _, _ in pick]
    seed = [(e << 34) ^ f for *_, e, f in pick]
    p = torch.zeros(_SAMPLE_PARAM_ROWS, rows, dtype=torch.int32)
    p[0] = torch.tensor(k, dtype=torch.int32)
    p[1:4] = torch.tensor([temp, top_p, min_p], dtype=torch.float32).view(torch.int32)
    p[4] = torch.tensor([z & 0x7FFFFFFF for z in seed], dtype=torch.int32)
    p[5] = torch.tensor([(z >> 32) & 0x7FFFFFFF for z in seed], dtype=torch.int32)
    p[6] = torch.tensor([a % 5000 for a, *_ in pick], dtype=torch.int32)
    return {"x": x, "params": p.to(gen.device)}, {}


def _ref_sample(i: Mapping[str, torch.Tensor], p: Mapping[str, Any], d: Mapping[str, str]) -> torch.Tensor:
    """Row by row in float64: the argmax at temperature 0; else sort, keep the top-k, the smallest
    prefix reaching top_p, those at least min_p times the best, soften by the temperature, and take
    the first candidate whose cumulative probability passes u * total."""
    from ..rng import uniform

    x, prm = i["x"].double().cpu(), i["params"].cpu()
    fl = prm[1:4].contiguous().view(torch.float32).double()
    out = []
    for r in range(x.shape[0]):
        temp, top_p, min_p = (float(fl[j, r]) for j in range(3))
        if temp == 0.0:
            out.append(float(torch.argmax(x[r])))
            continue
        vals, ids = torch.sort(x[r], descending=True, stable=True)
        keep = min(int(prm[0, r]), vals.numel())
        if top_p < 1.0:
            cum = torch.softmax(vals[:keep], 0).cumsum(0)
            keep = min(keep, int((cum < top_p).sum()) + 1)
        if min_p > 0.0:
            pr = torch.softmax(vals[:keep], 0)
            keep = max(1, int((pr >= min_p * pr[0]).sum()))
        cdf = torch.softmax(vals[:keep] / temp, 0).cumsum(0)
        seed = (int(prm[5, r]) & 0xFFFFFFFF) << 32 | (int(prm[4, r]) & 0xFFFFFFFF)
        u = uniform(seed, int(prm[6, r]))
        out.append(float(ids[min(int((cdf <= u * cdf[-1]).sum()), keep - 1)]))
    return torch.tensor(out, dtype=torch.float64)


# ---- attention over the KV cache ----------------------------------------------------------------

# (span lengths, n_head, n_head_kv, head_dim, n_ctx[, window, softcap]); each span is one sequence in its own slot
_ATTN = {
    "tiny": [((1,), 2, 1, 16, 32), ((1,), 2, 1, 32, 8)],
    "odd": [((1, 1, 1), 3, 1, 16, 40), ((5,), 4, 2, 32, 24), ((7, 1), 2, 1, 32, 40, 3, 0.0)],
    "boundary": [((1, 1), 8, 2, 64, 1100), ((65, 1), 4, 4, 64, 130), ((3, 1), 4, 2, 128, 70),  # hd 128: small tiles
                 ((1, 1), 4, 2, 64, 1100, 600, 0.0), ((65, 1), 4, 2, 64, 130, 9, 3.0)],  # windows, soft-cap
}


def _attn_setting(size: str, spans, n_head: int, n_kv: int, hd: int, n_ctx: int, window: int = 0,
                  softcap: float = 0.0) -> Setting:
    rows, slots = sum(spans), len(spans) + 1  # one extra slot, never attended: must stay untouched (writes)
    shapes = {"q": (rows, n_head * hd), "k": (rows, n_kv * hd), "v": (rows, n_kv * hd),
              "cache_k": (2, slots, n_kv, n_ctx, hd), "cache_v": (2, slots, n_kv, n_ctx, hd),
              "row_slots": (rows,), "positions": (rows,)}
    return Setting(size, shapes, {"layer": 1, "n_head": n_head, "n_head_kv": n_kv, "head_dim": hd,
                                  "scale": hd ** -0.5, "spans": spans, "window": window, "softcap": softcap})


# gpt-oss's attention sinks (caps.also: sinks): a decode row, a prompt of 5 with a window, and a context of
# several splits (the combine kernel's share)
_ATTN_SINKS = {"tiny": [((1,), 2, 1, 32, 8)], "odd": [((5, 1), 4, 2, 32, 24, 3, 0.0)],
               "boundary": [((1, 1), 8, 2, 64, 1100)]}


def _attn_settings(size: str, q) -> list[Setting]:
    plain = [_attn_setting(size, *c) for c in _ATTN[size]]
    return plain + [_with_sinks(_attn_setting(size, *c)) for c in _ATTN_SINKS[size]]


def _with_sinks(s: Setting) -> Setting:
    """The case with one sink logit per query head (`sinks` [n_head])."""
    return Setting(s.size, {**s.shapes, "sinks": (s.params["n_head"],)}, s.params, ("sinks",))


def _attn_model(name: str, m: ModelDims, q) -> list[Setting]:
    hd = 64 if m.d < 1024 else 128
    n_head = m.d // hd
    n_kv = max(1, n_head // 7) if m.d > 1024 else 3 if m.d == 576 else 2
    if n_head % n_kv:
        n_kv = 1
    return [_attn_setting(name, (1,) * 4, n_head, n_kv, hd, 1024),
            _attn_setting(name, (PREFILL_TOKENS,), n_head, n_kv, hd, 1024)]


def _build_attn(s: Setting, dtypes: dict[str, str], out_dtype: str | None, gen) -> tuple[dict, dict]:
    dev = gen.device
    p = dict(s.params)
    spans = p.pop("spans")
    n_ctx = s.shapes["cache_k"][3]
    cache_dt = torch_dtype(dtypes["cache_k"])
    inputs = {n: _randn(s.shapes[n], "F32", gen) for n in ("q", "k", "v")}
    for n in ("cache_k", "cache_v"):  # random history in every slot (what a step must not disturb)
        if cache_dt == torch.int8 and s.shapes[n][-1] % 32 == 0:  # the Q8_0 layout: random rows, quantized
            inputs[n] = _q8_rows(torch.randn(s.shapes[n], generator=gen, device=dev))
        elif cache_dt == torch.int8:  # (no Q8_0 rows of this width: the contract refuses the case)
            inputs[n] = torch.zeros(s.shapes[n], dtype=torch.int8, device=dev)
        else:
            inputs[n] = torch.randn(s.shapes[n], generator=gen, device=dev).to(cache_dt)
    slots, positions = [], []
    for i, n in enumerate(spans):  # span i: slot i, positions start..start+n-1, start random
        start = int(torch.randint(0, n_ctx - n + 1, (1,), generator=gen, device=dev))
        if i == 0:
            start = n_ctx - n  # up to the cache's last position
        slots += [i] * n
        positions += range(start, start + n)
    inputs["row_slots"] = torch.tensor(slots, dtype=torch.int32, device=dev)
    inputs["positions"] = torch.tensor(positions, dtype=torch.int32, device=dev)
    if "sinks" in s.shapes:  # logits of the scores' size, a few well above them (most weight on the sink)
        inputs["sinks"] = torch.randn(s.shapes["sinks"], generator=gen, device=dev) * 2.0
    return inputs, p


def _q8_rows(x: torch.Tensor) -> torch.Tensor:
    """f32 rows [..., hd] -> the Q8_0 cache layout [..., hd + hd / 16] int8 (the codes, then the
    f16 scales' bytes), by the reference quantizer."""
    hd = x.shape[-1]
    blocks = reference.quantize(x.float().cpu(), GGMLType.Q8_0).view(*x.shape[:-1], hd // 32, 34)
    codes = blocks[..., 2:].reshape(*x.shape[:-1], hd)
    scales = blocks[..., :2].reshape(*x.shape[:-1], hd // 16)
    return torch.cat([codes, scales], -1).view(torch.int8).to(x.device)


def _q8_values(c: torch.Tensor, hd: int) -> torch.Tensor:
    """The Q8_0 cache layout back to float64 values [..., hd]."""
    scales = c[..., hd:].contiguous().view(torch.float16).double()
    return c[..., :hd].double() * scales.repeat_interleave(32, dim=-1)


def _ref_attn(i: Mapping[str, torch.Tensor], p: Mapping[str, Any], d: Mapping[str, str]) -> torch.Tensor:
    """k/v written (rounded to the cache dtype, or quantized to Q8_0), then each row over 0..its
    position, float64."""
    layer, nh, nkv, hd = p["layer"], p["n_head"], p["n_head_kv"], p["head_dim"]
    ck = i["cache_k"][layer].clone()
    cv = i["cache_v"][layer].clone()
    rows = i["q"].shape[0]
    slots, pos = i["row_slots"].long(), i["positions"].long()
    if ck.dtype == torch.int8:
        ck[slots, :, pos] = _q8_rows(i["k"].view(rows, nkv, hd))
        cv[slots, :, pos] = _q8_rows(i["v"].view(rows, nkv, hd))
        ck, cv = _q8_values(ck, hd), _q8_values(cv, hd)
    else:
        ck[slots, :, pos] = i["k"].view(rows, nkv, hd).to(ck.dtype)
        cv[slots, :, pos] = i["v"].view(rows, nkv, hd).to(cv.dtype)
    q = i["q"].double().view(rows, nh, hd)
    out = torch.empty(rows, nh, hd, dtype=torch.float64, device=q.device)
    g = nh // nkv
    window, cap = p.get("window", 0), p.get("softcap", 0.0)
    for r in range(rows):
        lo = max(0, int(pos[r]) + 1 - window) if window else 0  # a sliding window: the last `window` positions
        keys = ck[slots[r], :, lo: pos[r] + 1].double().repeat_interleave(g, 0)  # [nh, L, hd]
        vals = cv[slots[r], :, lo: pos[r] + 1].double().repeat_interleave(g, 0)
        s = (keys @ q[r][:, :, None])[..., 0] * p["scale"]
        if cap:
            s = torch.tanh(s / cap) * cap
        if "sinks" in i:  # each head's sink joins the softmax as one more logit with no value
            att = torch.softmax(torch.cat([s, i["sinks"].double().to(s.device)[:, None]], -1), -1)[:, :-1]
        else:
            att = torch.softmax(s, -1)  # [nh, L]
        out[r] = (att[:, None, :] @ vals)[:, 0]
    return out.reshape(rows, nh * hd)


def _attn_writes(i: Mapping[str, torch.Tensor], p: Mapping[str, Any]) -> dict:
    """The cache rows a step writes, cache[layer, slot_r, :, position_r] for every row r (k and v
    rounded to a float cache's dtype; a Q8_0 cache's codes are left to the output's check): nothing
    else of either cache may change, the extra slot no span attends included."""
    layer, nkv, hd = p["layer"], p["n_head_kv"], p["head_dim"]
    rows, slots, pos = i["q"].shape[0], i["row_slots"].long(), i["positions"].long()
    out = {}
    for name, src in (("cache_k", "k"), ("cache_v", "v")):
        cache = i[name]
        mask = torch.zeros(cache.shape, dtype=torch.bool, device=cache.device)
        mask[layer, slots, :, pos] = True
        want = None
        if cache.dtype != torch.int8:
            want = cache.clone()
            want[layer, slots, :, pos] = i[src].view(rows, nkv, hd).to(cache.dtype)
        out[name] = (mask, want)
    return out


def _attn_reads(i: Mapping[str, torch.Tensor], p: Mapping[str, Any]) -> int:
    """q, k, v once; each row's cached keys and values up to its position."""
    cache = i["cache_k"]
    per_pos = 2 * p["n_head_kv"] * cache.shape[-1] * cache.element_size()  # (a Q8_0 row: codes + scales)
    qkv = sum(i[n].numel() * 4 for n in ("q", "k", "v"))
    return qkv + int((i["positions"].long() + 1).sum()) * per_pos


# ---- mixture of experts -------------------------------------------------------------------------

# (rows, experts, used, gating, norm, scale): every gating function, a bias on all but tiny, llama.cpp's
# largest expert count
_ROUTE = {"tiny": [(1, 8, 2, "softmax", True, 1.0)], "odd": [(3, 37, 5, "sigmoid", False, 2.5)],
          "boundary": [(5, 128, 8, "softmax_weight", True, 1.0), (2, 1024, 8, "softmax", True, 0.5)]}


def _route_settings(size: str, q) -> list[Setting]:
    return [Setting(size, {"logits": (t, e), "bias": (e,)}, {"n_used": k, "gating": g, "norm": nm, "scale": sc})
            for t, e, k, g, nm, sc in _ROUTE[size]]


def _build_route(s: Setting, dtypes: dict[str, str], out_dtype: str | None, gen) -> tuple[dict, dict]:
    t, e = s.shapes["logits"]
    logits = torch.randn(t, e, generator=gen, device=gen.device) * 3
    bias = torch.randn(e, generator=gen, device=gen.device) * 0.3 if s.size != "tiny" else \
        torch.zeros(e, device=gen.device)
    return {"logits": logits, "bias": bias}, dict(s.params)


def _ref_route(i: Mapping[str, torch.Tensor], p: Mapping[str, Any], d: Mapping[str, str]) -> tuple:
    """(weights, ids) in float64: graph/ir.py's MoERoute written out (stable order: lower index first)."""
    x = i["logits"].double()
    probs = {"softmax": lambda: torch.softmax(x, -1), "sigmoid": lambda: torch.sigmoid(x)}.get(p["gating"], lambda: x)()
    ids = torch.argsort(probs + i["bias"].double(), dim=-1, descending=True, stable=True)[:, :p["n_used"]]
    w = probs.gather(-1, ids)
    if p["gating"] == "softmax_weight":
        w = torch.softmax(w, -1)
    if p["norm"]:
        w = w / w.sum(-1, keepdim=True).clamp(min=6.103515625e-5)
    return w * p["scale"], ids.to(torch.int32)


# (tokens, used, experts, n, k, x per slot): x [T, k] feeds every chosen expert (gate, up), x [T, used, k] one each
# (small: under the Triton interpreter a program costs per step, and one launch runs tokens x used of them)
_MOE_MM = {"tiny": [(1, 1, 2, 8, 32, False)], "odd": [(2, 3, 5, 7, 96, True)],
           "boundary": [(2, 2, 3, 33, 32, False)]}
# with each expert's bias (caps.also: expert_bias, gpt-oss): gate / up and down, in the odd class's types
_MOE_MM_BIAS = {"tiny": [], "odd": [(2, 2, 3, 33, 32, False), (3, 2, 4, 9, 64, True)], "boundary": []}


# The expert kernels run the GEMV's and the MMQ's arithmetic per type (each type's own contracts test it at
# every size); what is theirs (slots, expert ids, x rows, the row offset every plane of a layout takes) does
# not depend on the type, and a case costs ~1 s per launch under the Triton interpreter: the tiny case runs a
# type of each other layout family (nibbles, planes in 16-value halves, byte codes), the odd and boundary
# ones the affine nibbles (Q4_K: the 30B-A3B's experts) and the float experts (F16)
_MOE_MM_TINY = (GGMLType.Q4_0, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.F16)
_MOE_MM_ALL = (GGMLType.Q4_K, GGMLType.F16)


def _moe_mm_settings(size: str, q) -> list[Setting]:
    if q is not None and q.type not in (_MOE_MM_TINY if size == "tiny" else _MOE_MM_ALL):
        return []
    out = []
    for cases, bias in ((_MOE_MM[size], False), (_MOE_MM_BIAS[size], True)):
        for t, used, e, n, k, per_slot in cases:
            kk = _k_scaled(k, q)
            shapes = {"x": (t, used, kk) if per_slot else (t, kk), "ids": (t, used), "w": (e * n, kk)}
            if bias:
                shapes["bias"] = (e * n,)
            out.append(Setting(size, shapes, {"n": n, "k": kk, "n_expert": e}, ("expert_bias",) if bias else ()))
    return out


def _build_moe_mm(s: Setting, dtypes: dict[str, str], out_dtype: str | None, gen) -> tuple[dict, dict]:
    info = by_name(dtypes["w"])
    e, (t, used) = s.params["n_expert"], s.shapes["ids"]
    ids = torch.randint(0, e, (t, used), generator=gen, dtype=torch.int32, device=gen.device)
    ids.view(-1)[0], ids.view(-1)[-1] = e - 1, 0  # both ends of the expert tensor, every time
    inputs = {"x": _randn(s.shapes["x"], dtypes["x"], gen), "ids": ids,
              "w": random_blocks(info, *s.shapes["w"], gen)}
    if "bias" in s.shapes:
        inputs["bias"] = _randn(s.shapes["bias"], "F32", gen)
    return inputs, {**s.params, "qtype": info.type}


def _ref_moe_mm(i: Mapping[str, torch.Tensor], p: Mapping[str, Any], d: Mapping[str, str]) -> torch.Tensor:
    e, n, k = p["n_expert"], p["n"], p["k"]
    dense = _decode(i["w"], d["w"], k).view(e, n, k)
    ids = i["ids"].long()
    x = i["x"].double()
    x = x if x.dim() == 3 else x.unsqueeze(1).expand(-1, ids.shape[1], -1)
    out = torch.einsum("tjk,tjnk->tjn", x, dense[ids])
    if "bias" in i:  # each slot's expert's bias
        out = out + i["bias"].double().view(e, n)[ids]
    return out


def _moe_mm_reads(i: Mapping[str, torch.Tensor], p: Mapping[str, Any]) -> int:
    """x, the ids and the chosen experts' bytes, each expert once."""
    per_expert = i["w"].numel() * i["w"].element_size() // p["n_expert"]
    return sum(i[n].numel() * i[n].element_size() for n in ("x", "ids")) + \
        int(torch.unique(i["ids"]).numel()) * per_expert


# MoEMatMulGLU: (tokens, used, experts, n, k, glu, bias); limit 1.5 for swiglu_oai (gpt-oss: 7) so that a tenth of
# the normal sums clamp; n odd and not a multiple of any tile's half (the GEMV's pair tiles end part-way)
_MOE_GLU = {"tiny": [(1, 1, 2, 8, 32, "swiglu", False)],
            "odd": [(2, 2, 3, 9, 64, "swiglu", False), (3, 2, 4, 9, 32, "swiglu_oai", True)],
            "boundary": [(2, 2, 3, 33, 32, "swiglu", False)]}
_GLU_PARAMS = {"swiglu": (0.0, 0.0), "swiglu_oai": (1.702, 1.5)}


def _glu_setting(size: str, t: int, used: int, e: int, n: int, k: int, glu: str, bias: bool) -> Setting:
    shapes = {"x": (t, k), "ids": (t, used), "w": (2 * e * n, k)}
    if bias:
        shapes["bias"] = (2 * e * n,)
    alpha, limit = _GLU_PARAMS[glu]
    return Setting(size, shapes, {"n": n, "k": k, "n_expert": e, "glu": glu, "alpha": alpha, "limit": limit},
                   ("expert_bias",) if bias else ())


def _moe_glu_settings(size: str, q) -> list[Setting]:
    if q is not None and q.type not in (_MOE_MM_TINY if size == "tiny" else _MOE_MM_ALL):
        return []
    return [_glu_setting(size, t, used, e, n, _k_scaled(k, q), glu, bias)
            for t, used, e, n, k, glu, bias in _MOE_GLU[size]]


def _moe_glu_model(name: str, m: ModelDims, q) -> list[Setting]:
    """A mixture of experts' gate + up projections and SwiGLU at a decode row, a batch of 16, a prompt."""
    if name not in MOE_MODELS or (q is not None and m.d % q.block_elems):
        return []
    e, used, ff = MOE_MODELS[name]
    return [_glu_setting(name, t, used, e, ff, m.d, "swiglu", False) for t in (1, 16, PREFILL_TOKENS)]


def _build_moe_glu(s: Setting, dtypes: dict[str, str], out_dtype: str | None, gen) -> tuple[dict, dict]:
    """_build_moe_mm's inputs; for swiglu_oai x scaled so that the sums are ~N(0, 1) (random blocks
    of the k-quant types hold weights of std ~10-50): a tenth of them clamp at limit 1.5."""
    inputs, params = _build_moe_mm(s, dtypes, out_dtype, gen)
    if params["glu"] == "swiglu_oai":
        sums = inputs["x"].double() @ _decode(inputs["w"], dtypes["w"], params["k"]).T
        inputs["x"] = (inputs["x"] / float(sums.std())).contiguous()
    return inputs, params


def _ref_moe_glu(i: Mapping[str, torch.Tensor], p: Mapping[str, Any], d: Mapping[str, str]) -> torch.Tensor:
    e, n, k = p["n_expert"], p["n"], p["k"]
    dense = _decode(i["w"], d["w"], k).view(2 * e, n, k)
    ids = i["ids"].long()
    x = i["x"].double()
    g = torch.einsum("tk,tjnk->tjn", x, dense[ids])
    u = torch.einsum("tk,tjnk->tjn", x, dense[ids + e])
    if "bias" in i:
        b = i["bias"].double().view(2 * e, n)
        g, u = g + b[ids], u + b[ids + e]
    if p["glu"] == "swiglu_oai":
        return _swiglu_oai64(g, u, p["alpha"], p["limit"])
    return _silu64(g) * u


def _moe_glu_reads(i: Mapping[str, torch.Tensor], p: Mapping[str, Any]) -> int:
    """x, the ids and the chosen experts' gate and up bytes, each expert once."""
    return _moe_mm_reads(i, {**p, "n_expert": 2 * p["n_expert"]}) + \
        int(torch.unique(i["ids"]).numel()) * (i["w"].numel() * i["w"].element_size() // (2 * p["n_expert"]))


_MOE_SUM = {"tiny": [(1, 2, 5)], "odd": [(3, 3, 37)], "boundary": [(5, 8, 257)]}


def _moe_sum_settings(size: str, q) -> list[Setting]:
    return [Setting(size, {"y": (t, k, n), "weights": (t, k)}) for t, k, n in _MOE_SUM[size]]


def _ref_moe_sum(i: Mapping[str, torch.Tensor], p: Mapping[str, Any], d: Mapping[str, str]) -> torch.Tensor:
    return (i["y"].double() * i["weights"].double().unsqueeze(-1)).sum(1)


def _route_model(name: str, m: ModelDims, q) -> list[Setting]:
    """A mixture of experts' router: a decode row, a decode batch of 16, a 512-token prompt."""
    if name not in MOE_MODELS:
        return []
    e, used, _ = MOE_MODELS[name]
    return [Setting(name, {"logits": (t, e), "bias": (e,)}, {"n_used": used, "gating": "softmax", "norm": True,
                                                           "scale": 1.0}) for t in (1, 16, PREFILL_TOKENS)]


def _moe_mm_model(name: str, m: ModelDims, q) -> list[Setting]:
    """The expert matmuls of a mixture of experts: gate / up (x [T, d]) and down (x [T, used, ff]) at a
    decode row, a decode batch of 16 and a 512-token prompt."""
    if name not in MOE_MODELS or (q is not None and (m.d % q.block_elems or MOE_MODELS[name][2] % q.block_elems)):
        return []
    e, used, ff = MOE_MODELS[name]
    out = []
    for t in (1, 16, PREFILL_TOKENS):
        out.append(Setting(name, {"x": (t, m.d), "ids": (t, used), "w": (e * ff, m.d)},
                           {"n": ff, "k": m.d, "n_expert": e}))
        out.append(Setting(name, {"x": (t, used, ff), "ids": (t, used), "w": (e * m.d, ff)},
                           {"n": m.d, "k": ff, "n_expert": e}))
    return out


def _moe_sum_model(name: str, m: ModelDims, q) -> list[Setting]:
    if name not in MOE_MODELS:
        return []
    used = MOE_MODELS[name][1]
    return [Setting(name, {"y": (t, used, m.d), "weights": (t, used)}) for t in (1, 16, PREFILL_TOKENS)]

# (rows, q heads, k heads, head_dim, n_rot, neox): gemma3's head of 256, qwen3's of 128, a partial rotation
_NORM_ROPE = {"tiny": [(1, 1, 1, 8, 8, True)], "odd": [(3, 3, 1, 24, 16, False)],
              "boundary": [(5, 4, 1, 256, 256, True), (2, 8, 2, 128, 96, True)]}


def _norm_rope_setting(size: str, rows: int, nq: int, nk: int, hd: int, n_rot: int, neox: bool) -> Setting:
    # x one head wider than q and k (a v after them, untouched): the kernel's rows are strided
    return Setting(size, {"x": (rows, (nq + nk + 1) * hd), "w_q": (hd,), "w_k": (hd,), "positions": (rows,),
                          "cos": (ROPE_CTX, n_rot // 2), "sin": (ROPE_CTX, n_rot // 2)},
                   {"n_heads": nq, "n_heads_k": nk, "head_dim": hd, "n_rot": n_rot, "neox": neox, "eps": 1e-6})


def _build_norm_rope(s: Setting, dtypes: dict[str, str], out_dtype: str | None, gen) -> tuple[dict, dict]:
    inputs, _ = _build_rope(Setting(s.size, {"x": s.shapes["x"], "cos": s.shapes["cos"]}), dtypes, out_dtype, gen)
    hd = s.params["head_dim"]
    inputs.update(w_q=_randn((hd,), "F32", gen) + 1.0, w_k=_randn((hd,), "F32", gen) + 1.0)
    return inputs, dict(s.params)


def _ref_norm_rope(i: Mapping[str, torch.Tensor], p: Mapping[str, Any], d: Mapping[str, str]) -> torch.Tensor:
    hd, nq, nk = p["head_dim"], p["n_heads"], p["n_heads_k"]
    rows = i["x"].shape[0]
    h = i["x"].double()[:, :(nq + nk) * hd].reshape(rows, nq + nk, hd)
    w = torch.cat([i["w_q"].double().expand(nq, hd), i["w_k"].double().expand(nk, hd)])
    normed = h / torch.sqrt((h * h).mean(-1, keepdim=True) + p["eps"]) * w
    qk = {"x": normed.reshape(rows, -1), "positions": i["positions"], "cos": i["cos"], "sin": i["sin"]}
    return _ref_rope(qk, {**p, "n_heads": nq + nk}, d)


HARNESS: dict[str, OpHarness] = {
    "Add": OpHarness(*_flat("x", "y"), _build_floats, lambda i, p, d: i["x"].double() + i["y"].double()),
    "Mul": OpHarness(*_flat("x", "y"), _build_floats, lambda i, p, d: i["x"].double() * i["y"].double()),
    "Silu": OpHarness(*_flat("x", wide=True), _build_floats, lambda i, p, d: _silu64(i["x"])),
    "SwiGLU": OpHarness(
        *_flat("gate", "up", wide=True), _build_floats, lambda i, p, d: _silu64(i["gate"]) * i["up"].double()
    ),
    "GeGLU": OpHarness(
        *_flat("gate", "up", wide=True), _build_floats, lambda i, p, d: _gelu64(i["gate"]) * i["up"].double()
    ),
    # limit 1.5 (gpt-oss: 7): a tenth of the normal inputs clamped, on both sides of up
    "SwiGLUOAI": OpHarness(*_with_params(_flat("gate", "up", wide=True), alpha=1.702, limit=1.5), _build_floats,
                           lambda i, p, d: _swiglu_oai64(i["gate"], i["up"], p["alpha"], p["limit"])),
    "Scale": OpHarness(*_with_params(_flat("x"), scale=25.3), _build_floats,
                       lambda i, p, d: i["x"].double() * torch.tensor(p["scale"], dtype=torch.float32).double()),
    "SoftCap": OpHarness(*_with_params(_flat("x"), cap=1.5), _build_floats,
                         lambda i, p, d: torch.tanh(i["x"].double() / p["cap"]) * p["cap"]),
    "Convert": OpHarness(*_flat("x"), _build_floats, lambda i, p, d: i["x"].double()),
    "AddBias": OpHarness(
        _bias_settings, _bias_model, _build_floats, lambda i, p, d: i["y"].double() + i["b"].double()
    ),
    "Dequantize": OpHarness(_dequant_settings, _dequant_model, _build_dequant, _ref_dequant),
    "GetRows": OpHarness(
        _get_rows_settings, _get_rows_model, _build_get_rows, _ref_get_rows, _get_rows_reads
    ),
    "QuantizeQ8_0": OpHarness(_quantize_settings, _quantize_model, _build_floats, _ref_quantize),
    "QMatMul": OpHarness(
        lambda size, q: _mnk_settings(size, _mnk_for(size, q)), _qmatmul_model, _build_qmatmul, _ref_qmatmul,
        large=_large_gemv),
    "QMatMulSwiGLU": OpHarness(_swiglu_settings, _swiglu_model, _build_qmatmul, _ref_swiglu_mm, large=_large_gemv),
    "QMatMulGeGLU": OpHarness(_swiglu_settings, _swiglu_model, _build_qmatmul, _ref_geglu_mm, large=_large_gemv),
    "QMatMulRoPE": OpHarness(_rope_mm_settings, _rope_mm_model, _build_rope_mm, _ref_rope_mm, large=_large_rope_mm),
    "QMatMulAddNorm": _add_norm_harness(),
    "RMSNorm": OpHarness(_norm_settings, _norm_model, _build_floats, _ref_norm),
    "AddRMSNorm": OpHarness(
        lambda size, q: [_with_y(x) for x in _norm_settings(size, q)],
        lambda name, m, q: [_with_y(x) for x in _norm_model(name, m, q)],
        _build_floats, lambda i, p, d: _ref_norm({"x": i["x"].double() + i["y"].double(), "w": i["w"]}, p, d)),
    "NormAddRMSNorm": OpHarness(
        lambda size, q: [_with_y(x, "w_y") for x in _norm_settings(size, q)],
        lambda name, m, q: [_with_y(x, "w_y") for x in _norm_model(name, m, q)],
        _build_floats, lambda i, p, d: _ref_norm({"x": i["x"].double() + _ref_norm({"x": i["y"], "w": i["w_y"]}, p, d),
                                                  "w": i["w"]}, p, d)),
    "RoPE": OpHarness(_rope_settings, _rope_model, _build_rope, _ref_rope),
    "NormRoPE": OpHarness(
        lambda size, q: [_norm_rope_setting(size, *c) for c in _NORM_ROPE[size]],
        lambda name, m, q: [_norm_rope_setting(name, t, *QKV_HEADS[name], QKV_HEADS[name][2], True)
                            for t in (1, PREFILL_TOKENS)],
        _build_norm_rope, _ref_norm_rope),
    "RowSelect": OpHarness(_select_settings, _select_model, _build_select,
                           lambda i, p, d: i["x"].double()[i["rows"].long()]),
    "Attention": OpHarness(_attn_settings, _attn_model, _build_attn, _ref_attn, _attn_reads, _attn_writes),
    "Sample": OpHarness(_sample_settings, _sample_model, _build_sample, _ref_sample),
    "Argmax": OpHarness(_argmax_settings, _argmax_model, _build_argmax,
                        lambda i, p, d: i["x"].double().argmax(-1).double()),
    "MoERoute": OpHarness(_route_settings, _route_model, _build_route, _ref_route),
    "MoEMatMul": OpHarness(_moe_mm_settings, _moe_mm_model, _build_moe_mm, _ref_moe_mm, _moe_mm_reads),
    "MoEMatMulGLU": OpHarness(_moe_glu_settings, _moe_glu_model, _build_moe_glu, _ref_moe_glu, _moe_glu_reads),
    "MoESum": OpHarness(_moe_sum_settings, _moe_sum_model, _build_floats, _ref_moe_sum),
}
