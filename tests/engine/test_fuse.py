"""graph/fuse.py's kernel fusions on a llama graph, with `supports` callbacks standing for a
backend's contracts: which nodes each rule fuses, what the fused node stands for, and that a
rule fires only where the backend says it can run the result."""

from __future__ import annotations

from dataclasses import replace

import pytest

from minfer.gguf.reader import GGUFReader
from minfer.gguf.synth import synth
from minfer.graph import fuse as F
from minfer.graph.ir import FUSED_OPS, Op
from minfer.models import registry
from minfer.models.llama import LlamaArgs, build_graph

ARGS = LlamaArgs(arch="llama", n_layer=3, n_embd=64, n_ff=96, n_head=4, n_head_kv=2, head_dim=16, n_rot=16,
                 n_vocab=100, n_ctx_train=128, rms_eps=1e-5, rope_base=1e4, rope_freq_scale=1.0,
                 rope_freqs=False, tied_output=True)


def everything(node, graph) -> bool:
    return True


def nothing(node, graph) -> bool:
    return False


def _check_well_formed(g) -> None:
    """Ids in order, inputs before readers, every fused node's parts a graph of their own whose
    exports exist, every Pick within its node's values."""
    for i, n in enumerate(g.nodes):
        assert n.id == i and all(j < n.id for j in n.inputs), n.name
        if n.op in FUSED_OPS:
            k = len(n.inputs)
            assert [p.id for p in n.parts] == list(range(k, k + len(n.parts)))
            assert all(all(j < p.id for j in p.inputs) for p in n.parts)
            assert n.exports and all(0 <= e < k + len(n.parts) for e in n.exports)
        if n.op == Op.PICK:
            src = g.nodes[n.inputs[0]]
            assert src.op in FUSED_OPS and 0 <= n.params["index"] < src.n_values


@pytest.mark.parametrize("qwen2", [False, True])
def test_every_rule_where_the_backend_runs_it(qwen2):
    args = replace(ARGS, qkv_bias=True, rope_style="neox") if qwen2 else ARGS
    base = F.optimize(build_graph(args))
    g = F.fuse(base, everything)
    _check_well_formed(g)
    ops = [n.op for n in g.nodes]
    # per layer: the q+k+v matmul with its RoPE, gate+up with its SwiGLU
    assert ops.count(Op.MATMUL_ROPE) == ops.count(Op.MATMUL_SWIGLU) == args.n_layer
    assert Op.ROPE not in ops and Op.SWIGLU not in ops
    # every residual add that feeds a norm (2 per layer but the last one, which feeds the output rows), with
    # the GEMV before it, the norm deferred to the GEMVs after it (they read h * w and divide by the rms)
    assert ops.count(Op.MATMUL_ADD_NORM) == 2 * args.n_layer - 1 and ops.count(Op.ADD) == 1
    assert Op.ADD_RMS_NORM not in ops
    an = next(n for n in g.nodes if n.op == Op.MATMUL_ADD_NORM)
    assert [p.op for p in an.parts] == [Op.MATMUL, Op.ADD_RMS_NORM, Op.PICK, Op.PICK]
    assert set(an.weights) == {"w", "w_n"}
    qkv = next(n for n in g.nodes if n.op == Op.MATMUL_ROPE)
    assert [p.op for p in qkv.parts] == [Op.MATMUL, Op.SLICE, Op.ROPE]
    assert ("b" in qkv.weights) == qwen2 and qkv.params["n_heads"] == args.n_head + args.n_head_kv
    # the attention reads k and v from it, and its KV write moved into it
    attn = [n for n in g.nodes if n.op == Op.ATTENTION]
    assert all(a.params["kv_written"] for a in attn)
    assert [n.params["kv_layer"] for n in g.nodes if n.op == Op.MATMUL_ROPE] == list(range(args.n_layer))
    # int8 x: the matmuls whose x a norm writes (the first layer's q+k+v, the output) or a SwiGLU (the last
    # layer's down, a plain MatMul); the others read a deferred norm, or are one (a deferred norm's GEMV reads f32 x)
    producers = {n.name for n in g.nodes if n.params.get("q8_out")}
    assert producers == {"blk.0.attn_norm", "output_norm", f"blk.{args.n_layer - 1}.ffn_gate+up+swiglu"}
    readers = [n for n in g.nodes if n.op in (Op.MATMUL_ROPE, Op.MATMUL_SWIGLU)]
    assert all(bool(n.params.get("x_q8")) != bool(n.params.get("x_rstd")) for n in readers)
    assert [n.name for n in readers if n.params.get("x_q8")] == ["blk.0.attn_q+k+v+rope"]


