"""MINFER_TRACE end to end: a traced greedy SmolLM2 run writes a valid trace that agrees with llama.cpp."""

from __future__ import annotations

import json

import jsonschema
import pytest

from minfer.config import EngineConfig
from minfer.engine.engine import Engine
from minfer.engine.params import SamplingParams
from minfer.gguf.reader import GGUFReader
from minfer.tokenizer.tokenizer import Tokenizer
from minfer.trace.format import TRACE_SCHEMA

STEPS = 3


def test_traced_smollm2_run(tmp_path, smollm2_path, llamacpp_ref):
    case = llamacpp_ref["greedy"][0]
    path = tmp_path / "t.json"
    tok = Tokenizer.from_gguf(smollm2_path)
    engine = Engine.load(GGUFReader(smollm2_path), EngineConfig(device="cpu", trace_path=str(path), n_ctx=64),
                         tokenizer=tok, progress=False)
    params = SamplingParams(max_tokens=STEPS, temperature=0.0, ignore_eos=True, seed=0)
    seq = engine.add(case["prompt_ids"], params)
    engine.run([seq])
    ids = seq.generated
    engine.close()

    doc = json.loads(path.read_text())
    jsonschema.validate(doc, TRACE_SCHEMA)
    steps = doc["steps"]
    assert [s["kind"] for s in steps] == ["prefill"] + ["decode"] * (STEPS - 1)
    assert steps[0]["n_tokens"] == len(case["prompt_ids"])
    assert [s["token"]["id"] for s in steps] == ids
    graph_ids = {n["id"] for n in doc["graph"]}
    assert "GetRows" in {n["op"] for n in doc["graph"]}
    out_id = doc["graph"][-1]["id"]
    for s, ref in zip(steps, case["steps"], strict=False):
        assert set(s["nodes"]["id"]) <= graph_ids and out_id in s["nodes"]["id"]
        # greedy: the chosen token is the top-1 of the recorded distribution, with rank 0
        assert s["top"]["ids"][0] == s["token"]["id"] and s["token"]["rank"] == 0
        # the last node's output is the logits row: its recorded max is the top-1 logit
        c = s["nodes"]["id"].index(out_id)
        assert s["nodes"]["max"][c] == pytest.approx(s["top"]["logits"][0], rel=1e-6)
        # an independent oracle: llama.cpp's top-1 at the same step, logits within its 8-bit noise
        ref_top = dict(map(tuple, ref["top"]))
        assert s["top"]["ids"][0] == ref["token"]
        assert s["top"]["logits"][0] == pytest.approx(ref_top[ref["token"]], abs=1.0)
    assert sum(len(s["heatmaps"]) for s in steps) > 0
