"""Validate parsed FKC contracts. Every check is a named rule; every failure a `ContractError`.

`RULES` lists each rule with what it enforces (docs/KERNEL-CONTRACTS.md prints the same
list). Rules run in three layers:

1. parse rules (parser.py): the file, its front matter and fences, YAML syntax;
2. structural rules: the raw YAML against the field spec of schema.py (unknown, missing,
   mistyped fields, enum values);
3. semantic rules on the typed sections: quant coherence, expressions, symbols, dtype/shape
   rules, layout, precision; and for `registrable: true` sections the binding rules (known op
   kind, CPU/CUDA backend, importable entry point whose signature takes the op's arguments).

`registrable: false` sections are describe-only: their entry point is never imported and any
backend / op-kind token is allowed, but everything else must still hold.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ContractError
from .expr import ExprError, is_finite_number, parse_arith, parse_pred
from .ops import CAPABILITIES, CONVENTIONAL_DIMS, DTYPES, OPS, STORAGE_TYPES, op_spec
from .parser import HEADER_SECTION, parse_file
from .rules import same_as_target, split_call
from .schema import HEADER, LAYOUT_KEYS, SECTION, ContractFile, KernelContract, Spec

FKC_VERSION = 1
REGISTRABLE_BACKENDS = {"CUDA": ("triton", "torch"), "CPU": ("torch", "c"), "Vulkan": ("wgsl",)}

RULES: dict[str, str] = {
    # parse
    "FileUnreadable": "the file cannot be read as UTF-8 text of at most 1 MiB",
    "FrontMatterMissing": "the file starts with a '---' YAML front matter closed by '---'",
    "YamlSyntax": "the front matter and every fkc block are valid YAML without anchors/aliases",
    "DuplicateField": "no YAML mapping repeats a key",
    "FenceUnclosed": "every ```fkc fence is closed by a ``` line",
    "NoSections": "the file holds at least one ```fkc section",
    # structural
    "UnknownField": "every field is one of the FKC field set at its place (typos are errors)",
    "MissingField": "required fields are present",
    "FieldType": "every field has its YAML type (string, bool, int, list, mapping, rank, tolerance)",
    "EnumValue": "enum fields take one of their listed values",
    # semantic, every section
    "VersionUnsupported": f"front matter fkc_version is {FKC_VERSION}",
    "ProviderMismatch": "a section's backend and kernel_source equal the provider's",
    "KernelNameInvalid": "kernel is an identifier ([A-Za-z_][A-Za-z0-9_]*)",
    "DuplicateKernel": "kernel names are unique within a file (and across the registry)",
    "OpKindXorFusedOp": "a section names exactly one of op_kind and fused_op",
    "RevisionHashInvalid": "kernel_revision_hash is 'auto' or 7..64 hex digits",
    "DuplicateName": "input names are unique, output names are unique",
    "UnknownDType": "dtypes entries and fixed(...) dtype rules name contract dtypes (F32, U8, ...); a dtypes "
    "entry may also be same_as(an earlier input)",
    "LayoutIncoherent": "only contiguous may be 'required'; contiguous is never 'rejected'; "
    "requires_contiguous goes with every input contiguous: required",
    "QuantIncoherent": "fdx.quant.ggml_dtype is a ggml storage type spelled as in minfer.quant.types "
    "(Q4K, never Q4_K_M or Q4_K); GGML_BLOCK needs ggml_dtype and no granularity; other families "
    "have no ggml_dtype; a quant operand is a U8 stream with requires_ext: true",
    "ScaleNotInline": "GGML_BLOCK scales are INLINE in the blocks, so scale_operand is ~",
    "ScaleOperandUnknown": "a non-GGML quant's scale_operand names another input",
    "PredicateInvalid": "shape_constraint and fast_paths[].when parse as predicates",
    "PredicateUnknownSymbol": "predicates name only the op's dims and declared op_params fields",
    "CostExprInvalid": "cost.flops, cost.bytes_moved and cost.memory.* parse as arithmetic",
    "CostUnknownSymbol": "cost expressions name only the op's dims and declared op_params fields",
    "DTypeRuleInvalid": "dtype_rule is fixed(DTYPE), same_as(input), dequant(quant input) or param(field)",
    "ShapeRuleInvalid": "shape_rule is same_as(input), matmul(input, input), leading(input, expr) or "
    "from_params(expr, ...), naming declared inputs and symbols",
    "OverheadIncoherent": "overhead_ns is ~ under provenance judge_measured (the judge measures it) "
    "and a non-negative number under analytic",
    "ToleranceInvalid": "tolerances are non-negative numbers or maps from output dtype to one",
    "DeterminismIncoherent": "bit_stable_on_same_hardware is true exactly when determinism is not "
    "nondeterministic",
    "AliasingIncoherent": "an output with aliasing in_place goes with caps.in_place: true and back",
    "AlignmentInvalid": "alignment_bytes is a power of two; access_granularity_bits is 8, 16, 32, 64 or 128",
    # semantic, registrable sections only
    "BackendUnsupported": "a registrable section's backend is CUDA (triton or torch), CPU (torch) or Vulkan (wgsl)",
    "UnknownOpKind": "a registrable section's op_kind / fused_op is in minfer.contracts.ops",
    "OpSignatureMismatch": "a registrable section's inputs are the op's inputs, in order, and its "
    "op_params fields are among the op's params",
    "EntryPointUnresolved": "a registrable entry_point (and every load_layout) is 'module:attr' of a module of "
    "minfer.kernels, imports, and is callable",
    "EntryPointSignature": "the launcher accepts every input and param of the op, and the keywords of every "
    "capability in caps.also, as keywords",
    "UnknownCapability": "caps.also names capabilities of minfer.contracts.ops CAPABILITIES; q8_in comes with "
    "caps.q8_passes ('module:function') and q8_passes only with q8_in",
    "ToleranceMissing": "a registrable section declares max_relative or max_absolute "
    "(the conformance harness and the judge compare with it)",
}

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_HEX = re.compile(r"[0-9a-f]{7,64}\Z")
_MIX_SUFFIX = re.compile(r"(.+?)_(XXS|XS|S|M|L)\Z")


@dataclass
class _Report:
    """Collects errors of one section (or the front matter) with their line numbers."""

    section: str
    line_of: Callable[[str], int]
    path: str
    errors: list[ContractError]

    def __call__(self, rule: str, field: str, reason: str) -> None:
        assert rule in RULES, rule
        line = self.line_of(field)
        e = ContractError(rule, self.section, field, f"{reason} ({self.path}:{line})")
        e.line = line
        self.errors.append(e)


# ---- structural ---------------------------------------------------------------------------------


def _type_name(v: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a bool", type(None): "~"}.get(
        type(v), type(v).__name__
    )


def _type_ok(v: Any, spec: Spec) -> str | None:
    """None if `v` has the YAML type `spec.kind` wants, else what was expected."""
    k = spec.kind
    ok = {
        "str": lambda: isinstance(v, str) and v.strip() != "",
        "bool": lambda: isinstance(v, bool),
        "int": lambda: isinstance(v, int) and not isinstance(v, bool),
        "number?": lambda: v is None or (is_finite_number(v) and v >= 0),
        "expr": lambda: isinstance(v, str) or is_finite_number(v),
        "enum": lambda: isinstance(v, str),
        "strs": lambda: (isinstance(v, str) and v != "")
        or (isinstance(v, list) and v != [] and all(isinstance(x, str) for x in v)),
        "rank": lambda: v == "any"
        or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 8)
        or (isinstance(v, list) and v != [] and all(type(x) is int and 0 <= x <= 8 for x in v)),
        "tolerance": lambda: True,  # checked by ToleranceInvalid
        "scalar": lambda: v is None or isinstance(v, (str, int, float)),
        "map": lambda: isinstance(v, dict),
        "list": lambda: isinstance(v, list),
        "dict": lambda: isinstance(v, dict) and all(isinstance(x, str) for x in v),
    }[k]()
    if ok:
        return None
    return {
        "str": "a non-empty string",
        "bool": "true or false",
        "int": "an integer",
        "number?": "~ or a non-negative number",
        "expr": "an expression string or a number",
        "enum": f"one of {', '.join(spec.values)}",
        "strs": "a name or a non-empty list of names",
        "rank": "a rank 0..8, a list of ranks, or 'any'",
        "scalar": "~, a name or a number",
        "map": "a mapping",
        "list": "a list",
        "dict": "a mapping from names",
    }[k]


def _walk(v: Any, spec: Spec, path: str, report: _Report) -> None:
    expected = _type_ok(v, spec)
    if expected:
        report("FieldType", path, f"expected {expected}, found {_type_name(v)} {v!r:.60}")
        return
    if spec.kind == "enum" and v not in spec.values:
        report("EnumValue", path, f"{v!r} is not one of {', '.join(spec.values)}")
    elif spec.kind == "map":
        for key in v:
            if key not in spec.fields:
                sub = f"{path}.{key}" if path else str(key)
                report("UnknownField", sub, f"unknown field {key!r}; allowed here: {', '.join(spec.fields)}")
        for key, sub_spec in spec.fields.items():
            sub = f"{path}.{key}" if path else key
            if key in v:
                _walk(v[key], sub_spec, sub, report)
            elif sub_spec.required:
                report("MissingField", sub, f"required field {key!r} is missing")
    elif spec.kind == "list":
        for i, item in enumerate(v):
            _walk(item, spec.item, f"{path}[{i}]", report)
    elif spec.kind == "dict":
        for key, item in v.items():
            _walk(item, spec.item, f"{path}.{key}", report)


# ---- semantic helpers ---------------------------------------------------------------------------


def declared_symbols(sec: KernelContract) -> frozenset[str]:
    """Symbols a section's formulas may name: its declared op_params fields, plus the dims of its
    op kind (registrable sections) or the conventional dims and those of its op kind if minfer
    knows it (describe-only sections, whose op tokens come from other providers)."""
    spec = op_spec(sec.op) if sec.op else None
    dims = frozenset(spec.dims) if spec else frozenset()
    if not sec.registrable:
        dims |= CONVENTIONAL_DIMS
    return dims | {f.name for f in sec.op_fields}


def _storage_hint(name: str) -> str:
    """Why `name` is not a storage type, with the spelling to use where one is obvious."""
    upper = name.upper()
    for q in STORAGE_TYPES:
        if upper.replace("_", "") == q.replace("_", "") and upper != q:
            return f"{name!r} is not the contract spelling; write {q}"
    m = _MIX_SUFFIX.match(upper)
    if m and m.group(1).replace("_", "") in {q.replace("_", "") for q in STORAGE_TYPES}:
        store = next(q for q in STORAGE_TYPES if q.replace("_", "") == m.group(1).replace("_", ""))
        return f"{name!r} is a GGUF file mix, not a storage type; its blocks are {store}"
    return f"{name!r} is not a ggml storage type; known: {', '.join(STORAGE_TYPES)}"


# ---- semantic rules -----------------------------------------------------------------------------


def _check_identity(sec: KernelContract, report: _Report, provider) -> None:
    if not _IDENT.match(sec.kernel):
        report("KernelNameInvalid", "kernel", f"{sec.kernel!r} is not an identifier")
    if bool(sec.op_kind) == bool(sec.fused_op):
        found = "both" if sec.op_kind else "neither"
        report("OpKindXorFusedOp", "op_kind", f"name exactly one of op_kind and fused_op, found {found}")
    h = sec.kernel_revision_hash
    if h != "auto" and not _HEX.match(h):
        report("RevisionHashInvalid", "kernel_revision_hash", f"{h!r} is neither 'auto' nor 7..64 hex digits")
    if provider is not None:
        for key in ("backend", "kernel_source"):
            mine, theirs = getattr(sec, key), getattr(provider, key)
            if mine and theirs and mine != theirs:
                report("ProviderMismatch", key, f"{mine!r} differs from the provider's {theirs!r}")


def _check_operands(sec: KernelContract, report: _Report) -> None:
    for kind, items in (("accept.inputs", sec.inputs), ("return.outputs", sec.outputs)):
        seen: set[str] = set()
        for i, item in enumerate(items):
            if item.name in seen:
                report("DuplicateName", f"{kind}[{i}].name", f"name {item.name!r} appears twice")
            seen.add(item.name)
    all_contig = True
    for i, inp in enumerate(sec.inputs):
        base = f"accept.inputs[{i}]"
        earlier = {x.name for x in sec.inputs[:i]}
        for dt in inp.dtypes:
            if dt not in DTYPES and same_as_target(dt) not in earlier:
                report(
                    "UnknownDType",
                    f"{base}.dtypes",
                    f"{dt!r} is neither one of {', '.join(DTYPES)} nor same_as(an earlier input)",
                )
        lay = inp.layout
        for key in LAYOUT_KEYS:
            if key != "contiguous" and lay.get(key) == "required":
                report("LayoutIncoherent", f"{base}.layout.{key}", "only contiguous may be 'required'")
        if lay.get("contiguous") == "rejected":
            report("LayoutIncoherent", f"{base}.layout.contiguous", "contiguous inputs cannot be rejected")
        if lay.get("contiguous") == "required" and lay.get("strided") == "supported":
            report("LayoutIncoherent", f"{base}.layout.strided", "strided 'supported', contiguous 'required'")
        all_contig &= lay.get("contiguous") == "required"
    if sec.caps.awkward_layout_strategy == "requires_contiguous" and not all_contig:
        report(
            "LayoutIncoherent",
            "caps.awkward_layout_strategy",
            "requires_contiguous but some input does not declare contiguous: required",
        )
    names = {i.name for i in sec.inputs}
    for kind, items in (("accept.inputs", sec.inputs), ("return.outputs", sec.outputs)):
        for i, item in enumerate(items):
            if item.fdx and item.fdx.quant:
                _check_quant(item, getattr(item, "dtypes", ()), f"{kind}[{i}]", names, report)


def _check_quant(item, dtypes: tuple[str, ...], base: str, input_names: set[str], report: _Report) -> None:
    q = item.fdx.quant
    path = f"{base}.fdx.quant"
    if not item.fdx.requires_ext:
        report("QuantIncoherent", f"{base}.fdx.requires_ext", "a quant operand needs requires_ext: true")
    if dtypes and tuple(dtypes) != ("U8",):
        report("QuantIncoherent", f"{base}.dtypes", f"a quant block stream is [U8], found {list(dtypes)}")
    if q.family == "GGML_BLOCK":
        if not q.ggml_dtypes:
            report("QuantIncoherent", f"{path}.ggml_dtype", "GGML_BLOCK needs the ggml storage type")
        for name in q.ggml_dtypes:
            if name not in STORAGE_TYPES:
                report("QuantIncoherent", f"{path}.ggml_dtype", _storage_hint(name))
        if q.granularity is not None:
            report("QuantIncoherent", f"{path}.granularity", "GGML_BLOCK's grain rides ggml_dtype")
        if q.scale_operand is not None:
            report(
                "ScaleNotInline",
                f"{path}.scale_operand",
                f"GGML_BLOCK scales are INLINE in each block: scale_operand is ~, not {q.scale_operand!r}",
            )
    elif q.family:
        if q.ggml_dtypes:
            report("QuantIncoherent", f"{path}.ggml_dtype", f"{q.family} carries no ggml_dtype")
        if q.scale_operand not in input_names - {item.name}:
            report(
                "ScaleOperandUnknown",
                f"{path}.scale_operand",
                f"{q.scale_operand!r} is not another input of this section",
            )


def _check_exprs(sec: KernelContract, report: _Report) -> None:
    symbols = declared_symbols(sec)
    allowed = ", ".join(sorted(symbols))

    def pred(text: str | None, field: str) -> None:
        if text is None:
            return
        try:
            e = parse_pred(text)
        except ExprError as err:
            report("PredicateInvalid", field, str(err))
            return
        for s in sorted(e.symbols - symbols):
            report("PredicateUnknownSymbol", field, f"{s!r} is not declared (allowed: {allowed})")

    for i, inp in enumerate(sec.inputs):
        pred(inp.shape_constraint, f"accept.inputs[{i}].shape_constraint")
    for i, fp in enumerate(sec.caps.fast_paths):
        pred(fp.when, f"caps.fast_paths[{i}].when")
    cost = [("cost.flops", sec.cost.flops), ("cost.bytes_moved", sec.cost.bytes_moved)]
    cost += [(f"cost.memory.{k}", v) for k, v in sec.cost.memory.items()]
    for field, text in cost:
        if text is None or isinstance(text, bool) or not isinstance(text, (str, int, float)):
            continue  # absent or mistyped: structural rules already spoke
        try:
            e = parse_arith(text)
        except ExprError as err:
            report("CostExprInvalid", field, str(err))
            continue
        for s in sorted(e.symbols - symbols):
            report("CostUnknownSymbol", field, f"{s!r} is not declared (allowed: {allowed})")


def _check_rules(sec: KernelContract, report: _Report) -> None:
    """dtype_rule / shape_rule of every output."""
    inputs = {i.name: i for i in sec.inputs}
    params = {f.name for f in sec.op_fields}
    spec = op_spec(sec.op) if sec.op else None
    if spec:
        params |= set(spec.params)
    symbols = declared_symbols(sec)
    for i, out in enumerate(sec.outputs):
        base = f"return.outputs[{i}]"
        call = split_call(out.dtype_rule)
        field = f"{base}.dtype_rule"
        forms = "fixed(DTYPE), same_as(input), dequant(quant input) or param(field)"
        if not call or len(call[1]) != 1:
            report("DTypeRuleInvalid", field, f"{out.dtype_rule!r} is not one of {forms}")
        else:
            fn, (arg,) = call
            if fn == "fixed":
                if arg not in DTYPES:
                    report("UnknownDType", field, f"{arg!r} is not one of {', '.join(DTYPES)}")
            elif fn == "same_as" and arg not in inputs:
                report("DTypeRuleInvalid", field, f"{arg!r} is not an input")
            elif fn == "dequant" and (arg not in inputs or inputs[arg].quant is None):
                report("DTypeRuleInvalid", field, f"{arg!r} is not a quant input")
            elif fn == "param" and arg not in params:
                report("DTypeRuleInvalid", field, f"{arg!r} is not an op_params field")
            elif fn not in ("fixed", "same_as", "dequant", "param"):
                report("DTypeRuleInvalid", field, f"{fn}() is not one of {forms}")
        call = split_call(out.shape_rule)
        field = f"{base}.shape_rule"
        if not call:
            report("ShapeRuleInvalid", field, f"{out.shape_rule!r} is not a rule call")
            continue
        fn, args = call
        if fn == "same_as" and (len(args) != 1 or args[0] not in inputs):
            report("ShapeRuleInvalid", field, f"same_as() takes one input name, found {args}")
        elif fn == "matmul" and (len(args) != 2 or not set(args) <= set(inputs)):
            report("ShapeRuleInvalid", field, f"matmul() takes two input names, found {args}")
        elif fn == "leading" and (len(args) != 2 or args[0] not in inputs):
            report("ShapeRuleInvalid", field, f"leading() takes an input name and an extent, found {args}")
        elif fn in ("from_params", "leading"):
            extents = args[1:] if fn == "leading" else args
            if not extents:
                report("ShapeRuleInvalid", field, "from_params() needs at least one extent")
            for a in extents:
                try:
                    e = parse_arith(a)
                except ExprError as err:
                    report("ShapeRuleInvalid", field, str(err))
                    continue
                for s in sorted(e.symbols - symbols):
                    report("ShapeRuleInvalid", field, f"{s!r} is not declared")
        elif fn not in ("same_as", "matmul"):
            report("ShapeRuleInvalid", field, f"{fn}() is not same_as, matmul, leading or from_params")


def _sub(raw: dict, key: str) -> dict:
    v = raw.get(key)
    return v if isinstance(v, dict) else {}


def _check_cost_precision(sec: KernelContract, report: _Report) -> None:
    c, p = sec.cost, sec.precision
    if c.provenance == "judge_measured" and c.overhead_ns is not None:
        report(
            "OverheadIncoherent",
            "cost.overhead_ns",
            "judge_measured overheads come from the judge's report; write ~ here, not a number",
        )
    if c.provenance == "analytic" and c.overhead_ns is None:
        report("OverheadIncoherent", "cost.overhead_ns", "an analytic cost needs a number of nanoseconds")
    for key in ("max_relative", "max_absolute"):
        raw = _sub(sec.raw, "precision").get(key)
        if raw is None:
            continue
        items = raw.items() if isinstance(raw, dict) else [(None, raw)]
        for dt, v in items:
            field = f"precision.{key}" + (f".{dt}" if dt is not None else "")
            if dt is not None and dt not in DTYPES:
                report("ToleranceInvalid", field, f"{dt!r} is not one of {', '.join(DTYPES)}")
            if not (is_finite_number(v) and v >= 0):
                report("ToleranceInvalid", field, f"expected a non-negative number, found {v!r}")
    stable = p.bit_stable_on_same_hardware
    if sec.determinism and stable != (sec.determinism != "nondeterministic"):
        report(
            "DeterminismIncoherent",
            "precision.bit_stable_on_same_hardware",
            f"bit_stable_on_same_hardware: {str(stable).lower()} contradicts determinism: {sec.determinism}",
        )
    in_place_out = any(o.aliasing == "in_place" for o in sec.outputs)
    if in_place_out != sec.caps.in_place:
        report(
            "AliasingIncoherent",
            "caps.in_place",
            f"caps.in_place: {str(sec.caps.in_place).lower()} but "
            f"{'an' if in_place_out else 'no'} output has aliasing: in_place",
        )
    a, g = sec.caps.alignment_bytes, sec.caps.access_granularity_bits
    if a is not None and (a <= 0 or a & (a - 1)):
        report("AlignmentInvalid", "caps.alignment_bytes", f"{a} is not a power of two")
    if g is not None and g not in (8, 16, 32, 64, 128):
        report("AlignmentInvalid", "caps.access_granularity_bits", f"{g} is not 8, 16, 32, 64 or 128")


KERNEL_PACKAGE = "minfer.kernels"  # the only package entry points and load layouts may name
# optional packages a kernel module may need -> how to install them (pyproject's extras)
OPTIONAL_PACKAGES = {"triton": "pip install 'minfer[gpu]'", "wgpu": "pip install 'minfer[vulkan]'"}


class DependencyMissing(ValueError):
    """An entry point's module needs an optional package this machine lacks (triton for the CUDA
    backend's kernels). Not a contract error: the contract is valid, its kernel cannot run here;
    the registry lists it as unbound with this reason."""
_KERNELS_DIR = Path(__file__).resolve().parents[1] / "kernels"
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def resolve_entry_point(entry: str, trusted: tuple[str, ...] = ()) -> Callable:
    """Import `module:attr` (attr may be dotted) and return the callable; ValueError says why not.

    A contract file is data: its entry points resolve only to modules of minfer's own kernel
    package, found as files there before anything is imported, so a file from anywhere cannot
    make validation import (and run) another module. `trusted`: further top-level modules a
    caller vouches for (a test's kernels); `minfer kernels --check` passes none."""
    module, sep, attr = entry.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{entry!r} is not of the form 'package.module:function'")
    if not _DOTTED.fullmatch(module) or not _DOTTED.fullmatch(attr):
        raise ValueError(f"{entry!r}: module and function must be dotted Python names")
    if module.split(".")[0] in trusted:
        pass
    elif module != KERNEL_PACKAGE and not module.startswith(KERNEL_PACKAGE + "."):
        raise ValueError(f"{module!r} is outside minfer's kernel package {KERNEL_PACKAGE!r}: entry points resolve "
                         "only there (nothing else is imported)")
    elif module != KERNEL_PACKAGE:  # (minfer.kernels itself: its __init__)
        rel = module[len(KERNEL_PACKAGE) + 1:].split(".")
        if not _KERNELS_DIR.joinpath(*rel[:-1], rel[-1] + ".py").is_file():
            raise ValueError(f"{module!r}: no such module in {KERNEL_PACKAGE!r}")
    try:
        obj: Any = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure is the contract's problem to report
        missing = (e.name or "").split(".")[0] if isinstance(e, ImportError) else ""
        if missing in OPTIONAL_PACKAGES:
            raise DependencyMissing(f"{module!r} needs {missing}, which is not installed "
                                    f"({OPTIONAL_PACKAGES[missing]})") from None
        raise ValueError(f"importing {module!r} failed: {type(e).__name__}: {e}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{entry!r} is not callable")
    return obj


def _check_registrable(sec: KernelContract, report: _Report, bind: bool, trusted: tuple[str, ...] = ()) -> None:
    sources = REGISTRABLE_BACKENDS.get(sec.backend)
    if sources is None:
        report("BackendUnsupported", "backend",
               f"{sec.backend!r}: registrable kernels run on {', '.join(REGISTRABLE_BACKENDS)}")
    elif sec.kernel_source not in sources:
        report(
            "BackendUnsupported",
            "kernel_source",
            f"{sec.kernel_source!r} kernels do not run on {sec.backend}; use {' or '.join(sources)}",
        )
    field = "fused_op" if sec.fused_op and not sec.op_kind else "op_kind"
    spec = op_spec(sec.op) if sec.op else None
    if sec.op and (spec is None or spec.fused != (field == "fused_op")):
        names = [o.name for o in OPS.values() if o.fused == (field == "fused_op")]
        report("UnknownOpKind", field, f"{sec.op!r} is not a registrable {field}; known: {', '.join(names)}")
        spec = None
    if spec is not None:
        names = tuple(i.name for i in sec.inputs)
        if names != spec.inputs:
            want = list(spec.inputs)
            report("OpSignatureMismatch", "accept.inputs", f"inputs {list(names)}; {spec.name} takes {want}")
        for f in sec.op_fields:
            if f.name not in spec.params:
                report(
                    "OpSignatureMismatch",
                    f"op_params.fields.{f.name}",
                    f"{f.name!r} is not a param of {spec.name} ({', '.join(spec.params) or 'none'})",
                )
    p = sec.precision
    if all(t is None or t == {} for t in (p.max_relative, p.max_absolute)):
        report("ToleranceMissing", "precision", "registrable kernels declare max_relative or max_absolute")
    unknown = sorted(sec.caps.also - set(CAPABILITIES))
    if unknown:
        report("UnknownCapability", "caps.also", f"{unknown}: known capabilities are {', '.join(CAPABILITIES)}")
    if ("q8_in" in sec.caps.also) != (sec.caps.q8_passes is not None):
        report("UnknownCapability", "caps.q8_passes", "q8_in and caps.q8_passes go together")
    if not bind:
        return
    for i, inp in enumerate(sec.inputs):
        if inp.load_layout:
            try:
                resolve_entry_point(inp.load_layout, trusted)
            except DependencyMissing:
                return  # (unbindable here, not invalid: the registry says why)
            except ValueError as e:
                report("EntryPointUnresolved", f"accept.inputs[{i}].load_layout", str(e))
    if sec.caps.q8_passes:
        try:
            resolve_entry_point(sec.caps.q8_passes, trusted)
        except ValueError as e:
            report("EntryPointUnresolved", "caps.q8_passes", str(e))
    try:
        fn = resolve_entry_point(sec.entry_point, trusted)
    except DependencyMissing:
        return
    except ValueError as e:
        report("EntryPointUnresolved", "entry_point", str(e))
        return
    if spec is not None:
        extra = tuple(k for c in sorted(sec.caps.also & set(CAPABILITIES)) for k in CAPABILITIES[c].keywords)
        _check_signature(fn, spec.inputs + spec.params + extra, report)


def _check_signature(fn: Callable, names: tuple[str, ...], report: _Report) -> None:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return  # builtins without a signature: nothing to check
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    for n in names:
        p = params.get(n)
        if p is None or p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL):
            report("EntryPointSignature", "entry_point", f"launcher has no keyword parameter {n!r}")


