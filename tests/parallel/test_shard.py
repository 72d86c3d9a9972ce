"""Tensor parallelism without processes: the split of a model (models/llama.py partition,
tensor_slices), the per-rank file view (gguf/shard.py) against the whole tensors, each rank's
graph, and the typed errors for splits that cannot be made."""

from __future__ import annotations

import math

import pytest
import torch

from minfer.backends.cpu.weights import dense_f32
from minfer.errors import ParallelError
from minfer.gguf.reader import GGUFReader
from minfer.gguf.shard import BY_ROWS, IN_ROW, ShardedReader, TensorSlice
from minfer.gguf.synth import synth
from minfer.graph.ir import Op
from minfer.models import llama
from minfer.models import registry as models


@pytest.mark.parametrize("quant", ["q4_0", "q4_k", "q8_0", "f16"])
def test_views_hold_exactly_the_slices_of_the_whole_tensors(tiny_gguf, quant):
    with GGUFReader(tiny_gguf("tiny-qwen2", quant)) as r:
        names = {"token_embd.weight": TensorSlice(BY_ROWS, 100, 356),
                 "blk.0.attn_q.weight": TensorSlice(BY_ROWS, 64, 192),
                 "blk.0.attn_q.bias": TensorSlice(IN_ROW, 64, 192),
                 "blk.1.ffn_down.weight": TensorSlice(IN_ROW, 256, 512)}
        view = ShardedReader(r, names)
        for name, s in names.items():
            whole, part = dense_f32(r, r.tensors[name]), dense_f32(view, view.tensors[name])
            want = whole[s.start:s.stop] if whole.dim() == 1 else (
                whole[s.start:s.stop] if s.axis == BY_ROWS else whole[:, s.start:s.stop])
            assert torch.equal(part, want), name
            assert view.tensors[name].nbytes == view.tensor_bytes(name).nbytes
        # a row slice is the file's own memory (no copy); a K-split holds only its bytes
        assert not view.tensor_bytes("token_embd.weight").flags.owndata
        down, whole = view.tensor_bytes("blk.1.ffn_down.weight"), r.tensor_bytes("blk.1.ffn_down.weight")
        assert down.nbytes * 2 == whole.nbytes
        assert view.tensors["blk.0.attn_k.weight"] == r.tensors["blk.0.attn_k.weight"]  # not split: the file's


def test_a_k_split_that_cuts_a_quant_block_is_refused(tiny_gguf):
    with GGUFReader(tiny_gguf("tiny-llama", "q4_k")) as r:
        with pytest.raises(ParallelError, match="cut a quant block"):
            ShardedReader(r, {"blk.0.attn_output.weight": TensorSlice(IN_ROW, 0, 128)})
        with pytest.raises(ParallelError, match="outside"):
            ShardedReader(r, {"token_embd.weight": TensorSlice(BY_ROWS, 0, 10_000)})
        # 2 ranks x 2 heads x 64 = 128 columns of attn_output: half a Q4_K super-block
        with pytest.raises(ParallelError, match="attn_output.weight.*cut a quant block"):
            models.check_split(r, 2)


def _args(**kw) -> llama.LlamaArgs:
    base = dict(arch="llama", n_layer=2, n_embd=256, n_ff=512, n_head=8, n_head_kv=2, head_dim=32, n_rot=32,
                n_vocab=1001, n_ctx_train=512, rms_eps=1e-5, rope_base=1e4, rope_freq_scale=1.0, rope_freqs=False,
                tied_output=True)
    return llama.LlamaArgs(**{**base, **kw})


