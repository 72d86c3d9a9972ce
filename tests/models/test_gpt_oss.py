"""gpt-oss (models/gpt_oss.py): its two new pieces of math against oracles written here, its graph,
its metadata and tensor checks, its chat template, and the backends that refuse it.

- the clamped SwiGLU (graph/ir.py SwiGLUOAI, ggml's swiglu_oai) and attention sinks (a per-head
  logit in the softmax's denominator) of the cpu reference against float64 definitions;
- hostile metadata and tensor shapes (sinks, router / expert biases) are typed errors at load;
(Logits against llama.cpp: tests/models/test_llamacpp_parity.py, tiny-gpt-oss and -mxfp4 on the cpu;
tests/backends/test_families_gpu.py, tiny-gpt-oss on cuda and vulkan.)
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from minfer.api import load
from minfer.backends.cpu import ops as cpu_ops
from minfer.errors import MetadataError, ModelError
from minfer.gguf.reader import GGUFReader, ValueType
from minfer.graph.ir import Op
from minfer.models import registry

U32 = ValueType.UINT32


def test_swiglu_oai_matches_its_definition():
    g = torch.linspace(-12, 12, 97).repeat(3, 1)
    u = torch.linspace(-10, 10, 97).flip(0).repeat(3, 1)
    got = cpu_ops.swiglu_oai(g, u, 1.702, 7.0).double()
    want = []
    for a, b in zip(g.flatten().tolist(), u.flatten().tolist(), strict=True):
        x = min(a, 7.0)
        y = min(max(b, -7.0), 7.0)
        want.append(x / (1 + math.exp(-1.702 * x)) * (y + 1))
    assert torch.allclose(got.flatten(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=1e-6)


def _sink_oracle(q, k, v, start, scale, window, sinks):
    """float64 attention with sinks, one query and head at a time: p_j = exp(s_j) / (sum exp(s) + exp(sink))."""
    n, n_head, hd = q.shape
    n_kv = k.shape[0]
    out = np.zeros((n, n_head, hd))
    for i in range(n):
        p = start + i
        for h in range(n_head):
            kv = h // (n_head // n_kv)
            keys = [j for j in range(p + 1) if not window or p - j < window]
            s = np.array([scale * q[i, h].double() @ k[kv, j].double() for j in keys])
            e = np.exp(np.append(s, sinks[h]) - max(s.max(), sinks[h]))
            w = e[:-1] / e.sum()
            out[i, h] = sum(w[t] * v[kv, j].double().numpy() for t, j in enumerate(keys))
    return out.reshape(n, n_head * hd)


@pytest.mark.parametrize("window", [0, 3])
def test_attention_sinks_match_their_definition(window):
    g = torch.Generator().manual_seed(0)
    n, n_head, n_kv, hd, start = 4, 4, 2, 8, 5
    q = torch.randn(n, n_head, hd, generator=g)
    k = torch.randn(n_kv, start + n, hd, generator=g)
    v = torch.randn(n_kv, start + n, hd, generator=g)
    sinks = torch.tensor([-1.0, 0.0, 2.0, 5.0])
    got = cpu_ops.attention(q, k, v, start, 0.35, window, 0.0, sinks)
    want = _sink_oracle(q, k, v, start, 0.35, window, sinks.double().numpy())
    assert np.allclose(got.double().numpy(), want, rtol=1e-5, atol=1e-6)
    plain = cpu_ops.attention(q, k, v, start, 0.35, window)  # sinks take weight from every value: a change
    assert (got - plain).abs().max() > 1e-2


def test_graph_has_sinks_biases_windows_and_the_clamped_swiglu(tiny_gguf):
    with GGUFReader(tiny_gguf("tiny-gpt-oss")) as r:
        args, graph = registry.build(r)
    ops = [n.op for n in graph.nodes]
    assert ops.count(Op.SWIGLU_OAI) == 2 and Op.SWIGLU not in ops
    att = [n for n in graph.nodes if n.op == Op.ATTENTION]
    assert [n.params.get("window", 0) for n in att] == [8, 0]  # layer 0 slides, layer 1 sees every key
    assert all(n.weights["sinks"].shape == (8,) for n in att)
    route = next(n for n in graph.nodes if n.op == Op.MOE_ROUTE)
    assert route.params == {"n_used": 3, "gating": "softmax_weight", "norm": False, "scale": 1.0}
    mm = [n for n in graph.nodes if n.op == Op.MOE_MATMUL and n.layer == 0]
    assert [n.weights["b"].name for n in mm] == ["blk.0.ffn_gate_exps.bias", "blk.0.ffn_up_exps.bias",
                                                 "blk.0.ffn_down_exps.bias"]
    logits = next(n for n in graph.nodes if n.name == "blk.0.ffn_moe_logits")
    assert logits.weights["b"].name == "blk.0.ffn_gate_inp.bias"
    assert args.rope.yarn is not None and args.head_dim * args.n_head == 512 != args.n_embd


CASES = [
    ({"gpt-oss.attention.sliding_window": (U32, 0)}, {}, MetadataError, "sliding_window.*found 0"),
    ({"gpt-oss.expert_feed_forward_length": (U32, 64)}, {}, MetadataError, "expert_feed_forward_length"),
    ({"gpt-oss.expert_count": (U32, 0)}, {}, MetadataError, "expert_count"),
    ({}, {"blk.0.attn_sinks.weight": (4, 2)}, MetadataError, "head_count.*attn_sinks.*\\[4, 2\\]"),
    ({}, {"blk.0.ffn_gate_inp.bias": (4, 2)}, MetadataError, "expert_count.*ffn_gate_inp.bias"),
    ({}, {"blk.0.ffn_up_exps.bias": (64, 16)}, MetadataError, "expert_count.*ffn_up_exps.bias"),
    ({}, {"blk.0.ffn_down_exps.bias": (128, 16)}, MetadataError, "expert_count.*ffn_down_exps.bias"),
    ({}, {"blk.1.attn_sinks.weight": (4, 2)}, ModelError, "blk.1.attn_sinks.weight"),
    ({}, {"blk.1.ffn_gate_exps.bias": (64, 16)}, ModelError, "blk.1.ffn_gate_exps.bias"),
]


@pytest.mark.parametrize("meta,shapes,error,match", CASES, ids=[next(iter(c[0] or c[1])) for c in CASES])
def test_bad_metadata_or_shapes_are_typed_errors(tiny_gguf, rewrite_gguf, tmp_path, meta, shapes, error, match):
    path = rewrite_gguf(tiny_gguf("tiny-gpt-oss"), tmp_path / "bad.gguf", meta=meta, shapes=shapes)
    with pytest.raises(error, match=match):
        load(path, progress=False)


def test_missing_window_or_sinks_is_named(tiny_gguf, rewrite_gguf, tmp_path):
    path = rewrite_gguf(tiny_gguf("tiny-gpt-oss"), tmp_path / "m.gguf", drop=("blk.1.attn_sinks.weight",))
    with pytest.raises(ModelError, match=r"'blk\.1\.attn_sinks\.weight' is missing"):
        load(path, progress=False)


def test_harmony_template_and_end_of_generation(tiny_gguf):
    m = load(tiny_gguf("tiny-gpt-oss"), progress=False)
    try:
        text = m.tokenizer.apply_chat_template(
            [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"},
             {"role": "assistant", "content": "yo"}, {"role": "user", "content": "2+2?"}],
            add_generation_prompt=True)
        assert text == ("<|start|>system<|message|>S<|end|><|start|>user<|message|>hi<|end|>"
                        "<|start|>assistant<|channel|>final<|message|>yo<|end|>"
                        "<|start|>user<|message|>2+2?<|end|><|start|>assistant")
        start, end, ret, call = m.tokenize("<|start|><|end|><|return|><|call|>", add_special=False,
                                           parse_special=True)  # one token each
        # harmony: <|end|> closes a message, the reply goes on; <|return|> and <|call|> end the generation
        tok = m.tokenizer
        assert not tok.is_eog(start) and not tok.is_eog(end) and tok.is_eog(ret) and tok.is_eog(call)
    finally:
        m.close()
