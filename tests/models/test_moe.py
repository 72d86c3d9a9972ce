"""Mixtures of experts (models/moe.py, graph/ir.py's MoERoute / MoEMatMul / MoESum):

- hostile expert metadata and router / expert tensor shapes are typed errors at load, naming the
  key or the tensor, before anything is built;
- the cpu reference of MoERoute against an oracle written here in float64 (every gating function,
  the selection bias, normalisation and scale, ties);
- the cpu expert kernels (the VNNI form, torch's int4 form, float weights) on the chosen experts
  against the exact weights, the rows grouped by expert in any order;
- the graph: a qwen3moe / mixtral file builds the MoE ops, a dense llama file none, and tensor
  parallelism refuses a mixture of experts up front.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from minfer.api import load
from minfer.backends.cpu import ops as cpu_ops
from minfer.backends.cpu.weights import Experts
from minfer.errors import MetadataError, ModelError, ParallelError, UnsupportedError
from minfer.gguf.reader import GGUFReader, ValueType
from minfer.gguf.synth import random_blocks
from minfer.gguf.writer import TensorSpec, write_gguf
from minfer.graph.ir import Op
from minfer.kernels.cpu import vnni as cpu_vnni
from minfer.models import registry
from minfer.quant.reference import quantize
from minfer.quant.types import GGMLType, quant_info

F32, I32, U32, BOOL, ARR = ValueType.FLOAT32, ValueType.INT32, ValueType.UINT32, ValueType.BOOL, ValueType.ARRAY

# tiny-qwen3moe: 8 experts of 128, 3 used, n_embd 256; tiny-mixtral (arch llama): 4 experts of 256, 2 used
CASES = [
    ("tiny-qwen3moe", {"qwen3moe.expert_count": 0}, {}, MetadataError, "expert_count.*expected 1..1024, found none"),
    ("tiny-qwen3moe", {"qwen3moe.expert_count": 4}, {}, MetadataError, "expert_count.*ffn_gate_inp.*\\[256, 8\\]"),
    ("tiny-qwen3moe", {"qwen3moe.expert_count": 5000}, {}, MetadataError, "expert_count.*1..1024"),
    ("tiny-qwen3moe", {"qwen3moe.expert_used_count": 9}, {}, MetadataError, "expert_used_count.*1..8"),
    ("tiny-qwen3moe", {"qwen3moe.expert_used_count": 0}, {}, MetadataError, "expert_used_count"),
    ("tiny-qwen3moe", {"qwen3moe.expert_used_count": (ARR, (I32, [3, 3]))}, {}, MetadataError,
     "expert_used_count.*integer"),
    ("tiny-qwen3moe", {"qwen3moe.expert_feed_forward_length": 64}, {}, MetadataError,
     "expert_feed_forward_length.*ffn_gate_exps"),
    ("tiny-qwen3moe", {"qwen3moe.expert_feed_forward_length": 1 << 20}, {}, MetadataError,
     "expert_feed_forward_length.*1..131072"),
    ("tiny-qwen3moe", {"qwen3moe.expert_gating_func": (U32, 7)}, {}, MetadataError, "expert_gating_func"),
    ("tiny-qwen3moe", {"qwen3moe.expert_weights_scale": (F32, float("nan"))}, {}, MetadataError,
     "expert_weights_scale"),
    ("tiny-qwen3moe", {"qwen3moe.expert_weights_scale": (F32, -2.0)}, {}, MetadataError, "expert_weights_scale"),
    ("tiny-qwen3moe", {"qwen3moe.expert_weights_norm": (I32, 1)}, {}, MetadataError, "expert_weights_norm.*bool"),
    # a router or expert tensor whose shape disagrees with the metadata (same byte count, other shape)
    ("tiny-qwen3moe", {}, {"blk.0.ffn_gate_inp.weight": (512, 4)}, MetadataError,
     "expert_count.*ffn_gate_inp.weight has shape \\[512, 4\\]"),
    ("tiny-qwen3moe", {}, {"blk.0.ffn_up_exps.weight": (256, 256, 4)}, MetadataError,
     "expert_count.*ffn_up_exps.weight of shape \\[256, 128, 8\\], found \\[256, 256, 4\\]"),
    ("tiny-qwen3moe", {}, {"blk.0.ffn_down_exps.weight": (256, 128, 8)}, MetadataError,
     "expert_feed_forward_length.*ffn_down_exps"),
    ("tiny-qwen3moe", {}, {"blk.1.ffn_gate_exps.weight": (128, 256, 8)}, ModelError,
     "blk.1.ffn_gate_exps.weight.*\\[128, 256, 8\\].*expect \\[256, 128, 8\\]"),
    ("tiny-qwen3moe", {}, {"blk.1.ffn_gate_inp.weight": (128, 16)}, ModelError, "blk.1.ffn_gate_inp.weight"),
    ("tiny-mixtral", {"llama.expert_used_count": 5}, {}, MetadataError, "llama.expert_used_count.*1..4"),
    ("tiny-mixtral", {"llama.feed_forward_length": 128}, {}, MetadataError, "ffn_gate_exps"),
    ("tiny-mixtral", {}, {"blk.0.ffn_down_exps.weight": (256, 512, 2)}, MetadataError, "expert_count"),
]


@pytest.mark.parametrize("preset,meta,shapes,error,match", CASES,
                         ids=[f"{c[0]}:{next(iter(c[1] or c[2]))}" for c in CASES])
def test_bad_expert_metadata_or_shapes_are_typed_errors(tiny_gguf, rewrite_gguf, tmp_path, preset, meta, shapes,
                                                         error, match):
    path = rewrite_gguf(tiny_gguf(preset), tmp_path / "bad.gguf", meta=meta, shapes=shapes)
    with pytest.raises(error, match=match):
        load(path, progress=False)


def test_missing_expert_tensor_is_named(tiny_gguf, rewrite_gguf, tmp_path):
    path = rewrite_gguf(tiny_gguf("tiny-mixtral"), tmp_path / "m.gguf", drop=("blk.1.ffn_up_exps.weight",))
    with pytest.raises(ModelError, match=r"'blk\.1\.ffn_up_exps\.weight' is missing.*blk\.N\.ffn_gate_inp"):
        load(path, progress=False)


def test_graphs_route_through_the_moe_ops(tiny_gguf):
    ops = {}
    for preset in ("tiny-qwen3moe", "tiny-mixtral", "tiny-llama"):
        with GGUFReader(tiny_gguf(preset)) as r:
            args, graph = registry.build(r)
        ops[preset] = [n.op for n in graph.nodes]
    for preset in ("tiny-qwen3moe", "tiny-mixtral"):  # 2 layers: a route, 3 expert matmuls and a sum each
        assert ops[preset].count(Op.MOE_ROUTE) == 2 and ops[preset].count(Op.MOE_MATMUL) == 6
        assert ops[preset].count(Op.MOE_SUM) == 2 and Op.SWIGLU in ops[preset]
    assert not {Op.MOE_ROUTE, Op.MOE_MATMUL, Op.MOE_SUM} & set(ops["tiny-llama"])
    with GGUFReader(tiny_gguf("tiny-qwen3moe")) as r:
        args, graph = registry.build(r)
        route = next(n for n in graph.nodes if n.op == Op.MOE_ROUTE)
        assert route.params == {"n_used": 3, "gating": "softmax", "norm": True, "scale": 1.0}
        assert args.moe.n_ff == 128 and args.moe.n_expert == 8
    with GGUFReader(tiny_gguf("tiny-mixtral")) as r:
        with pytest.raises(ParallelError, match="mixture-of-experts"):
            registry.check_split(r, 2)
    from minfer.inspect import inspect_file

    assert "experts        8 (3 used a token, 128 wide)" in inspect_file(tiny_gguf("tiny-qwen3moe"))
    assert "experts" not in inspect_file(tiny_gguf("tiny-llama"))


@pytest.mark.parametrize("preset,kv_type", [("qwen3-30b-a3b", GGMLType.Q4_K), ("mixtral-8x7b", GGMLType.Q8_0)])
def test_real_shape_presets_build_their_graphs(preset, kv_type, tmp_path, monkeypatch):
    """The MoE presets' shapes and llama.cpp's Q4_K_M mix (an 8-expert model's attn_k / attn_v Q8_0,
    its ffn_down_exps Q6_K in the more-bits layers), on 2 of their layers (the whole header-only file
    is 17-26 GB, more than an 8 GB machine maps)."""
    from dataclasses import replace

    from minfer.gguf import synth as synth_mod

    real = synth_mod.PRESETS[preset]
    monkeypatch.setitem(synth_mod.PRESETS, preset, replace(real, n_layers=2))
    path = synth_mod.synth(preset, "q4_k_m", tmp_path / "m.gguf", header_only=True)
    with GGUFReader(path) as r:
        args, graph = registry.build(r)
        assert r.tensors["blk.0.attn_k.weight"].ggml_type == kv_type
        assert r.tensors["blk.1.ffn_down_exps.weight"].ggml_type == GGMLType.Q6_K  # the last eighth
        assert r.tensors["blk.0.ffn_up_exps.weight"].ggml_type == GGMLType.Q4_K
        assert r.tensors["blk.0.ffn_gate_inp.weight"].ggml_type == GGMLType.F32
    assert (args.moe.n_expert, args.moe.n_used, args.moe.n_ff) == (real.n_expert, real.n_expert_used, real.expert_ff)
    from minfer.config import EngineConfig
    from minfer.engine import loader

    with GGUFReader(path) as r:  # the cuda kernels of every node (a plan: no GPU needed)
        be = loader.load(r, EngineConfig(device="cuda"), progress=False, plan_only=True).backend
        row = {r["name"]: r["kernel"] for r in be.plan_rows(1)}
        chunk = {r["name"]: r["kernel"] for r in be.plan_rows(512, prefill=True)}
    assert row["blk.1.ffn_moe_route"] == "moe_route_rows" and row["blk.1.ffn_moe_out"] == "moe_sum_rows"
    assert row["blk.1.ffn_moe_down"] == "moe_gemv" and chunk["blk.1.ffn_moe_down"] == "moe_mm16"


# ------------------------------------------------------------------------------ MoERoute's reference
def route_oracle(logits: np.ndarray, k: int, gating: str, norm: bool, scale: float, bias=None):
    """float64, one row at a time, the definition of graph/ir.py's MoERoute written out."""
    ws, ids = [], []
    for row in logits.astype(np.float64):
        if gating == "softmax":
            probs = np.exp(row - row.max())
            probs /= probs.sum()
        elif gating == "sigmoid":
            probs = 1 / (1 + np.exp(-row))
        else:
            probs = row.copy()
        sel = probs + (0 if bias is None else bias)
        chosen = sorted(range(len(row)), key=lambda e: (-sel[e], e))[:k]
        w = probs[chosen]
        if gating == "softmax_weight":
            w = np.exp(w - w.max()) / np.exp(w - w.max()).sum()
        if norm:
            w = w / max(w.sum(), 6.103515625e-5)
        ws.append(w * scale)
        ids.append(chosen)
    return np.array(ws), np.array(ids)