def test_partition_splits_heads_and_replicates_kv_heads_when_fewer_than_ranks():
    a = _args()
    parts = [llama.partition(a, r, 4) for r in range(4)]
    assert [p.heads for p in parts] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    # 2 KV heads over 4 ranks: each is held by two ranks, the ones whose query heads use it
    assert [p.kv_heads for p in parts] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    group = a.n_head // a.n_head_kv
    for p in parts:
        assert all(p.kv_heads[0] <= h // group < p.kv_heads[1] for h in range(*p.heads))
    assert [p.ff for p in parts] == [(0, 128), (128, 256), (256, 384), (384, 512)]
    # an uneven vocabulary: every row on exactly one rank
    assert [p.vocab for p in parts] == [(0, 251), (251, 502), (502, 753), (753, 1001)]
    assert parts[0].vocab_widths == (251, 251, 251, 248)
    assert [p.kv_heads for p in (llama.partition(a, r, 2) for r in range(2))] == [(0, 1), (1, 2)]


@pytest.mark.parametrize("kw, world, match", [
    ({}, 3, "does not divide the model's 8 attention heads"),
    ({"n_head_kv": 4, "n_head": 24}, 6, "KV heads: one must divide the other"),
    ({"n_ff": 500}, 8, "FFN width 500"),
    ({"n_vocab": 3}, 4, "vocabulary of 3"),
])
def test_splits_that_cannot_be_made_are_typed_errors(kw, world, match):
    with pytest.raises(ParallelError, match=match):
        llama.partition(_args(**kw), 0, world)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])
def test_each_rank_graph_has_its_shapes_and_one_all_reduce_per_row_parallel_matmul(tiny_gguf, preset):
    with GGUFReader(tiny_gguf(preset, "f16")) as r:
        args, whole = models.build(r)
        for rank in range(2):
            a, g, view = models.build_shard(r, rank, 2)  # check_tensors: every weight has its rank's shape
            assert a == args
            ops = [n.op for n in g.nodes]
            assert ops.count(Op.ALL_REDUCE) == 2 * args.n_layer + 1 and ops.count(Op.ALL_GATHER) == 1
            assert g.nodes[g.output].op == Op.ALL_GATHER and g.nodes[g.output].shape[-1] == args.n_vocab
            attn = [n for n in g.nodes if n.op == Op.ATTENTION]
            assert {(n.params["n_head"], n.params["n_head_kv"]) for n in attn} == {(2, 1)}
            assert g.meta["n_head_kv"] == 1 and g.meta["n_vocab"] == args.n_vocab
            split = sum(view.tensors[n].nbytes for n in view.slices)
            assert split * 2 == sum(r.tensors[n].nbytes for n in view.slices)
        assert not any(n.op == Op.ALL_REDUCE for n in whole.nodes)


def test_a_rank_of_the_70b_shape_plans_on_cuda_from_the_header(tmp_path, monkeypatch):
    """`minfer synth llama3-70b q4_k` (2 of its 80 layers: the whole file is more than a CI
    machine maps) split 2 ways: every node of rank 1's graph has a cuda kernel (K-split Q4_K
    rows, half the heads, a Q6_K vocabulary half), no GPU needed."""
    from dataclasses import replace

    from minfer.backends.cuda.backend import CUDABackend
    from minfer.config import EngineConfig
    from minfer.gguf.synth import PRESETS
    from minfer.graph.fuse import optimize

    monkeypatch.setitem(PRESETS, "llama3-70b-2", replace(PRESETS["llama3-70b"], name="llama3-70b-2", n_layers=2))
    path = synth("llama3-70b-2", "q4_k", tmp_path / "70b.gguf", header_only=True)
    with GGUFReader(path) as r:
        _, graph, view = models.build_shard(r, 1, 2)
        be = CUDABackend(EngineConfig(device="cuda"), plan_only=True, comm=object())
        be.load(optimize(graph), view, progress=False)
        plan = be.plan_rows(1)
        assert plan and all(math.isfinite(x["cost_ns"]) for x in plan)
        per_rank = sum(view.tensors[n].nbytes for n in view.tensors)
        assert abs(per_rank / sum(i.nbytes for i in r.tensors.values()) - 0.5) < 0.01
        attn = next(n for n in graph.nodes if n.op == Op.ATTENTION)
        assert (attn.params["n_head"], attn.params["n_head_kv"]) == (32, 4)


def test_more_ranks_than_gpus_is_a_typed_error(monkeypatch):
    from minfer.config import EngineConfig
    from minfer.parallel import comm
    from minfer.parallel.launch import check_devices

    monkeypatch.setattr(comm, "_interpreting", lambda: False)  # (the test session may set TRITON_INTERPRET)
    n = torch.cuda.device_count()
    with pytest.raises(ParallelError, match=f"--tp {n + 1} needs {n + 1} GPUs .* this host shows {n}"):
        check_devices(EngineConfig(device="cuda"), n + 1)
    check_devices(EngineConfig(device="cpu"), 4)  # cpu ranks share the cores
