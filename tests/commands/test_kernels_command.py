"""`minfer kernels` (listing, --json, --check) through the command line (minfer/commands/kernels.py)."""

from __future__ import annotations

import json
from pathlib import Path

import minfer.contracts.registry as registry_mod
from minfer.cli import main

SEED = Path(__file__).parents[1] / "contracts" / "data" / "seed004.fkc.md"


def test_listing_shows_every_section(capsys):
    assert main(["kernels"]) == 0
    out = capsys.readouterr().out
    for name in ("add_f32", "dequant", "embed_rows", "quantize_q8_0", "q4_0_gemv", "q4_0_matmul", "int4_gemv",
                 "rms_norm", "add_rms_norm", "rope", "attention_rows", "attention_prefill", "attention_sdpa",
                 "linear_f16"):
        assert name in out
    from minfer.contracts.parser import parse_file
    from minfer.contracts.registry import contract_files

    n = sum(len(parse_file(f).sections) for f in contract_files())
    assert n >= 21 and "minfer.kernels.triton.q4_0:q4_0_gemv" in out
    assert f"{n} sections, {n} bound, 0 with errors" in out


def test_listing_json(capsys):
    assert main(["kernels", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    gemv = next(r for r in rows if r["kernel"] == "q4_0_gemv")
    assert gemv["op"] == "QMatMul" and gemv["valid"] and gemv["registrable"]
    assert gemv["file"] == "triton/q4_0.fkc.md"
    assert gemv["launcher"] == "minfer.kernels.triton.q4_0:q4_0_gemv" and len(gemv["revision"]) == 16


def test_check_clean_seed(capsys):
    assert main(["kernels", "--check", str(SEED)]) == 0
    assert "6 section(s), ok" in capsys.readouterr().out


def test_check_prints_rule_section_field_and_fails(tmp_path, capsys):
    bad = tmp_path / "bad.fkc.md"
    text = SEED.read_text().replace("ggml_dtype: Q4K ", "ggml_dtype: Q4_K_M ")
    bad.write_text(text.replace('flops: "n"', 'flops: "n **"'))
    assert main(["kernels", "--check", str(SEED), str(bad)]) == 1
    out = capsys.readouterr().out
    assert "QuantIncoherent" in out and "[dequant_q4_km] accept.inputs[0].fdx.quant.ggml_dtype" in out
    assert "CostExprInvalid" in out and "cost.flops" in out
    assert main(["kernels", "--check", str(bad), "--json"]) == 1
    (report,) = json.loads(capsys.readouterr().out)
    rules = {(e["rule"], e["section"], e["field"]) for e in report["errors"]}
    assert ("QuantIncoherent", "dequant_q4_km", "accept.inputs[0].fdx.quant.ggml_dtype") in rules
    assert all(e["line"] > 0 for e in report["errors"])


def test_listing_exits_nonzero_when_a_package_contract_is_broken(tmp_path, monkeypatch, capsys):
    bad = SEED.read_text().replace("ggml_dtype: Q4K ", "ggml_dtype: Q4_K_M ")
    (tmp_path / "broken.fkc.md").write_text(bad)
    monkeypatch.setattr(registry_mod, "KERNELS_DIR", tmp_path)
    assert main(["kernels"]) == 1
    assert "QuantIncoherent" in capsys.readouterr().out
