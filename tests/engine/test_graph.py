"""The graph IR, builder checks and fusion passes, on graphs built from hand-written Args."""

from __future__ import annotations

from dataclasses import replace

import pytest

from minfer.errors import ModelError
from minfer.graph.builder import GraphBuilder
from minfer.graph.fuse import optimize
from minfer.graph.ir import Op
from minfer.models.llama import LlamaArgs, build_graph

ARGS = LlamaArgs(arch="llama", n_layer=2, n_embd=64, n_ff=96, n_head=4, n_head_kv=2, head_dim=16, n_rot=16,
                 n_vocab=100, n_ctx_train=128, rms_eps=1e-5, rope_base=1e4, rope_freq_scale=1.0,
                 rope_freqs=False, tied_output=True)


def _topological(g) -> bool:
    return all(n.id == i and all(j < n.id for j in n.inputs) for i, n in enumerate(g.nodes))


@pytest.mark.parametrize("qwen2", [False, True])
def test_fusion_keeps_every_tensor_and_order(qwen2):
    args = replace(ARGS, qkv_bias=True, rope_style="neox") if qwen2 else ARGS
    plain = build_graph(args)
    g = optimize(plain)
    assert _topological(plain) and _topological(g)
    assert g.weights == plain.weights and set(g.inputs) == {"tokens", "positions", "out_rows"}
    read = [t.name for n in g.nodes for w in n.weights.values() for t in w.tensors]
    assert sorted(set(read)) == sorted(plain.weights)
    mms = [n for n in g.nodes if n.op == Op.MATMUL and n.layer == 0]
    assert [n.name for n in mms] == ["blk.0.attn_q+k+v", "blk.0.attn_output", "blk.0.ffn_gate+up",
                                     "blk.0.ffn_down"]
    qkv = mms[0]
    assert [t.name for t in qkv.weights["w"].parts] == [f"blk.0.attn_{x}.weight" for x in "qkv"]
    assert qkv.shape == ("T", 64 + 32 + 32)
    assert ("b" in qkv.weights) == qwen2
    ropes = [n for n in g.nodes if n.op == Op.ROPE]
    assert len(ropes) == 2 and all(r.params["n_heads"] == 6 for r in ropes)
    att = next(n for n in g.nodes if n.op == Op.ATTENTION)
    q, k, v, _ = (g.nodes[i] for i in att.inputs)
    assert [(x.op, x.params["start"], x.params["stop"]) for x in (q, k, v)] == [
        (Op.SLICE, 0, 64), (Op.SLICE, 64, 96), (Op.SLICE, 96, 128)]
    assert g.nodes[q.inputs[0]].op == Op.ROPE and g.nodes[v.inputs[0]] is qkv
    assert g.nodes[g.output].name == "output" and g.nodes[g.output].shape == ("R", 100)


def test_trace_nodes_use_ids_and_mark_symbolic_dims():
    g = optimize(build_graph(ARGS))
    nodes = g.trace_nodes({g.output: "k"})
    assert [n["id"] for n in nodes] == list(range(len(g.nodes)))
    out = nodes[g.output]
    assert out["shape"] == [-1, 100] and out["shape_symbolic"] == ["R", "100"] and out["kernel"] == "k"
    assert nodes[0]["op"] == "Input" and nodes[0]["dtype"] == "I32"


def test_builder_rejects_inconsistent_shapes():
    b = GraphBuilder()
    x = b.input("tokens", ("T",), "I32")
    e = b.embed(b.weight("token_embd.weight", (64, 100)), x, "e")
    with pytest.raises(ModelError, match="input width 64"):
        b.matmul(e, b.weight("w", (32, 8)), "bad")
    with pytest.raises(ModelError, match="used with shapes"):
        b.weight("token_embd.weight", (64, 101))
    with pytest.raises(ModelError, match="not a multiple"):
        b.attention(e, e, e, x, n_head=3, n_head_kv=2, head_dim=16, kv_layer=0, name="a")