@pytest.mark.parametrize("gating", ["softmax", "sigmoid", "softmax_weight"])
@pytest.mark.parametrize("norm,scale,biased", [(True, 1.0, False), (False, 2.5, False), (True, 0.5, True)])
def test_route_reference_matches_the_oracle(gating, norm, scale, biased):
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(9, 16, generator=g) * 3
    logits[3, 5] = logits[3, 9] = logits[3].max() + 1  # a tie: the lower expert first
    bias = torch.randn(16, generator=g) * 0.3 if biased else None
    w, ids = cpu_ops.moe_route(logits, 4, gating, norm, scale, bias)
    want_w, want_ids = route_oracle(logits.numpy(), 4, gating, norm, scale, None if bias is None else bias.numpy())
    assert ids.dtype == torch.int32 and ids.tolist() == want_ids.tolist()
    if not biased and gating != "sigmoid":
        assert ids[3, :2].tolist() == [5, 9]
    assert np.allclose(w.numpy(), want_w, rtol=2e-6, atol=1e-7)


def test_moe_sum_adds_in_slot_order():
    y = torch.tensor([[[1e8, 1.0], [1.0, 2.0], [-1e8, 3.0]]])
    w = torch.ones(1, 3)
    assert cpu_ops.moe_sum(y, w).tolist() == [[0.0, 6.0]]  # (1e8 + 1) - 1e8 in float32 is 0, not 1