def test_no_rule_fires_where_the_backend_runs_none():
    base = F.optimize(build_graph(ARGS))
    assert F.fuse(base, nothing) is base


def test_a_rule_asks_about_the_node_it_would_make():
    """`supports` sees the fused node (its op, params and the graph its inputs refer to): a
    backend with only the fused add + norm gets only those."""
    seen = []

    def only_norms(node, graph):
        seen.append(node.op)
        return node.op == Op.ADD_RMS_NORM and all(i < len(graph.nodes) for i in node.inputs)

    g = F.fuse(F.optimize(build_graph(ARGS)), only_norms)
    _check_well_formed(g)
    assert {n.op for n in g.nodes} & FUSED_OPS == {Op.ADD_RMS_NORM}
    assert {Op.ADD_RMS_NORM, Op.MATMUL_SWIGLU, Op.MATMUL_ROPE} <= set(seen)
    assert not any(n.params.get("q8_out") or n.params.get("kv_written") for n in g.nodes)


def test_fused_nodes_keep_the_values_their_readers_need():
    """Picks stand for the fused members read outside: the sum of an add + norm (the residual),
    the rotated q/k and the v columns of q+k+v; names stay the original nodes'."""
    base = F.optimize(build_graph(ARGS))
    g = F.fuse(base, everything)
    names = {n.name for n in g.nodes}
    for i in range(ARGS.n_layer):
        assert f"blk.{i}.ffn_norm" in names and f"blk.{i}.attn_residual" in names
    picks = [n for n in g.nodes if n.op == Op.PICK]
    by_src = {}
    for p in picks:
        by_src.setdefault(g.nodes[p.inputs[0]].op, set()).add(p.params["index"])
    assert by_src == {Op.MATMUL_ADD_NORM: {0, 1}, Op.MATMUL_ROPE: {0, 1}}
    assert g.nodes[g.output].name == "output" and g.weights == base.weights


def test_gemma_graph_fuses_where_its_shapes_allow(tmp_path):
    """gemma3: gate+up with its GeGLU -> QMatMulGeGLU; the per-head q / k norms sit between the q+k+v
    matmul and its RoPEs (no QMatMulRoPE): norms and RoPEs -> one NormRoPE a layer; each post-norm
    with the residual add and the norm after it -> NormAddRMSNorm (the first layer's add reads the
    embedding's Scale). Without those two rules (a backend with no such kernels) the q / k norms stay
    grouped RMSNorms, the RoPEs apart, and the adds fuse into AddRMSNorms; both graphs well formed."""
    path = synth("tiny-gemma3", "f32", tmp_path / "g.gguf", header_only=True)
    with GGUFReader(path) as r:
        _, graph = registry.build(r)
    base = F.optimize(graph)
    n_layer = graph.meta["n_layer"]
    g = F.fuse(base, everything)
    _check_well_formed(g)
    ops = [n.op for n in g.nodes]
    assert ops.count(Op.MATMUL_GEGLU) == n_layer and Op.GEGLU not in ops
    assert Op.MATMUL_ROPE not in ops and Op.ROPE not in ops and ops.count(Op.NORM_ROPE) == n_layer
    assert not [n for n in g.nodes if n.op == Op.RMS_NORM and n.params.get("group")]
    # per layer 2 adds feed a norm (ffn_norm, the next attn_norm) but the last one's second
    assert ops.count(Op.NORM_ADD_RMS_NORM) == 2 * n_layer - 1 and Op.ADD_RMS_NORM not in ops
    assert g.nodes[next(n.id for n in g.nodes if n.op == Op.NORM_ADD_RMS_NORM)].name == "blk.0.ffn_norm"

    rules = tuple(r for r in F.FUSIONS if r not in (F.fuse_norm_rope, F.fuse_norm_add_rms_norm))
    g = F.fuse(base, everything, rules)
    _check_well_formed(g)
    ops = [n.op for n in g.nodes]
    assert Op.MATMUL_ROPE not in ops and ops.count(Op.ROPE) == 2 * n_layer
    grouped = [n for n in g.nodes if n.op == Op.RMS_NORM and n.params.get("group")]
    assert len(grouped) == 2 * n_layer  # attn_q_norm, attn_k_norm
    assert ops.count(Op.ADD_RMS_NORM) == 2 * n_layer - 1
    assert g.nodes[next(n.id for n in g.nodes if n.op == Op.ADD_RMS_NORM)].name == "blk.0.ffn_norm"


