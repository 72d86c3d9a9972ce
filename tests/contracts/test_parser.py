"""The FKC parser on the seed's contracts (tests/contracts/data/seed004.fkc.md: seed 004 with its
YAML nesting restored by hand) and on damaged files."""

from __future__ import annotations

from pathlib import Path

from minfer.contracts.parser import parse_file, parse_text

DATA = Path(__file__).parent / "data"
SEED = DATA / "seed004.fkc.md"
HEADER = "---\nfkc_version: 1\nprovider:\n  name: t\n  backend: CUDA\n  kernel_source: triton\n---\n"


def test_seed_parses_into_typed_sections():
    cf = parse_file(SEED)
    assert cf.parse_errors == ()
    assert cf.fkc_version == 1
    assert cf.provider.name == "fuel-vulkan-kernels"
    assert cf.provider.backend == "Vulkan" and cf.provider.revision_base == "git:f41137b4"
    names = [s.kernel for s in cf.sections]
    assert names == [
        "dequant_q4_0", "dequant_q8_0", "dequant_q4_km", "qmatvec_q4_0", "matmul_q4_0_tiled", "quantize_q8_0"
    ]
    q4km = cf.sections[2]
    assert q4km.op_kind == "DequantizeQ4KM" and q4km.fused_op is None and not q4km.registrable
    w = q4km.inputs[0]
    assert w.dtypes == ("U8",) and w.ranks == (1,) and w.layout["contiguous"] == "required"
    assert w.quant.family == "GGML_BLOCK" and w.quant.ggml_dtypes == ("Q4K",)
    assert w.quant.scale_operand is None
    assert q4km.cost.bytes_moved == "n * 0.5625 + n * 4" and q4km.cost.overhead_ns is None
    assert q4km.cost.memory == {"device_bytes": "n * 4", "host_bytes": 0, "disk_bytes": 0}
    assert q4km.location.heading.startswith("dequant_q4_km (GGML Q4_K_M")


def test_seed_fused_sections_and_fast_paths():
    cf = parse_file(SEED)
    gemv, tiled = cf.sections[3], cf.sections[4]
    assert gemv.fused_op == "QMATMUL" and gemv.op_kind is None and gemv.op == "QMATMUL"
    assert [f.name for f in gemv.op_fields] == ["quant_type", "k", "n"]
    assert gemv.op_fields[1].constraint == "k % 32 == 0 && == a.dim[-1]"
    assert gemv.caps.fast_paths[0].when == "m == 1" and tiled.caps.fast_paths[0].when == "m > 1"
    assert gemv.inputs[1].shape_constraint == "divisible(k, 32)"
    assert gemv.determinism == "nondeterministic" and not gemv.precision.bit_stable_on_same_hardware
    assert tiled.outputs[0].shape_rule == "matmul(a, w_q)"
    q8 = cf.sections[5]
    assert q8.outputs[0].fdx.quant.ggml_dtypes == ("Q8_0",) and q8.outputs[0].fdx.quant.role == "activation"


def test_line_numbers_point_into_the_file():
    cf = parse_file(SEED)
    lines = SEED.read_text().splitlines()
    sec = cf.sections[2]
    assert lines[sec.location.line - 1] == "kernel: dequant_q4_km"
    line = sec.line_of("accept.inputs[0].fdx.quant.ggml_dtype")
    assert lines[line - 1].strip().startswith("ggml_dtype: Q4K")
    assert lines[sec.line_of("cost.flops") - 1].strip().startswith("flops:")
    # an absent field falls back to its nearest present parent
    assert sec.line_of("cost.nonexistent") == sec.line_of("cost")


def test_yaml_syntax_error_is_collected_with_its_line():
    text = HEADER + "## a\n```fkc\nkernel: a\nblurb: [unclosed\n```\n## b\n```fkc\nkernel: b\n```\n"
    cf = parse_text(text, "x.fkc.md")
    assert [s.kernel for s in cf.sections] == ["b"]  # the bad block does not hide the good one
    (err,) = cf.parse_errors
    assert err.rule == "YamlSyntax" and err.section == "a" and err.line >= 10


def test_damaged_files():
    rules = lambda text: [e.rule for e in parse_text(text).parse_errors]  # noqa: E731
    assert rules("kernel: x\n") == ["FrontMatterMissing"]
    assert rules("---\nfkc_version: 1\n") == ["FrontMatterMissing"]
    assert rules(HEADER + "```fkc\nkernel: a\n") == ["FenceUnclosed"]
    assert rules(HEADER + "no sections here\n") == ["NoSections"]
    assert rules(HEADER + "```fkc\nkernel: a\nkernel: b\n```\n") == ["DuplicateField"]
    assert rules(HEADER + "```fkc\n- a\n- b\n```\n") == ["FieldType"]
    bomb = "a: &x [1, 2]\nb: [*x, *x]\n"
    assert rules(HEADER + "```fkc\n" + bomb + "```\n") == ["YamlSyntax"]  # aliases are refused


def test_unreadable_and_oversized_files(tmp_path):
    cf = parse_file(tmp_path / "missing.fkc.md")
    assert [e.rule for e in cf.parse_errors] == ["FileUnreadable"]
    big = tmp_path / "big.fkc.md"
    big.write_bytes(b"#" * ((1 << 20) + 1))
    assert [e.rule for e in parse_file(big).parse_errors] == ["FileUnreadable"]
    bad = tmp_path / "bad.fkc.md"
    bad.write_bytes(b"---\n\xff\xfe\n---\n")
    assert [e.rule for e in parse_file(bad).parse_errors] == ["FileUnreadable"]