# ---- entry points -------------------------------------------------------------------------------


def validate_section(
    sec: KernelContract, provider=None, *, path: str = "", bind: bool = True, trusted: tuple[str, ...] = ()
) -> list[ContractError]:
    """All errors of one section. `bind=False` skips importing registrable entry points."""
    errors: list[ContractError] = []
    report = _Report(sec.kernel, sec.line_of, path or sec.location.path, errors)
    _walk(sec.raw, SECTION, "", report)
    _check_identity(sec, report, provider)
    _check_operands(sec, report)
    _check_exprs(sec, report)
    _check_rules(sec, report)
    _check_cost_precision(sec, report)
    if sec.registrable:
        _check_registrable(sec, report, bind, trusted)
    return errors


def validate_file(cf: ContractFile, *, bind: bool = True, trusted: tuple[str, ...] = ()) -> list[ContractError]:
    """Every error of a parsed file: parse errors, front matter, each section, duplicates."""
    errors = list(cf.parse_errors)
    header = _Report(HEADER_SECTION, lambda f: cf.header_lines.get(f, 1), cf.path, errors)
    if cf.header_raw:
        _walk(cf.header_raw, HEADER, "", header)
        if isinstance(cf.fkc_version, int) and cf.fkc_version != FKC_VERSION:
            why = f"version {cf.fkc_version}; this reader knows {FKC_VERSION}"
            header("VersionUnsupported", "fkc_version", why)
    seen: dict[str, int] = {}
    for sec in cf.sections:
        errors += validate_section(sec, cf.provider, path=cf.path, bind=bind, trusted=trusted)
        if sec.kernel in seen:
            rep = _Report(sec.kernel, sec.line_of, cf.path, errors)
            rep("DuplicateKernel", "kernel", f"also defined at line {seen[sec.kernel]}")
        seen.setdefault(sec.kernel, sec.location.line)
    return errors


def check_file(path: str | Path, *, bind: bool = True) -> tuple[ContractFile, list[ContractError]]:
    """Parse and validate one file."""
    cf = parse_file(path)
    return cf, validate_file(cf, bind=bind)
