"""The cuda backend against the cpu reference, end to end, on tiny synthetic models of every quant
mix: logits of prompts and of decode steps, greedy tokens, batched decode, CUDA-graph buckets.

In CI the backend runs under the Triton interpreter (CPU tensors, no graphs); with
MINFER_TEST_DEVICE=cuda the same tests run the compiled kernels on the GPU, graphs included.
"""

from __future__ import annotations

import pytest
import torch

from minfer.api import load
from minfer.backends.base import Batch
from minfer.errors import NoKernelError

PROMPT = [3, 17, 42, 99, 5, 250, 7, 311, 64, 128, 2, 77]
TOL = 1.2e-2  # bf16 matmul operands / f16 KV cache vs the cpu's exact float32 path (contracts: 1e-2, 5e-3)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float().cpu() - b.float().cpu()).norm() / b.float().norm())


@pytest.fixture(scope="module", autouse=True)
def wide_interpreter_tiles():
    """Under the Triton interpreter a GEMV's cost is mostly per-program overhead, and the tiny models'
    weights take the small-weight tile (8 rows a program: ~600 programs a decode step). Here they
    take 64-row tiles (r 8, 8 lanes along rows: the same kernel, code paths and K order per row;
    tests/kernels/triton/test_qmatmul.py checks the tiles themselves): ~8x fewer programs, the suite's
    slowest tests several times faster. Compiled runs (MINFER_TEST_DEVICE=cuda) keep the defaults."""
    from minfer.kernels.triton import gemv

    if not gemv.INTERPRETING:
        yield
        return
    small = gemv._gemv_config

    def wide(n: int, k: int, affine: bool = False) -> gemv.GemvConfig:
        cfg = small(n, k, affine)
        return gemv.GemvConfig(r=8, lr=8, wk=cfg.wk) if n * k <= gemv.SMALL_WEIGHTS else cfg

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gemv, "_gemv_config", wide)
        gemv.gemv_config.cache_clear()
        yield
    gemv.gemv_config.cache_clear()


@pytest.fixture(scope="module")
def pair(tiny_gguf, request):
    made = {}

    def get(preset: str, quant: str):
        if (preset, quant) not in made:
            path = tiny_gguf(preset, quant)
            made[preset, quant] = (load(path, "cpu", n_ctx=64, n_slots=4, progress=False),
                                   load(path, "cuda", n_ctx=64, n_slots=4, progress=False))
        return made[preset, quant]

    return get


# every quant mix on the llama preset; qwen2 (biases, NEOX RoPE, untied output) with a float and a K-quant
# mix (each GEMV kernel runs in the Triton interpreter here: a few seconds per decode step)
CASES = [("tiny-llama", q) for q in ("f32", "f16", "q8_0", "q4_0", "q4_1", "q4_k")] + [
    ("tiny-qwen2", "f16"), ("tiny-qwen2", "q4_k")]


@pytest.mark.parametrize("preset, quant", CASES)
def test_prompt_and_decode_logits_match_cpu(pair, raw, preset, quant):
    cpu, gpu = pair(preset, quant)
    want = raw.prefill(cpu.engine, 0, PROMPT)
    got = raw.prefill(gpu.engine, 0, PROMPT)
    assert got.shape == want.shape and _rel(got, want) < TOL
    # decode steps (the graph-replayed path on a GPU) after a 9-token prompt
    raw.prefill(cpu.engine, 1, PROMPT[:9])
    raw.prefill(gpu.engine, 1, PROMPT[:9])
    steps_c = torch.stack([raw.decode(cpu.engine, 1, t, p) for p, t in enumerate(PROMPT[9:], start=9)])
    steps_g = torch.stack([raw.decode(gpu.engine, 1, t, p).cpu() for p, t in enumerate(PROMPT[9:], start=9)])
    assert _rel(steps_g, steps_c) < TOL
    assert _rel(steps_g, want[9:]) < TOL


