"""The engine's ways of computing the same logits agree (tiny synthetic f32 models, float64-level
tolerances): fused vs plain graph, one batch of two sequences vs two runs, chunked vs whole
prefill, token-by-token decode vs prefill. Plus the trace a run records."""

from __future__ import annotations

import json

import pytest
import torch

from minfer.backends.base import Batch
from minfer.backends.cpu.backend import CPUBackend
from minfer.config import EngineConfig
from minfer.engine.engine import Engine
from minfer.gguf.reader import GGUFReader
from minfer.graph.ir import Op
from minfer.models import registry

A = [5, 9, 200, 31, 7, 64, 3, 17, 90, 11]
B = [44, 2, 130, 6, 8, 250]


def _close(a, b, tol=1e-5):
    return float((a - b).abs().max()) <= tol * float(b.abs().max())


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-qwen2"])
def model_path(request, tiny_gguf):
    return tiny_gguf(request.param)


@pytest.fixture(scope="module")
def engine(model_path):
    return Engine.load(GGUFReader(model_path), EngineConfig(n_slots=2), progress=False)


def test_fused_graph_equals_the_plain_graph(engine, model_path, raw):
    reader = GGUFReader(model_path)
    _, plain = registry.build(reader)
    be = CPUBackend()
    be.load(plain, reader, progress=False)
    be.allocate(1, 64)
    want = be.forward(Batch.single(A, 0, rows=range(len(A))))
    got = raw.prefill(engine, 0, A)
    assert _close(got, want)
    ops = [n.op for n in engine.graph.nodes]
    assert len(engine.graph.nodes) != len(plain.nodes) and Op.SLICE in ops
    fused = {t.name for n in engine.graph.nodes for w in n.weights.values() for t in w.tensors}
    assert fused == set(plain.weights)  # the passes read exactly the file's tensors


def test_two_sequences_in_one_batch(engine, raw):
    want_a = raw.prefill(engine, 0, A)
    want_b = raw.prefill(engine, 1, B)
    # continue both: 2 more tokens of A (slot 0) and 1 of B (slot 1) in one step
    nxt_a, nxt_b = [12, 13], [14]
    solo_a = raw.prefill(engine, 0, A + nxt_a, rows=range(len(A), len(A) + 2))
    solo_b = raw.prefill(engine, 1, B + nxt_b, rows=range(len(B), len(B) + 1))
    raw.prefill(engine, 0, A)
    raw.prefill(engine, 1, B)
    batch = Batch.build([(0, len(A), nxt_a), (1, len(B), nxt_b)], [0, 1, 2])
    assert batch.positions.tolist() == [len(A), len(A) + 1, len(B)] and batch.row_slots.tolist() == [0, 0, 1]
    got = engine.backend.forward(batch)
    assert _close(got[:2], solo_a) and _close(got[2:], solo_b)
    assert want_a.shape == (len(A), engine.n_vocab) and want_b.shape == (len(B), engine.n_vocab)


def test_chunked_prefill_equals_whole(engine, raw):
    whole = raw.prefill(engine, 0, A)
    chunked = torch.cat([raw.prefill(engine, 0, A[i:i + 3], start=i) for i in range(0, len(A), 3)])
    middle = raw.prefill(engine, 0, A[4:7], start=4)
    assert _close(chunked, whole) and _close(middle, whole[4:7])


def test_decode_steps_equal_prefill(engine, raw):
    whole = raw.prefill(engine, 0, A)
    steps = [raw.prefill(engine, 0, A[:1])[0]] + [raw.decode(engine, 0, t, p) for p, t in enumerate(A[1:], start=1)]
    assert _close(torch.stack(steps), whole)


# ||decode rows - the prompt's rows|| / ||prompt's rows|| of quantized tiny models on the cpu, the prompt in
# the decode rows' two int8 activation passes (cpu_prompt_passes=2: the default one pass differs by ~7e-3,
# too near the bug below to tell it), measured 2026-12-02: q4_0 3.0e-5 (the VNNI kernel; 0 on torch's int4
# kernel), q4_k 7.5e-4 (its Q6_K output on torch's kernel, bfloat16 activations); bounds 3x. A decode-row
# RoPE one position off: ~1e-2.
DECODE_VS_PROMPT = {"q4_0": 9e-5, "q4_k": 2.3e-3}