def test_phi3s_fused_weights_fuse_as_stacked_ones(tmp_path):
    """phi3's attn_qkv and ffn_up are one tensor each, split by column slices: the same rules fire
    (their q and k RoPEs merge into one over adjacent slices, then QMatMulRoPE; SwiGLU of the halves)."""
    path = synth("tiny-phi3", "f32", tmp_path / "p.gguf", header_only=True)
    with GGUFReader(path) as r:
        _, graph = registry.build(r)
    g = F.fuse(F.optimize(graph), everything)
    _check_well_formed(g)
    ops = [n.op for n in g.nodes]
    n_layer = graph.meta["n_layer"]
    assert ops.count(Op.MATMUL_ROPE) == ops.count(Op.MATMUL_SWIGLU) == n_layer
    assert Op.ROPE not in ops and Op.SWIGLU not in ops
    qkv = next(n for n in g.nodes if n.op == Op.MATMUL_ROPE)
    assert [t.name for t in qkv.weights["w"].tensors] == ["blk.0.attn_qkv.weight"]
    assert all(a.params.get("kv_written") for a in g.nodes if a.op == Op.ATTENTION)


def test_a_deferred_norm_fires_only_where_every_reader_divides():
    """fuse_matmul_add_norm: the attention output / FFN down GEMV + the residual add + the next norm
    -> QMatMulAddNorm, every matmul reading the normed value marked x_rstd. Not where the backend
    refuses a reader with x_rstd (its kernels read int8 x, or take no rstd): the AddRMSNorm stays,
    its readers unmarked; nor where the norm's value feeds anything but a matmul's x."""
    base = F.optimize(build_graph(ARGS))

    def no_rstd_for_swiglu(node, graph):
        return not (node.op == Op.MATMUL_SWIGLU and node.params.get("x_rstd"))

    g = F.fuse(base, no_rstd_for_swiglu)
    _check_well_formed(g)
    ops = [n.op for n in g.nodes]
    # the down -> next attn_norm ones fire (their reader: q+k+v), the attention output -> ffn_norm ones do not
    assert ops.count(Op.MATMUL_ADD_NORM) == ARGS.n_layer - 1 and ops.count(Op.ADD_RMS_NORM) == ARGS.n_layer
    assert all(n.name.endswith("attn_norm") for n in g.nodes if n.op == Op.MATMUL_ADD_NORM)
    assert not any(n.params.get("x_rstd") for n in g.nodes if n.op == Op.MATMUL_SWIGLU)
    assert sum(bool(n.params.get("x_rstd")) for n in g.nodes if n.op == Op.MATMUL_ROPE) == ARGS.n_layer - 1
    # a reader that is not a matmul (an extra node on the normed value): the rule leaves that norm alone
    rules = tuple(r for r in F.FUSIONS if r is not F.fuse_matmul_add_norm)
    pre = F.fuse(base, everything, rules)
    norm = next(n for n in pre.nodes if n.op == Op.ADD_RMS_NORM)
    pick = next(n for n in pre.nodes if n.op == Op.PICK and n.inputs == (norm.id,) and n.params["index"] == 1)
    extra = replace(pick, id=len(pre.nodes), name="extra", op=Op.SCALE, inputs=(pick.id,), params={"scale": 2.0})
    pre = replace(pre, nodes=(*pre.nodes, extra))
    after = F.fuse_matmul_add_norm(pre, everything)
    assert sum(n.op == Op.MATMUL_ADD_NORM for n in after.nodes) == 2 * ARGS.n_layer - 2
    assert any(n.op == Op.ADD_RMS_NORM and n.name == norm.name for n in after.nodes)