@pytest.mark.parametrize("quant", ["q4_0", "q8_0"])
def test_greedy_generation_matches_cpu_where_decisive(pair, quant):
    cpu, gpu = pair("tiny-llama", quant)
    prompts = ["hello there", "the cat", "one two three four"]
    a = cpu.generate_batch(prompts, max_tokens=8, temperature=0)
    b = gpu.generate_batch(prompts, max_tokens=8, temperature=0)
    for ra, rb, p in zip(a, b, prompts, strict=True):
        ids = cpu.prompt_ids(p) + ra.token_ids
        logits = cpu.logits(ids)[len(ids) - len(ra.token_ids) - 1:-1]
        top2 = logits.topk(2, dim=-1).values
        firm = next((j for j, m in enumerate((top2[:, 0] - top2[:, 1]).tolist()) if m < 0.5), len(ra.token_ids))
        assert rb.token_ids[:firm] == ra.token_ids[:firm]


def test_mixed_type_fused_weights_run_a_gemv_per_type(pair, raw):
    """A Q4_K_M-like file (synth q4_k_m): layer 1 fuses Q4_K q, k with a Q6_K v. A decode row runs
    one GEMV per run of one type, each writing its columns of the fused output (never the f16
    copy: its f16 rounding alone would cost ~1e-3), and matches the cpu's exact float32 path."""
    cpu, gpu = pair("tiny-llama", "q4_k_m")
    kernels = {r["name"]: r["kernel"] for r in gpu.engine.backend.plan_rows(1)}
    assert kernels["blk.1.attn_q+k+v"] == "int4_gemv+q6_k_gemv"  # (no fused GEMV takes parts of two types)
    assert kernels["blk.0.attn_q+k+v+rope"] == "gemv_rope" and kernels["blk.1.ffn_down"] == "q6_k_gemv"
    assert "linear_f16" not in set(kernels.values())
    # the compiled step of the mixed node alone, for one row, against float64 math on the parts
    from minfer.backends.cuda.graphs import State
    from minfer.quant.reference import dequantize

    be, reader = gpu.engine.backend, gpu.reader
    node = next(n for n in be.graph.nodes if n.name.startswith("blk.1.attn_q+k+v"))
    k = node.weights["w"].shape[0]
    w = torch.cat([dequantize(reader.tensor_bytes(t.name), reader.tensors[t.name].ggml_type,
                              (t.shape[1], k)).double() for t in node.weights["w"].tensors])
    mm = next((p for p in node.parts if str(p.op) == "MatMul"), node)  # a QMatMulRoPE runs its matmul part
    row = be.compiler.ways()[0]
    step = be.compiler.bind_part(node, mm, row) if node.parts else be.compiler.bound[node.id]["row"]
    x = torch.randn(1, k).to(be.device)
    vals = [x] if node.parts else {node.inputs[0]: x}
    y = step.fn(vals, State({}, True, 1))
    # f32 GEMVs (two-pass int8 activations on the Q4_K part: ~2e-5), not the f16 copy (~1e-3)
    passes = be.config.gemv_q8
    assert passes in (0, 2)
    assert _rel(y, x.double().cpu() @ w.T) < (1e-5 if passes == 0 else 1e-4)
    raw.prefill(cpu.engine, 1, PROMPT[:9])
    raw.prefill(gpu.engine, 1, PROMPT[:9])
    steps_c = torch.stack([raw.decode(cpu.engine, 1, t, p) for p, t in enumerate(PROMPT[9:11], start=9)])
    steps_g = torch.stack([raw.decode(gpu.engine, 1, t, p).cpu() for p, t in enumerate(PROMPT[9:11], start=9)])
    assert _rel(steps_g, steps_c) < TOL


def test_batched_decode_rows_match_each_alone(pair):
    """Decode rows of several sequences in one step (a graph bucket on a GPU) against each alone."""
    _, gpu = pair("tiny-qwen2", "q4_0")
    be = gpu.engine.backend
    seqs = [(0, PROMPT[:5]), (1, PROMPT[2:9]), (2, PROMPT[1:4])]
    for slot, toks in seqs:
        be.forward(Batch.single(toks, 0, slot=slot))
    together = be.forward(Batch.build([(s, len(t), [11 + s]) for s, t in seqs], [0, 1, 2], n_decode=3)).cpu()
    for i, (s, t) in enumerate(seqs):
        alone = be.forward(Batch.build([(s, len(t), [11 + s])], [0], n_decode=1)).cpu()[0]
        assert _rel(together[i], alone) < TOL  # batch rows may take another matmul kernel than one row


