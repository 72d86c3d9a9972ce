"""`minfer plan`: every node of every preset's graph resolves to a contract on cuda, from the
header alone (no weights read, no GPU), and the command prints the prediction."""

from __future__ import annotations

import math

import pytest

from minfer.backends.cpu.weights import VNNI_DECODE
from minfer.cli import main
from minfer.config import EngineConfig
from minfer.engine import loader
from minfer.gguf.reader import GGUFReader
from minfer.gguf.synth import PRESETS, QUANTS, synth
from minfer.kernels.cpu import vnni as cpu_vnni

# f16 / f32 files of these (15-32 GB) are more than a CI machine can map
BIG = {"qwen2.5-7b", "llama3-8b", "qwen3-8b", "phi3-mini"}
# llama3-70b: even its Q4_K header-only file (40 GB mapped) is; tests/parallel/test_shard.py plans 2 of its
# layers; so are the mixtures of experts' (17-26 GB at Q4_0; tests/models/test_moe.py plans 2 of their layers)
HUGE = {"llama3-70b", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-20b"}  # (gpt-oss-20b f32: 80 GB mapped)
CASES = [(p, q) for p in sorted(PRESETS) if p not in HUGE for q in QUANTS
         if not (p in BIG and q in ("f16", "f32"))]


# `minfer plan --device cpu` run as a command (~0.3 CPU-s each, a third of a case) for a covering subset: the
# first case (in CPU_CASES' order) of every preset and of every quant, so each architecture and each weight type
# goes through the command once; every case still loads its plan and checks its kernels without it.
CPU_CASES = [c for c in CASES if c[1] != "f16"]
CPU_COMMAND_CASES = {c for key in (0, 1) for c in {case[key]: case for case in reversed(CPU_CASES)}.values()}


class _Headers(dict):
    """(preset, quant) -> a header-only file of it, written the first time a test asks (under
    pytest-xdist a worker writes only the ones its tests read)."""

    def __init__(self, root):
        super().__init__()
        self.root = root

    def __missing__(self, key):
        p, q = key
        self[key] = synth(p, q, self.root / f"{p}-{q}.gguf", header_only=True)
        return self[key]


@pytest.fixture(scope="module")
def headers(tmp_path_factory):
    return _Headers(tmp_path_factory.mktemp("headers"))


@pytest.mark.parametrize("preset, quant", CASES)
def test_every_node_of_every_preset_resolves(headers, preset, quant):
    with GGUFReader(headers[preset, quant]) as reader:
        be = loader.load(reader, EngineConfig(device="cuda"), progress=False, plan_only=True).backend
    for rows, prefill in ((1, False), (16, False), (512, True)):
        plan = be.plan_rows(rows, prefill)
        assert plan and all(math.isfinite(r["cost_ns"]) and r["cost_ns"] > 0 for r in plan)
    kernels = {k for r in be.plan_rows(1) for k in r["kernel"].split("+")}
    if quant == "q4_0":
        assert "q4_0_gemv" in kernels
    if quant in ("q4_1", "q4_k"):
        assert "int4_gemv" in kernels
    if quant == "q8_0":  # (a mixture of experts' router is F32 in every mix, as llama.cpp keeps it: linear_f16)
        assert "q8_0_gemv" in kernels and ("linear_f16" not in kernels or PRESETS[preset].n_expert)
    if quant == "q4_k" and preset in BIG:  # their Q6_K output (tied small models: the Q6_K embedding)
        assert "q6_k_gemv" in kernels and "linear_f16" not in kernels
    arch = PRESETS[preset].arch
    if arch.startswith("gemma"):  # the families' own ops, through their contracts
        assert "scale_f32" in kernels
        # a decode row: the gate+up GEMV with the GeGLU in its store where the type has a GEMV
        assert {"gemv_geglu", "geglu_rows"} & kernels and (quant != "q4_0" or "gemv_geglu" in kernels)
    if arch == "gemma2":
        assert "softcap_f32" in kernels
    if PRESETS[preset].n_expert:  # a decode row: the router, then the chosen experts' GEMVs (or f16 copies)
        assert "moe_route_rows" in kernels and "moe_sum_rows" in kernels
        assert ("moe_matmul_f16" if quant in ("f16", "f32") else "moe_gemv") in kernels
        chunk = {k for r in be.plan_rows(512, True) for k in r["kernel"].split("+")}
        assert quant in ("f16", "f32") or "moe_mm16" in chunk  # prompts: rows grouped by expert


def test_plan_command_prints_kernels_and_prediction(headers, capsys):
    path = headers["qwen2.5-7b", "q4_0"]
    assert main(["plan", "-m", str(path)]) == 0
    out = capsys.readouterr().out
    assert "q4_0_gemv" in out and "attention_rows" in out and "add_rms_norm" in out
    assert "predicted:" in out and "tok/s" in out
    assert main(["plan", "-m", str(path), "--prefill", "512", "--json"]) == 0
    import json

    doc = json.loads(capsys.readouterr().out)
    assert doc["predicted_tok_s"] > 0 and {n["kernel"] for n in doc["nodes"]} >= {"linear_f16", "attention_prefill"}
    assert main(["plan", "-m", str(path), "-b", "0"]) == 2


@pytest.mark.parametrize("preset, quant", CPU_CASES)
def test_every_cpu_matmul_resolves_to_a_cpu_contract(headers, preset, quant, capsys):
    """`minfer plan --device cpu`: each matmul node's weight parts name a cpu kernel contract; a
    prompt chunk's are the decode row's but the VNNI kernels' one-pass variants where a type has
    them (its logits: the decode row's), and all the decode row's with cpu_prompt_passes=2."""
    with GGUFReader(headers[preset, quant]) as reader:
        be = loader.load(reader, EngineConfig(device="cpu"), progress=False, plan_only=True).backend
        one, chunk = be.plan_rows(1), be.plan_rows(512, prefill=True)
        be2 = loader.load(reader, EngineConfig(device="cpu", cpu_prompt_passes=2), progress=False,
                          plan_only=True).backend
        chunk2 = be2.plan_rows(512, prefill=True)
        logits_id = be.graph.logits_id
    assert one and all(math.isfinite(r["cost_ns"]) and r["cost_ns"] > 0 for r in one + chunk)
    pair32, pair16 = "cpu_int4pack_mm_pair32", "cpu_int4pack_mm_pair16"
    q4 = "cpu_q4_vnni2" if cpu_vnni.available() else "cpu_int4pack_mm"
    q8 = "cpu_q8_vnni2" if cpu_vnni.available() else pair32  # 8-bit codes: Q8_0
    q5 = "cpu_q5_vnni2" if cpu_vnni.available() else pair32  # 5-bit codes: the Q5 types
    q6 = "cpu_q6k_vnni2" if cpu_vnni.available() else pair16
    decode = [r["kernel"] for r in one]
    assert all("_vnni" not in k or k.endswith(("_vnni2", "_vnni2_moe")) for ks in decode for k in ks.split("+"))
    one_pass = {v: k for k, v in VNNI_DECODE.items()}
    assert [r["kernel"] for r in chunk] == [
        ks if r["id"] == logits_id else "+".join(one_pass.get(k, k) for k in ks.split("+"))
        for r, ks in zip(one, decode, strict=True)]
    assert [r["kernel"] for r in chunk2] == decode
    iq4 = "cpu_iq4_vnni2" if cpu_vnni.available() else pair32  # the lookup types: their table's kernel
    mxfp4 = "cpu_mxfp4_vnni2" if cpu_vnni.available() else pair32
    want = {"q4_0": q4, "q4_1": q4, "q4_k": q4, "q4_k_m": q4, "q8_0": q8, "q5_k_m": q5, "q5_0": q5,
            "q5_1": q5, "iq4_nl": iq4, "iq4_xs": iq4, "mxfp4": mxfp4,
            "q6_k": q6, "q3_k": pair16, "q2_k": pair16, "f32": "cpu_linear_f32"}[quant]
    if PRESETS[preset].arch == "gpt-oss" and quant == "mxfp4":  # its mix: MXFP4 experts only, the rest Q8_0
        want = "cpu_vnni2_moe" if cpu_vnni.available() else want
    assert want in {k for r in one for k in r["kernel"].split("+")}  # (8 experts: q+k+v of mixed types)
    if preset in BIG and quant in ("q4_k", "q4_k_m", "q5_k_m", "q3_k", "q2_k", "iq4_nl", "iq4_xs"):  # Q6_K output
        assert one[-1]["kernel"] == q6
    if (preset, quant) in CPU_COMMAND_CASES:
        assert main(["plan", "--device", "cpu", "-m", str(headers[preset, quant])]) == 0
        assert "predicted:" in capsys.readouterr().out
