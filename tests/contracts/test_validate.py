"""Every validator rule, each fed a deliberately broken contract, reports that rule by name with
its section and field; the seed's contracts and ours validate clean."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import yaml

from minfer.contracts.parser import parse_file
from minfer.contracts.registry import KERNELS_DIR, contract_files
from minfer.contracts.validate import RULES, check_file

SEED = Path(__file__).parent / "data" / "seed004.fkc.md"
HEADER = {"fkc_version": 1, "provider": {"name": "test", "backend": "CUDA", "kernel_source": "triton"}}


def _ours() -> dict:
    """A registrable section known to be valid: our add_f32 contract."""
    return copy.deepcopy(parse_file(KERNELS_DIR / "triton" / "elementwise.fkc.md").sections[0].raw)


def _seed(i: int = 0) -> dict:
    """A describe-only section of the seed (Vulkan, registrable: false)."""
    return copy.deepcopy(parse_file(SEED).sections[i].raw)


def _text(sections: list[dict], header: dict | None = None) -> str:
    head = yaml.safe_dump(header or HEADER, sort_keys=False)
    body = "".join(
        f"## s{i}\n```fkc\n{yaml.safe_dump(s, sort_keys=False)}```\n" for i, s in enumerate(sections)
    )
    return f"---\n{head}---\n# test contracts\n{body}"


def _errors(tmp_path, text: str):
    p = tmp_path / "t.fkc.md"
    p.write_text(text)
    return check_file(p)[1]


def _seed_header() -> dict:
    return {"fkc_version": 1, "provider": {"name": "s", "backend": "Vulkan", "kernel_source": "vulkan-slang"}}


def _set(d: dict, path: str, value) -> dict:
    """d with the dotted path (list indices as numbers) set to value; value None deletes."""
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    node = d
    for k in keys[:-1]:
        node = node[k]
    if value is None:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return d


def _input_x(**changes) -> dict:
    return _set(_ours(), "accept.inputs.0", {**_ours()["accept"]["inputs"][0], **changes})


def _fdx_quant(**quant) -> dict:
    base = {"family": "GGML_BLOCK", "ggml_dtype": "Q4_0", "role": "weight", "scale_operand": None}
    return {"requires_ext": True, "quant": {**base, **quant}}


def _seed_quant(**quant) -> dict:
    return _set(_seed(), "accept.inputs.0.fdx", _fdx_quant(**quant))


# rule -> (broken file text, field the error must name)
CASES = {
    "UnknownField": (_text([_set(_ours(), "colour", "red")]), "colour"),
    "MissingField": (_text([_set(_ours(), "blurb", None)]), "blurb"),
    "FieldType": (_text([_set(_ours(), "registrable", "yes")]), "registrable"),
    "EnumValue": (_text([_set(_ours(), "determinism", "sometimes")]), "determinism"),
    "VersionUnsupported": (_text([_ours()], {**HEADER, "fkc_version": 2}), "fkc_version"),
    "ProviderMismatch": (_text([_seed()], HEADER), "backend"),
    "KernelNameInvalid": (_text([_set(_ours(), "kernel", "add-f32")]), "kernel"),
    "DuplicateKernel": (_text([_ours(), _ours()]), "kernel"),
    "OpKindXorFusedOp": (_text([_set(_ours(), "fused_op", "SwiGLU")]), "op_kind"),
    "RevisionHashInvalid": (
        _text([_set(_ours(), "kernel_revision_hash", "not-hex")]), "kernel_revision_hash"
    ),
    "DuplicateName": (_text([_set(_ours(), "accept.inputs.1.name", "x")]), "accept.inputs[1].name"),
    "UnknownDType": (_text([_set(_ours(), "accept.inputs.0.dtypes", ["F33"])]), "accept.inputs[0].dtypes"),
    "LayoutIncoherent": (
        _text([_set(_ours(), "accept.inputs.0.layout.strided", "required")]),
        "accept.inputs[0].layout.strided",
    ),
    "QuantIncoherent": (
        _text([_seed_quant(ggml_dtype="Q4_K_M")], _seed_header()), "accept.inputs[0].fdx.quant.ggml_dtype"
    ),
    "ScaleNotInline": (
        _text([_seed_quant(scale_operand="d")], _seed_header()),
        "accept.inputs[0].fdx.quant.scale_operand",
    ),
    "ScaleOperandUnknown": (
        _text([_seed_quant(family="AFFINE_FLOAT", ggml_dtype=None, scale_operand="nope")], _seed_header()),
        "accept.inputs[0].fdx.quant.scale_operand",
    ),
    "PredicateInvalid": (_text([_input_x(shape_constraint="n ==")]), "accept.inputs[0].shape_constraint"),
    "PredicateUnknownSymbol": (
        _text([_input_x(shape_constraint="divisible(q, 32)")]),
        "accept.inputs[0].shape_constraint",
    ),
    "CostExprInvalid": (_text([_set(_ours(), "cost.flops", "n ** 2")]), "cost.flops"),
    "CostUnknownSymbol": (_text([_set(_ours(), "cost.bytes_moved", "n * bogus")]), "cost.bytes_moved"),
    "DTypeRuleInvalid": (
        _text([_set(_ours(), "return.outputs.0.dtype_rule", "like(x)")]),
        "return.outputs[0].dtype_rule",
    ),
    "ShapeRuleInvalid": (
        _text([_set(_ours(), "return.outputs.0.shape_rule", "same_as(nothing)")]),
        "return.outputs[0].shape_rule",
    ),
    "OverheadIncoherent": (_text([_set(_ours(), "cost.overhead_ns", 100)]), "cost.overhead_ns"),
    "ToleranceInvalid": (_text([_set(_ours(), "precision.max_relative", -1)]), "precision.max_relative"),
    "DeterminismIncoherent": (
        _text([_set(_ours(), "determinism", "nondeterministic")]),
        "precision.bit_stable_on_same_hardware",
    ),
    "AliasingIncoherent": (_text([_set(_ours(), "return.outputs.0.aliasing", "in_place")]), "caps.in_place"),
    "AlignmentInvalid": (_text([_set(_ours(), "caps.alignment_bytes", 3)]), "caps.alignment_bytes"),
    "UnknownCapability": (_text([_set(_ours(), "caps.also", ["telepathy"])]), "caps.also"),
    "BackendUnsupported": (
        _text(
            [_set(_set(_seed(), "registrable", True), "entry_point", "minfer.kernels.triton.dequant:dequant")],
            _seed_header(),
        ),
        "kernel_source",  # Vulkan is a backend we run, but through WGSL: the seed's "vulkan-slang" is refused
    ),
    "UnknownOpKind": (_text([_set(_ours(), "op_kind", "Frobnicate")]), "op_kind"),
    "OpSignatureMismatch": (_text([_set(_ours(), "accept.inputs.0.name", "a")]), "accept.inputs"),
    "EntryPointUnresolved": (
        _text([_set(_ours(), "entry_point", "minfer.kernels.triton.elementwise:nope")]), "entry_point"
    ),
    "EntryPointSignature": (
        _text([_set(_ours(), "entry_point", "minfer.kernels.triton.elementwise:silu_f32")]),  # silu_f32 takes no y
        "entry_point",
    ),
    "ToleranceMissing": (
        _text([_set(_set(_ours(), "precision.max_relative", None), "precision.max_absolute", None)]),
        "precision",
    ),
}

# rules of the parse layer (test_parser.py feeds each its damaged file); listed so that the
# coverage check below sees every rule exercised
PARSE_RULES = {
    "FileUnreadable", "FrontMatterMissing", "YamlSyntax", "DuplicateField", "FenceUnclosed", "NoSections"
}


def test_every_rule_has_a_broken_contract():
    assert set(CASES) | PARSE_RULES == set(RULES)


def test_q8_in_comes_with_its_passes(tmp_path):
    """A launcher that takes int8 activations names the function that makes them, and only then."""
    errors = _errors(tmp_path, _text([_set(_ours(), "caps.also", ["q8_in"])]))
    assert ("UnknownCapability", "caps.q8_passes") in [(e.rule, e.field) for e in errors]
    errors = _errors(tmp_path, _text([_set(_ours(), "caps.q8_passes", "minfer.kernels.triton.qmatmul:q8_passes")]))
    assert ("UnknownCapability", "caps.q8_passes") in [(e.rule, e.field) for e in errors]


def test_bases_are_clean(tmp_path):
    assert _errors(tmp_path, _text([_ours()])) == []
    assert _errors(tmp_path, _text([_seed()], _seed_header())) == []


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule(rule, tmp_path):
    text, field = CASES[rule]
    errors = _errors(tmp_path, text)
    hits = [e for e in errors if e.rule == rule]
    assert hits, f"{rule} not reported; got {[str(e) for e in errors]}"
    assert any(e.field == field for e in hits), [str(e) for e in hits]
    e = hits[0]
    assert e.section and e.reason and str(e).startswith(f"{rule}: [")
    assert getattr(e, "line", 0) > 0  # points into the file


def test_seed_validates_clean_as_describe_only():
    cf, errors = check_file(SEED)
    assert errors == []
    assert len(cf.sections) == 6 and not any(s.registrable for s in cf.sections)


def test_seed_with_q4_k_m_is_quant_incoherent(tmp_path):
    text = SEED.read_text()
    assert text.count("ggml_dtype: Q4K ") == 1
    bad = tmp_path / "seed_q4km.fkc.md"
    bad.write_text(text.replace("ggml_dtype: Q4K ", "ggml_dtype: Q4_K_M "))
    errors = check_file(bad)[1]
    assert [(e.rule, e.section, e.field) for e in errors] == [
        ("QuantIncoherent", "dequant_q4_km", "accept.inputs[0].fdx.quant.ggml_dtype")
    ]
    assert "Q4K" in errors[0].reason  # says which storage type to write


@pytest.mark.parametrize("spelling", ["Q4_K", "q4k", "Q4_K_S", "IQ2_XXS"])
def test_other_non_storage_spellings(spelling, tmp_path):
    errors = _errors(tmp_path, _text([_seed_quant(ggml_dtype=spelling)], _seed_header()))
    assert [e.rule for e in errors] == ["QuantIncoherent"]


def test_ggml_dtype_list_extension(tmp_path):
    ok = _seed_quant(ggml_dtype=["Q4_0", "Q8_0", "Q6K", "F16"])
    assert _errors(tmp_path, _text([ok], _seed_header())) == []
    bad = _seed_quant(ggml_dtype=["Q4_0", "Q4_K_M"])
    assert [e.rule for e in _errors(tmp_path, _text([bad], _seed_header()))] == ["QuantIncoherent"]


def test_describe_only_sections_are_not_imported(tmp_path):
    sec = _set(_seed(), "entry_point", "no_such_module_anywhere:fn")
    assert _errors(tmp_path, _text([sec], _seed_header())) == []


def test_our_contracts_validate_clean():
    files = contract_files()
    families = ("triton/elementwise", "triton/dequant", "triton/embed", "triton/quantize", "triton/q4_0", "wgsl/matmul",
                "cpu/vnni", "sample")
    assert {f.relative_to(KERNELS_DIR).as_posix() for f in files} >= {f"{n}.fkc.md" for n in families}
    for f in files:
        cf, errors = check_file(f)
        assert errors == [], [str(e) for e in errors]
        assert cf.sections and all(s.registrable for s in cf.sections)


DOC = Path(__file__).resolve().parents[2] / "docs" / "KERNEL-CONTRACTS.md"


def test_docs_list_every_rule():
    text = DOC.read_text()
    missing = [rule for rule in RULES if f"| `{rule}` |" not in text]
    assert not missing, f"docs/KERNEL-CONTRACTS.md lacks rules {missing}"


def test_docs_worked_example_is_valid_but_for_its_launcher(tmp_path, monkeypatch):
    """The docs' example contract, with the op kind its step 1 adds, validates except for the
    launcher module the example has not written."""
    from minfer.contracts import ops

    example = DOC.read_text().split("````\n", 2)[1]
    assert [e.rule for e in _errors(tmp_path, example) if e.field == "op_kind"] == ["UnknownOpKind"]
    spec = ops.OpSpec("LayerNorm", False, ("x", "w"), ("eps",), ("rows", "n"), "layer norm",
                      lambda s, p: {"rows": 1, "n": s["x"][-1]})
    monkeypatch.setitem(ops.OPS, "LayerNorm", spec)
    errors = _errors(tmp_path, example)
    assert [(e.rule, e.field) for e in errors] == [("EntryPointUnresolved", "entry_point")]


def test_entry_point_without_triton_says_how_to_install(monkeypatch):
    from minfer.contracts.validate import resolve_entry_point

    monkeypatch.delitem(sys.modules, "minfer.kernels.triton.rope", raising=False)  # imported again, without triton
    monkeypatch.setitem(sys.modules, "triton", None)  # as on a machine without triton
    with pytest.raises(ValueError, match=r"pip install 'minfer\[gpu\]'"):
        resolve_entry_point("minfer.kernels.triton.rope:rope")


@pytest.mark.parametrize("entry, why", [
    ("this:s", "outside minfer's kernel package"),  # (importing it prints the Zen of Python)
    ("os:system", "outside minfer's kernel package"),
    ("minfer.api:load", "outside minfer's kernel package"),
    ("minfer.kernels.nothing_here:fn", "no such module"),
    ("minfer.kernels..rope:rope", "dotted Python names"),
    ("minfer.kernels.triton.rope:rope; import os", "dotted Python names"),
])
def test_a_contract_file_cannot_import_outside_the_kernel_package(tmp_path, entry, why, capsys):
    """`minfer kernels --check FILE` on a contract naming another module: a validation error
    saying why, and the module is never imported."""
    from minfer.cli import main

    module = entry.partition(":")[0]
    was = module in sys.modules
    ours = _ours()
    for sec in (_set(ours, "entry_point", entry),
                _set(ours, "accept.inputs.0", {**ours["accept"]["inputs"][0], "load_layout": entry})):
        path = tmp_path / "outside.fkc.md"
        path.write_text(_text([sec]))
        assert main(["kernels", "--check", str(path)]) == 1
        out = capsys.readouterr().out
        assert "EntryPointUnresolved" in out and why in out
    assert (module in sys.modules) == was  # nothing imported
    assert "Beautiful is better than ugly" not in out