@pytest.mark.parametrize("preset, quant, kernel", [("tiny-llama", "q4_0", "q4_0_matmul"),
                                                   ("tiny-qwen2", "q4_k", "mmq_int4")])
def test_mmq_prompts_and_decode_batches_match_cpu(tiny_gguf, raw, preset, quant, kernel):
    """mmq=True (MINFER_MMQ=1): prompt chunks and decode batches read the quantized weights: the
    int8 MMQ on the GEMVs' packed weights (x quantized to int8 per 32 values: its error on the
    logits stays within TOL), or for Q4_0 the tiled q4_0_matmul, which costs less by the measured
    rates; a decode row its GEMV as before."""
    path = tiny_gguf(preset, quant)
    cpu = load(path, "cpu", n_ctx=64, n_slots=4, progress=False)
    gpu = load(path, "cuda", n_ctx=64, n_slots=4, progress=False, mmq=True)
    be = gpu.engine.backend
    projections = [r["kernel"] for r in be.plan_rows(16) if r["op"] == "MatMul"]
    quantized = ("mmq_", "q4_0_matmul")
    assert kernel in projections and all(k.startswith(quantized) for k in projections)
    chunk = [r["kernel"] for r in be.plan_rows(512, prefill=True) if r["op"] == "MatMul"]
    assert kernel in chunk and all(k.startswith(quantized) for k in chunk)
    assert not any("mmq" in r["kernel"] for r in be.plan_rows(1))
    laid = [layout for layout in be.compiler.layouts_made() if "f16_weight" in layout]
    assert not laid  # no f16 copy: the MMQ reads the GEMVs' layouts
    want = raw.prefill(cpu.engine, 0, PROMPT)
    got = raw.prefill(gpu.engine, 0, PROMPT)
    assert _rel(got, want) < TOL
    seqs = [(1, PROMPT[:5]), (2, PROMPT[2:9]), (3, PROMPT[1:4])]
    for slot, toks in seqs:
        raw.prefill(cpu.engine, slot, toks)
        be.forward(Batch.single(toks, 0, slot=slot))
    together = be.forward(Batch.build([(s, len(t), [11 + s]) for s, t in seqs], [0, 1, 2], n_decode=3)).cpu()
    for i, (s, t) in enumerate(seqs):
        assert _rel(together[i], raw.decode(cpu.engine, s, 11 + s, len(t))) < TOL


def test_a_mixed_step_equals_its_parts(pair):
    _, gpu = pair("tiny-llama", "q4_1")
    be = gpu.engine.backend
    be.forward(Batch.single(PROMPT[:6], 0, slot=0))
    mixed = be.forward(Batch.build([(0, 6, [9]), (1, 0, PROMPT)], [0, 12], n_decode=1)).cpu()
    be.forward(Batch.single(PROMPT[:6], 0, slot=0))
    dec = be.forward(Batch.build([(0, 6, [9])], [0], n_decode=1)).cpu()
    pre = be.forward(Batch.single(PROMPT, 0, slot=1)).cpu()
    assert torch.allclose(mixed[0], dec[0], rtol=1e-5, atol=1e-5)
    assert torch.allclose(mixed[1], pre[0], rtol=1e-5, atol=1e-5)