@pytest.mark.parametrize("quant", sorted(DECODE_VS_PROMPT))
def test_quantized_decode_steps_equal_prefill(tiny_gguf, raw, quant):
    eng = Engine.load(GGUFReader(tiny_gguf("tiny-llama", quant)), EngineConfig(n_slots=1, cpu_prompt_passes=2),
                      progress=False)
    whole = raw.prefill(eng, 0, A)
    raw.prefill(eng, 0, A[:4])
    steps = torch.stack([raw.decode(eng, 0, t, p) for p, t in enumerate(A[4:], start=4)])
    assert float((steps - whole[4:]).norm() / whole[4:].norm()) < DECODE_VS_PROMPT[quant]


def test_a_prompt_in_many_chunks_equals_it_in_one(model_path):
    """Through the scheduler (Model.logits, greedy generate): a prompt run 3 or 7 tokens a step equals
    it run in one step, every row of it and the tokens after it. (16 tokens: 3 a step leave a last chunk
    of 1, 7 a step one of 2, so a chunk lost before the last token shows.)"""
    from minfer.api import load
    from minfer.engine.params import SamplingParams

    out = []
    for chunk in (3, 7, 512):
        with load(model_path, n_ctx=64, n_slots=1, prefill_chunk=chunk, progress=False) as m:
            seq = m.engine.add(A + B, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True), reuse_prefix=False)
            m.engine.run([seq])
            out.append((m.logits(A + B), seq.generated))
    *chunked, (rows1, toks1) = out
    for rows, toks in chunked:
        assert rows.shape == (len(A + B), rows1.shape[1]) and _close(rows, rows1) and toks == toks1


def test_trace_records_every_node_of_every_step(tiny_gguf, tmp_path):
    from minfer.api import load

    path = tmp_path / "trace.json"
    with load(tiny_gguf(), progress=False, trace=str(path)) as m:
        m.generate("hello there", max_tokens=3, temperature=0)
        n_nodes = len(m.engine.graph.nodes)
    doc = json.loads(path.read_text())
    assert len(doc["graph"]) == n_nodes
    kinds = [s["kind"] for s in doc["steps"]]
    assert kinds == ["prefill", "decode", "decode"]
    assert all(len(s["nodes"]["id"]) == n_nodes for s in doc["steps"])
    assert all(s["token"] is not None for s in doc["steps"])
    mm = [g for g in doc["graph"] if g["op"] == "MatMul"]
    assert {g["kernel"] for g in mm} == {"cpu_linear_f32"}  # an f32 model: the float32 GEMM


def test_no_trace_without_a_path(tiny_gguf):
    eng = Engine.load(GGUFReader(tiny_gguf()), EngineConfig(), progress=False)
    assert eng.recorder is None


def test_rope_frequency_factors_and_linear_scaling_agree(tiny_gguf, rewrite_gguf, tmp_path, raw):
    """Llama-3 style rope_freqs.weight of all 2.0 divides every frequency by 2: the same rotation as
    linear scaling with factor 2 (rope.scaling.*), which must differ from no scaling at all."""
    import numpy as np

    from minfer.gguf.reader import ValueType
    from minfer.quant.types import GGMLType

    base = tiny_gguf()
    half_rot = GGUFReader(base).get_int("llama.rope.dimension_count") // 2
    factors = ("rope_freqs.weight", (half_rot,), GGMLType.F32, np.full(half_rot, 2.0, np.float32).tobytes())
    with_factors = rewrite_gguf(base, tmp_path / "f.gguf", add=[factors])
    linear = rewrite_gguf(base, tmp_path / "l.gguf", meta={
        "llama.rope.scaling.type": (ValueType.STRING, "linear"),
        "llama.rope.scaling.factor": (ValueType.FLOAT32, 2.0)})
    out = {}
    for name, path in (("none", base), ("factors", with_factors), ("linear", linear)):
        eng = Engine.load(GGUFReader(path), EngineConfig(n_slots=1), progress=False)
        out[name] = raw.prefill(eng, 0, A)
    assert _close(out["factors"], out["linear"])
    assert not _close(out["none"], out["linear"], tol=1e-3)
