"""TraceRecorder: schema-valid output, values equal direct computations, size bounds, misuse errors."""

from __future__ import annotations

import json
import math

import jsonschema
import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from minfer.trace import TraceRecorder
from minfer.trace.format import FORMAT, TRACE_SCHEMA, VERSION, load_trace


def _node(i, name, op, inputs, shape, layer=None, kernel=None, **extra):
    return {"id": i, "name": name, "op": op, "inputs": inputs, "shape": shape, "dtype": "f32", "layer": layer,
            "kernel": kernel, **extra}


GRAPH = [
    _node(0, "token_embd", "GetRows", [], ["n_tokens", 8]),
    _node(1, "blk.0.attn_norm", "RmsNorm", [0], ["n_tokens", 8], 0, "cpu:rms_norm"),
    _node(2, "blk.0.ffn_up", "MatMul", [1], ["n_tokens", 16], 0, "cpu:matmul", contract="matmul_q4_1"),
    _node(3, "output", "MatMul", [2], [1, 50], None, "cpu:matmul"),
]


def _strict_json(path):
    """Parse as strict JSON: NaN / Infinity tokens are an error (browsers' JSON.parse rejects them)."""
    def bad(tok):
        raise ValueError(f"non-standard JSON constant {tok}")
    return json.loads(path.read_text(), parse_constant=bad)


def _run(path, steps=3, **kw):
    """Record a tiny fake run; returns the tensors fed per (step, node) and the logits per step."""
    g = torch.Generator().manual_seed(0)
    fed, logits_by_step = {}, {}
    rec = TraceRecorder(path, model_info={"name": "fake", "layers": 1}, top_k=4, heatmap_max=4,
                        detokenize=lambda i: f"<{i}>", **kw)
    rec.set_graph(GRAPH)
    for step in range(steps):
        n = 5 if step == 0 else 1
        rec.begin_step(step, "prefill" if step == 0 else "decode", n)
        for nid, cols in ((0, 8), (1, 8), (2, 16), (3, 50)):
            rows = 1 if nid == 3 else n
            x = torch.randn(rows, cols, generator=g) * (nid + 1)
            if step == 1 and nid == 2:
                x[0, 3], x[0, 5], x[0, 6] = float("nan"), float("inf"), float("-inf")
            fed[(step, nid)] = x
            kernel = "cpu:gemv" if (nid == 2 and step > 0) else GRAPH[nid]["kernel"]
            rec.node(nid, x, 1e-4 * (nid + 1), kernel=kernel)
        logits = fed[(step, 3)]
        tok = int(torch.argmax(logits))
        logits_by_step[step] = logits
        rec.end_step(torch.tensor(tok, dtype=torch.int32), logits, f"<{tok}>")
    rec.close()
    return fed, logits_by_step


def test_trace_validates_and_values_match(tmp_path):
    path = tmp_path / "t.json"
    fed, logits = _run(path)
    doc = _strict_json(path)
    jsonschema.validate(doc, TRACE_SCHEMA)
    assert (doc["format"], doc["version"]) == (FORMAT, VERSION)
    assert doc["graph"][2]["contract"] == "matmul_q4_1"  # extra node keys pass through
    assert [s["kind"] for s in doc["steps"]] == ["prefill", "decode", "decode"]
    for s in doc["steps"]:
        cols = s["nodes"]
        assert cols["id"] == [0, 1, 2, 3]
        for c, nid in enumerate(cols["id"]):
            a = fed[(s["step"], nid)].double().numpy().ravel()
            fin = a[np.isfinite(a)]
            assert cols["shape"][c] == list(fed[(s["step"], nid)].shape)
            assert cols["numel"][c] == a.size
            assert cols["nan"][c] == int(np.isnan(a).sum()) and cols["inf"][c] == int(np.isinf(a).sum())
            assert cols["min"][c] == fin.min() and cols["max"][c] == fin.max()
            assert cols["mean"][c] == pytest.approx(math.fsum(fin) / fin.size, rel=1e-12)
            assert cols["std"][c] == pytest.approx(float(np.std(fin)), rel=1e-10)
            assert cols["seconds"][c] == pytest.approx(1e-4 * (nid + 1))
        # the per-step kernel is stored only where it differs from the graph's
        assert s["kernels"] == ({} if s["step"] == 0 else {"2": "cpu:gemv"})
        row = logits[s["step"]][-1].double().numpy()
        p = np.exp(row - row.max())
        p /= p.sum()
        order = np.argsort(-p, kind="stable")[:4]
        assert s["top"]["ids"] == order.tolist()
        assert s["top"]["probs"] == pytest.approx(p[order].tolist(), rel=1e-12)
        assert s["top"]["texts"] == [f"<{i}>" for i in order]
        assert s["entropy"] == pytest.approx(float(-(p * np.log(p)).sum()), rel=1e-12)
        assert s["token"] == {"id": int(order[0]), "text": f"<{order[0]}>", "prob": pytest.approx(p[order[0]]),
                              "logit": pytest.approx(row[order[0]]), "rank": 0}
    nan_step = doc["steps"][1]["nodes"]
    assert (nan_step["nan"][2], nan_step["inf"][2]) == (1, 2)