def test_every_node_is_picked_through_a_contract(pair):
    _, gpu = pair("tiny-qwen2", "q4_k")
    be = gpu.engine.backend
    kernels = {r["kernel"] for r in be.plan_rows()}
    registered = set(be.registry.kernels)
    assert all(set(k.split("+")) <= registered for k in kernels)
    ops = {r["op"] for r in be.plan_rows()}
    # graph/fuse.py's fused nodes: the q+k+v GEMV with its bias and RoPE, gate+up with its SwiGLU,
    # every residual add that feeds a norm with that norm
    assert ops == {"GetRows", "RMSNorm", "QMatMulRoPE", "Attention", "MatMul", "AddRMSNorm", "QMatMulSwiGLU", "Add"}
    by_name = {r["name"]: r["kernel"] for r in be.plan_rows()}
    n_layer = be.graph.meta["n_layer"]
    assert [by_name[f"blk.{i}.attn_q+k+v+rope"] for i in range(n_layer)] == ["gemv_rope"] * n_layer
    assert [by_name[f"blk.{i}.ffn_gate+up+swiglu"] for i in range(n_layer)] == ["gemv_swiglu"] * n_layer
    # and the q+k+v GEMV writes the row's k and v into the (f16) cache for every layer's attention
    row = be.compiler.ways()[0]
    fused = [n for n in be.graph.nodes if str(n.op) == "QMatMulRoPE"]
    assert len(fused) == n_layer and all(be.compiler.kv_written(n, row) for n in fused)
    assert all(n.params["kv_written"] for n in be.graph.nodes if str(n.op) == "Attention")
    # a decode batch runs the fused nodes' parts, kernels of their own: the GEMVs' epilogues take one row
    batch = {r["name"]: r["kernel"] for r in be.plan_rows(16)}
    assert all(batch[f"blk.{i}.attn_q+k+v+rope"].endswith("+add_bias_f32+rope") for i in range(n_layer))
    assert all(batch[f"blk.{i}.ffn_gate+up+swiglu"].endswith("+swiglu_rows") for i in range(n_layer))
    adds = [r for r in be.plan_rows() if r["op"] in ("Add", "AddRMSNorm")]
    assert [r["kernel"] for r in adds] == ["add_rms_norm"] * (len(adds) - 1) + ["add_f32"]
    norms = [r for r in be.plan_rows() if r["op"] == "RMSNorm"]
    assert len(norms) == 2  # the first layer's (after the embedding) and the output norm


def test_a_node_no_contract_accepts_is_a_load_error(tiny_gguf):
    from dataclasses import replace

    from minfer.contracts.registry import default_registry

    reg = default_registry()
    crippled = replace(reg, kernels={k: v for k, v in reg.kernels.items() if v.contract.op != "RMSNorm"})
    from minfer.backends.cuda.backend import CUDABackend
    from minfer.config import EngineConfig
    from minfer.gguf.reader import GGUFReader
    from minfer.graph.fuse import optimize
    from minfer.models import registry as models

    reader = GGUFReader(tiny_gguf("tiny-llama", "q4_0"))
    _, graph = models.build(reader)
    be = CUDABackend(EngineConfig(device="cuda"), registry=crippled)
    with pytest.raises(NoKernelError, match=r"node 'blk.0.attn_norm' \(RMSNorm\).*dtypes .*'x': 'F32'"):
        be.load(optimize(graph), reader, progress=False)


def test_a_projection_alone_is_the_compiled_steps_matmul(pair):
    """`matmul_args` (what the GEMV benchmarks time) computes x @ W.T for a fused and a plain weight."""
    from minfer.quant.reference import dequantize

    cpu, gpu = pair("tiny-qwen2", "q4_k")
    be, reader = gpu.engine.backend, gpu.reader
    nodes = [n for n in gpu.engine.graph.nodes if str(n.op) == "MatMul"]  # (the graph before fusion)
    picked = [n for n in nodes if len(n.weights["w"].tensors) > 1][:1] + [nodes[-1]]
    assert len(picked) == 2
    for node in picked:
        kernel, args = be.matmul_args(node.name)
        parts = [dequantize(torch.from_numpy(reader.tensor_bytes(t.name)), reader.tensors[t.name].ggml_type,
                            tuple(reader.tensors[t.name].torch_shape)).float() for t in node.weights["w"].tensors]
        w = torch.cat(parts)
        assert tuple(w.shape) == (args["n"], args["k"])
        x = torch.randn(1, args["k"], generator=torch.Generator().manual_seed(node.id))
        got = kernel(x=x.to(be.device), **args)
        assert _rel(got, x @ w.T) < TOL