# ------------------------------------------------------------------------------ the cpu expert kernels
def _expert_file(tmp_path, qtype: GGMLType, e: int, n: int, k: int):
    g = np.random.default_rng(3)
    x = (g.standard_normal((e * n, k)) * 0.05).astype(np.float32)
    if qtype == GGMLType.F32:
        data = x.reshape(-1)
    elif qtype in (GGMLType.Q4_0, GGMLType.Q8_0):
        data = quantize(x, qtype).numpy()
    else:  # K-quants: random blocks with sane scales (quant.reference encodes the simple types only)
        data = random_blocks(g, qtype, e * n * k // quant_info(qtype).block_elems)
    path = write_gguf(tmp_path / f"experts-{qtype.name}.gguf", {"general.architecture": "test"},
                      [TensorSpec("blk.0.ffn_up_exps.weight", (k, n, e), qtype, lambda: data)])
    return GGUFReader(path)


KERNELS = [(GGMLType.Q4_0, True), (GGMLType.Q8_0, True), (GGMLType.Q4_K, True), (GGMLType.Q4_0, False),
           (GGMLType.Q6_K, False), (GGMLType.F32, False)]


@pytest.mark.parametrize("qtype,vnni", KERNELS, ids=[f"{t.name}-{'vnni' if v else 'int4'}" for t, v in KERNELS])
def test_experts_run_the_chosen_experts(tmp_path, qtype, vnni):
    if vnni and not cpu_vnni.available():
        pytest.skip("no AVX512-VNNI here: the int4 cases cover this machine")
    e, n, k = 5, 80, 256  # n not a multiple of the VNNI tile: each expert padded on its own
    with _expert_file(tmp_path, qtype, e, n, k) as r:
        ex = Experts(r, r.tensors["blk.0.ffn_up_exps.weight"], vnni=vnni)
        assert (ex.kernel == "cpu_vnni2_moe") if vnni else ex.kernel.startswith(("cpu_int4pack", "cpu_linear"))
        dense = ex.dense.double()
        g = torch.Generator().manual_seed(11)
        ids = torch.randint(0, e, (6, 3), generator=g, dtype=torch.int32)
        ids[0] = torch.tensor([4, 0, 2])
        for x in (torch.randn(6, k, generator=g), torch.randn(6, 3, k, generator=g)):  # shared x, and per slot
            for decode in (True, False):
                y = ex(x, ids, decode)
                xs = x.double() if x.dim() == 3 else x.double().unsqueeze(1).expand(6, 3, k)
                ref = torch.einsum("tjk,tjnk->tjn", xs, dense[ids.long()])
                err = ((y.double() - ref).norm() / ref.norm()).item()
                assert y.shape == (6, 3, n) and err < (1e-6 if qtype == GGMLType.F32 else 1e-2), err
                if vnni:  # one C call for every expert: the numbers of one call per expert, bit for bit
                    assert torch.equal(y, ex.per_expert(x, ids, decode))
        assert ex.nbytes > 0
        with pytest.raises(UnsupportedError, match="ids must be in 0..4"):
            ex(torch.randn(1, k), torch.tensor([[5]], dtype=torch.int32))


def test_expert_row_does_not_depend_on_the_others(tmp_path):
    """A row's result is the same alone and grouped with other rows of its expert (batch invariance)."""
    with _expert_file(tmp_path, GGMLType.Q4_K, 4, 64, 256) as r:
        ex = Experts(r, r.tensors["blk.0.ffn_up_exps.weight"], vnni=cpu_vnni.available())
        g = torch.Generator().manual_seed(5)
        x = torch.randn(8, 256, generator=g)
        ids = torch.tensor([[1, 2]] * 8, dtype=torch.int32)
        together = ex(x, ids)
        alone = torch.cat([ex(x[i:i + 1], ids[i:i + 1]) for i in range(8)])
        assert torch.equal(together, alone)


def test_moe_prepared_bytes_count_every_expert(tiny_gguf):
    from minfer.backends.cpu.weights import prepared_bytes

    with GGUFReader(tiny_gguf("tiny-qwen3moe", "q4_0")) as r:
        info = r.tensors["blk.0.ffn_gate_exps.weight"]
        ex = Experts(r, info, vnni=cpu_vnni.available())
        assert prepared_bytes(info, vnni=cpu_vnni.available()) == ex.nbytes
        assert ex.nbytes >= math.prod(info.shape) // 2