def test_heatmap_step_rule_and_budget(tmp_path):
    path = tmp_path / "t.json"
    _run(path, steps=20, heatmap_first=2, heatmap_every=5)
    doc = _strict_json(path)
    jsonschema.validate(doc, TRACE_SCHEMA)
    with_maps = [s["step"] for s in doc["steps"] if s["heatmaps"]]
    assert with_maps == [0, 1, 5, 10, 15]
    assert all(s["heatmap_step"] == (s["step"] in with_maps) for s in doc["steps"])
    assert set(doc["steps"][0]["heatmaps"]) == {"0", "1", "2", "3"}
    hm = doc["steps"][0]["heatmaps"]["2"]
    assert (hm["rows"], hm["cols"], hm["h"], hm["w"]) == (5, 16, 4, 4)
    assert doc["heatmaps_dropped"] == 0
    assert doc["heatmap_bytes"] == sum(len(h["data"]) for s in doc["steps"] for h in s["heatmaps"].values())

    small = tmp_path / "small.json"
    _run(small, steps=20, heatmap_first=2, heatmap_every=5, heatmap_budget=100)
    doc = _strict_json(small)
    stored = sum(len(s["heatmaps"]) for s in doc["steps"])
    assert doc["heatmaps_dropped"] == 5 * 4 - stored > 0
    assert doc["heatmap_bytes"] < 100 + 4 * 4 * 4 / 3 + 4  # stops after the first heatmap past the budget


def _smollm2_like_graph(layers=30):
    """~16 nodes per layer with SmolLM2-135M's sizes: d=576, 9 heads (3 kv) of 64, ffn 1536, vocab 49152."""
    nodes = [_node(0, "token_embd", "GetRows", [], ["T", 576])]
    shapes = [("attn_norm", 576), ("attn_q", 576), ("attn_k", 192), ("attn_v", 192), ("q_rope", (9, 64)),
              ("k_rope", (3, 64)), ("kq_softmax", None), ("kqv", 576), ("attn_output", 576), ("attn_res", 576),
              ("ffn_norm", 576), ("ffn_gate", 1536), ("ffn_up", 1536), ("ffn_swiglu", 1536), ("ffn_down", 576),
              ("ffn_res", 576)]
    kinds = []
    for li in range(layers):
        for name, shp in shapes:
            nodes.append(_node(len(nodes), f"blk.{li}.{name}", "Op", [len(nodes) - 1], ["T"], li, "cpu:op"))
            kinds.append(shp)
    nodes.append(_node(len(nodes), "output_norm", "RmsNorm", [len(nodes) - 1], ["T", 576]))
    kinds.append(576)
    nodes.append(_node(len(nodes), "output", "MatMul", [len(nodes) - 1], [1, 49152]))
    kinds.append("logits")
    return nodes, [None, *kinds]


def test_128_token_run_of_30_layers_stays_small(tmp_path):
    nodes, kinds = _smollm2_like_graph()
    g = torch.Generator().manual_seed(0)
    cache: dict = {}

    def tensor(kind, n, past):
        key = (kind, n, past if kind is None else 0)
        if key not in cache:
            if kind is None:
                shape = (9, n, past + n)
            elif kind == "logits":
                shape = (1, 49152)
            elif isinstance(kind, tuple):
                shape = (n, *kind)
            else:
                shape = (n, kind)
            cache[key] = torch.randn(shape, generator=g)
        return cache[key]

    path = tmp_path / "big.json"
    rec = TraceRecorder(path)
    rec.set_graph(nodes)
    prompt, past = 32, 0
    for step in range(128):
        n = prompt if step == 0 else 1
        rec.begin_step(step, "prefill" if step == 0 else "decode", n)
        for nid, kind in enumerate(kinds):
            rec.node(nid, tensor(kind if nid else 576, n, past), 1e-5)
        rec.end_step(7, tensor("logits", 1, 0), " seven")
        past += n
    rec.close()
    size = path.stat().st_size
    assert size < 20e6, f"trace of a 128-token, 30-layer run is {size / 1e6:.1f} MB"
    doc = load_trace(path)
    assert len(doc["steps"]) == 128 and len(doc["steps"][-1]["nodes"]["id"]) == len(nodes)
    assert doc["heatmaps_dropped"] == 0