def test_overlapped_greedy_decode_equals_reading_every_step(tiny_gguf):
    """Tokens picked on the device, each step queued before the one ahead of it is read (CUDA
    graphs chained through their picked tokens on a GPU), against the same backend stepping one
    read at a time: the same tokens for sequences of different lengths decoding together."""
    path = tiny_gguf("tiny-llama", "q4_0")
    prompts = ["hello there", "the cat", "one two three four"]
    runs = []
    for overlap in (True, False):
        m = load(path, "cuda", n_ctx=64, n_slots=3, progress=False, overlap=overlap)
        launches = []
        real = m.engine.backend.decode_pick

        def counting(batch, after=None, params=None, real=real, launches=launches):
            launches.append(after is not None)
            return real(batch, after=after, params=params)

        m.engine.backend.decode_pick = counting
        if m.engine._launch is not None:
            m.engine._launch = counting
        out = m.generate_batch(prompts, max_tokens=9, temperature=0, ignore_eos=True)
        sampled = m.generate_batch(prompts, max_tokens=9, temperature=0.9, top_k=30, seed=11, ignore_eos=True)
        runs.append(([r.token_ids for r in out], [r.token_ids for r in sampled], launches))
    (over, over_s, chained), (plain, plain_s, none) = runs
    assert over == plain and all(len(t) == 9 for t in over)
    assert over_s == plain_s and over_s != over  # sampled on the device = sampled on the host
    assert not none and sum(chained) >= 6  # decode steps launched behind the step before them


def test_a_q8_0_kv_cache_runs_the_q8_kernels_close_to_the_f16_cache(tiny_gguf, raw):
    """--kv-cache q8_0: an int8 cache of Q8_0 rows (17/32 of the f16 cache's bytes), written
    quantized and read dequantized by the *_q8 attention contracts, for prompts and decode steps."""
    path = tiny_gguf("tiny-llama", "q4_0")
    f16 = load(path, "cuda", n_ctx=64, n_slots=2, progress=False)
    q8 = load(path, "cuda", n_ctx=64, n_slots=2, progress=False, kv_dtype="q8_0")
    be = q8.engine.backend
    assert be.cache.k.dtype == torch.int8 and be.cache.k.shape[-1] == 64 + 4
    assert be.cache.nbytes * 32 == f16.engine.backend.cache.nbytes * 17
    attn = {r["kernel"] for r in be.plan_rows() if r["op"] == "Attention"}
    assert attn == {"attention_rows_q8"} and {r["kernel"] for r in be.plan_rows(prefill=True)
                                               if r["op"] == "Attention"} == {"attention_prefill_q8"}
    want = raw.prefill(f16.engine, 0, PROMPT)
    got = raw.prefill(q8.engine, 0, PROMPT)
    assert 0 < _rel(got, want) < 3e-2  # the codes' rounding, no more
    steps_f = torch.stack([raw.decode(f16.engine, 0, t, p).cpu() for p, t in enumerate([5, 9, 300], start=12)])
    steps_q = torch.stack([raw.decode(q8.engine, 0, t, p).cpu() for p, t in enumerate([5, 9, 300], start=12)])
    assert 0 < _rel(steps_q, steps_f) < 3e-2


def test_warmup_leaves_generation_unchanged(pair):
    """Engine.warmup (what `minfer serve` runs before it says ready): on a GPU every decode bucket the
    slots fill is captured, greedy and sampling; the cache it wrote into is free space."""
    _, gpu = pair("tiny-llama", "q4_1")
    before = gpu.generate_batch(["hello there", "the cat"], max_tokens=5, temperature=0)
    gpu.engine.warmup()
    be = gpu.engine.backend
    if be.use_graphs:  # 4 slots + 512-token chunks: prompt-chunk buckets up to 768 rows
        assert set(be.graphs) == {(b, s) for b in (1, 2, 4) for s in (False, True)} | {
            ("prefill", b) for b in (64, 128, 192, 256, 384, 512, 768)}
    after = gpu.generate_batch(["hello there", "the cat"], max_tokens=5, temperature=0)
    assert [r.token_ids for r in after] == [r.token_ids for r in before]


def test_prompt_chunks_of_several_spans_replay_as_their_eager_pass(pair):
    """A prefill step of several prompts (one continuing its slot) and a few logits rows: on a GPU
    a captured prompt-chunk graph (the tile table read on the device), against the same step run
    eagerly; under the interpreter the eager pass against each prompt alone."""
    _, gpu = pair("tiny-qwen2", "f16")
    be = gpu.engine.backend
    be.forward(Batch.single(PROMPT[:5], 0, slot=1))
    spans = [(0, 0, PROMPT), (1, 5, PROMPT[5:]), (2, 0, PROMPT[:3] * 20)]  # 12 + 7 + 60 rows
    batch = Batch.build(spans, [11, 18, 19, 78])
    got = be.forward(batch).cpu()
    if be.use_graphs:
        assert ("prefill", 128) in be.graphs
        be.use_graphs = False
        try:
            want = be.forward(batch).cpu()
        finally:
            be.use_graphs = True
        assert _rel(got, want) < 1e-3  # cuBLAS may pick another algorithm for 79 rows than for 128
    alone = [be.forward(Batch.single(PROMPT, 0, slot=0)).cpu()[0],
             be.forward(Batch.build([(1, 5, PROMPT[5:])], [6])).cpu()[0],
             be.forward(Batch.build([(2, 0, PROMPT[:3] * 20)], [0, 59])).cpu()]
    assert _rel(got[0], alone[0]) < 1e-3 and _rel(got[1], alone[1]) < 1e-3 and _rel(got[2:], alone[2]) < 1e-3


@pytest.mark.parametrize("quant", ["q4_0", "q4_k"])
def test_int8_activations_from_the_norms(tiny_gguf, raw, monkeypatch, quant):
    """With every GEMV on int8 activations (the threshold lowered to the tiny model's sizes), the
    RMSNorms before the q+k+v, gate+up and output GEMVs write x's int8 form themselves and the GEMVs
    skip their quantize launch: decode logits equal, bit for bit, those of the GEMVs quantizing
    x themselves, and match the cpu within the cuda tolerance."""
    from minfer.kernels.triton import gemv

    monkeypatch.setattr(gemv, "Q8_MIN_WEIGHTS", 0)
    gemv.gemv_config.cache_clear()
    try:
        path = tiny_gguf("tiny-llama", quant)
        cpu = load(path, "cpu", n_ctx=32, n_slots=1, progress=False)
        gpu = load(path, "cuda", n_ctx=32, n_slots=1, progress=False)
        be = gpu.engine.backend
        row = be.compiler.ways()[0]
        names = {n.name for n in be.graph.nodes if n.params.get("q8_out") and be.compiler.q8_link(n, row)}
        layers = {n.split(".")[1] for n in names if n.startswith("blk.")}
        per_layer = {f"blk.{i}.{x}" for i in layers for x in ("attn_norm", "ffn_norm")}
        assert per_layer <= names <= per_layer | {"output_norm"}  # the output's: when its weight is a Q4 type
        assert len(layers) >= 2
        raw.prefill(cpu.engine, 0, PROMPT[:5])
        raw.prefill(gpu.engine, 0, PROMPT[:5])
        fused = torch.stack([raw.decode(gpu.engine, 0, t, p).cpu().clone() for p, t in enumerate(PROMPT[5:8], start=5)])
        steps_c = torch.stack([raw.decode(cpu.engine, 0, t, p) for p, t in enumerate(PROMPT[5:8], start=5)])
        assert _rel(fused, steps_c) < TOL
        # without graph/fuse.py's int8 rule the norms write f32 only and the GEMVs quantize x (the same values)
        from minfer.graph import fuse

        monkeypatch.setattr(fuse, "FUSIONS", tuple(r for r in fuse.FUSIONS if r is not fuse.fuse_int8_x))
        plain = load(path, "cuda", n_ctx=32, n_slots=1, progress=False)
        assert not any(n.params.get("q8_out") for n in plain.engine.backend.graph.nodes)
        raw.prefill(plain.engine, 0, PROMPT[:5])
        steps = enumerate(PROMPT[5:8], start=5)
        alone = torch.stack([raw.decode(plain.engine, 0, t, p).cpu().clone() for p, t in steps])
        assert torch.equal(fused, alone)
    finally:
        monkeypatch.undo()
        gemv.gemv_config.cache_clear()