def test_nan_and_inf_are_written_as_null(tmp_path):
    path = tmp_path / "t.json"
    with TraceRecorder(path) as rec:
        rec.set_graph(GRAPH[:1])
        rec.begin_step(0, "decode", 1)
        rec.node(0, torch.tensor([[float("nan"), float("inf")]]), 0.0)
        rec.end_step(1, torch.tensor([[float("nan"), 0.0, 1.0]]))
    doc = _strict_json(path)
    jsonschema.validate(doc, TRACE_SCHEMA)
    s = doc["steps"][0]
    assert (s["nodes"]["mean"], s["nodes"]["nan"], s["nodes"]["inf"]) == ([None], [1], [1])
    assert s["entropy"] is None and s["token"]["prob"] is None
    assert s["heatmaps"]["0"]["data"] == "//8="  # both cells non-finite: code 255


def test_lifecycle_and_misuse(tmp_path):
    path = tmp_path / "t.json"
    rec = TraceRecorder(path)
    with pytest.raises(MinferError, match="outside"):
        rec.node(0, torch.zeros(1), 0.0)
    rec.set_graph(GRAPH)
    with pytest.raises(MinferError, match="kind"):
        rec.begin_step(0, "train", 1)
    rec.begin_step(0, "prefill", 2)
    with pytest.raises(MinferError, match="not in the graph"):
        rec.node(99, torch.zeros(1), 0.0)
    with pytest.raises(MinferError, match="expected a tensor"):
        rec.node(1, [1.0, 2.0], 0.0)
    rec.node(1, torch.ones(2, 8, dtype=torch.bfloat16), 0.0)
    rec.begin_step(1, "decode", 1)  # closes step 0 without a token
    rec.node(1, torch.ones(1, 8), 0.0)
    rec.close()  # closes the open step too
    rec.close()  # idempotent
    with pytest.raises(MinferError, match="closed"):
        rec.begin_step(2, "decode", 1)
    doc = _strict_json(path)
    jsonschema.validate(doc, TRACE_SCHEMA)
    assert [(s["step"], s["token"], s["top"]) for s in doc["steps"]] == [(0, None, None), (1, None, None)]
    assert doc["steps"][0]["nodes"]["mean"] == [1.0]
    with pytest.raises(MinferError, match="without begin_step"):
        TraceRecorder(tmp_path / "u.json").end_step(None, None)
    neg = TraceRecorder(tmp_path / "n.json")
    neg.begin_step(0, "decode", 1)
    with pytest.raises(MinferError, match="negative"):
        neg.end_step(-1, None)
    with pytest.raises(MinferError, match="encode"):
        TraceRecorder(tmp_path / "m.json", model_info={"x": float("nan")}).close()


@pytest.mark.parametrize("graph,match", [
    ([{"id": 0}], "lacks"),
    ([_node(0, "a", "X", [], [1]), _node(0, "b", "X", [], [1])], "unique"),
    ([_node(0, "a", "X", [5], [1])], "unknown inputs"),
    (["node"], "expected a dict"),
    ([_node(0, "a", "X", ["zero"], [1])], "bad inputs"),
])
def test_bad_graph_is_rejected(tmp_path, graph, match):
    with pytest.raises(MinferError, match=match):
        TraceRecorder(tmp_path / "t.json").set_graph(graph)


def test_unwritable_path_is_a_typed_error_before_the_run(tmp_path):
    """A path the trace cannot go to (under a file, a directory itself) is refused when the recorder is
    made, before the run it would record (was: at close, after the whole run). A good path leaves no file
    until close writes it."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for bad, why in ((blocker / "t.json", "cannot write"), (tmp_path, "it is a directory")):
        with pytest.raises(MinferError, match=why):
            TraceRecorder(bad)
    good = tmp_path / "sub" / "t.json"
    rec = TraceRecorder(good)
    assert not good.exists() and list(good.parent.iterdir()) == []
    rec.close()
    assert good.exists()


@pytest.mark.parametrize("content,match", [
    ("{not json", "not valid JSON"),
    ('{"format": "other"}', "not a minfer trace"),
    ('{"format": "minfer-trace", "version": 99}', "version 99"),
    ('{"format": "minfer-trace", "version": 2}', "lacks"),
])
def test_load_trace_errors(tmp_path, content, match):
    p = tmp_path / "x.json"
    p.write_text(content)
    with pytest.raises(MinferError, match=match):
        load_trace(p)
    with pytest.raises(MinferError, match="cannot read"):
        load_trace(tmp_path / "missing.json")
