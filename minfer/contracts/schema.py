"""The FKC field set (seed 004) as a declarative spec, and the typed dataclasses of a contract.

`SECTION` / `HEADER` describe every field a ```fkc block / the front matter may hold: its
YAML type, whether it is required, and the values of enum fields. The validator walks raw
YAML against them (rules `UnknownField`, `MissingField`, `FieldType`, `EnumValue`); the
parser builds the dataclasses below from the same raw YAML, leniently (a wrongly typed value
becomes its empty default, so later rules stay quiet and the structural error is the one
reported).

minfer extensions to the seed's field set (each documented in docs/KERNEL-CONTRACTS.md):
- `fdx.quant.ggml_dtype` may be a list of storage types, so one section covers a family;
- `rank` may be a list of ranks or `any`;
- `precision.max_relative` / `max_absolute` may map output dtype -> tolerance;
- `accept.inputs[].dtypes` entries may be `same_as(earlier input)`;
- `accept.inputs[].load_layout: "module:function"` names a load-time transform the launcher also
  accepts for that operand (e.g. a repacked weight layout), called as fn(tensor, **params).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LAYOUT_KEYS = ("contiguous", "strided", "broadcast_stride0", "start_offset", "reverse_strides")
LAYOUT_VALUES = ("required", "supported", "rejected")
DETERMINISM = ("bitwise", "same_hardware_bitwise", "nondeterministic")
PROVENANCE = ("judge_measured", "analytic")
COST_CLASS = ("cheap_elementwise", "gather", "reduction", "gemm_like", "copy")
AWKWARD_LAYOUT = ("requires_contiguous", "copies_to_contiguous", "native_strides")
LAYOUT_GUARANTEE = ("contiguous", "same_as_input")
ALIASING = ("none", "in_place", "may_alias_input")
QUANT_FAMILY = ("GGML_BLOCK", "AFFINE_FLOAT")
QUANT_ROLE = ("weight", "activation", "kv_cache")
PARAM_KIND = ("usize", "i32", "i64", "f32", "bool", "QuantType", "DType")


@dataclass(frozen=True)
class Spec:
    """One field: YAML kind, required flag, enum values, children (map) or item spec (list/dict)."""

    kind: str  # str bool int number? expr enum strs rank tolerance scalar map list dict
    required: bool = False
    values: tuple[str, ...] = ()
    fields: dict[str, Spec] = field(default_factory=dict)
    item: Spec | None = None


def _req(kind: str, **kw) -> Spec:
    return Spec(kind, True, **kw)


def _enum(values: tuple[str, ...], required: bool = True) -> Spec:
    return Spec("enum", required, values)


_QUANT = Spec(
    "map",
    fields={
        "family": _enum(QUANT_FAMILY),
        "ggml_dtype": Spec("strs"),
        "role": _enum(QUANT_ROLE, required=False),
        "scale_operand": Spec("scalar"),
        "granularity": Spec("scalar"),
    },
)
_FDX = Spec("map", fields={"requires_ext": _req("bool"), "quant": _QUANT})
_LAYOUT = _req("map", fields={k: _enum(LAYOUT_VALUES) for k in LAYOUT_KEYS})
_INPUT = Spec(
    "map",
    fields={
        "name": _req("str"),
        "dtypes": _req("strs"),
        "layout": _LAYOUT,
        "rank": _req("rank"),
        "shape_constraint": Spec("str"),
        "fdx": _FDX,
        "load_layout": Spec("str"),
    },
)
_OUTPUT = Spec(
    "map",
    fields={
        "name": _req("str"),
        "dtype_rule": _req("str"),
        "shape_rule": _req("str"),
        "layout_guarantee": _enum(LAYOUT_GUARANTEE),
        "aliasing": _enum(ALIASING),
        "fdx": _FDX,
    },
)
_PARAM_FIELD = Spec("map", fields={"kind": _enum(PARAM_KIND), "constraint": Spec("str")})
_TOLERANCE = Spec("tolerance")

SECTION = Spec(
    "map",
    fields={
        "kernel": _req("str"),
        "registrable": _req("bool"),
        "op_kind": Spec("str"),
        "fused_op": Spec("str"),
        "blurb": _req("str"),
        "backend": _req("str"),
        "kernel_source": _req("str"),
        "entry_point": _req("str"),
        "kernel_revision_hash": Spec("str"),
        "accept": _req("map", fields={"inputs": _req("list", item=_INPUT)}),
        "op_params": _req(
            "map", fields={"variant": _req("scalar"), "fields": Spec("dict", item=_PARAM_FIELD)}
        ),
        "return": _req("map", fields={"outputs": _req("list", item=_OUTPUT)}),
        "caps": _req(
            "map",
            fields={
                "awkward_layout_strategy": _enum(AWKWARD_LAYOUT),
                "fast_paths": Spec(
                    "list", item=Spec("map", fields={"when": _req("str"), "note": Spec("str")})
                ),
                "in_place": Spec("bool"),
                "alignment_bytes": Spec("int"),
                "access_granularity_bits": Spec("int"),
                "also": Spec("list", item=Spec("str")),  # capabilities beyond the op (contracts/ops.py CAPABILITIES)
                "q8_passes": Spec("str"),  # 'module:function' (n, k, qtype, **settings) -> int8 x passes (q8_in)
            },
        ),
        "cost": _req(
            "map",
            fields={
                "provenance": _enum(PROVENANCE),
                "class": _enum(COST_CLASS),
                "flops": _req("expr"),
                "bytes_moved": _req("expr"),
                "overhead_ns": Spec("number?"),
                "flop_rate": Spec("number?"),
                "memory": Spec(
                    "map", fields={k: Spec("expr") for k in ("device_bytes", "host_bytes", "disk_bytes")}
                ),
            },
        ),
        "precision": _req(
            "map",
            fields={
                "bit_stable_on_same_hardware": _req("bool"),
                "max_ulp": Spec("number?"),
                "max_relative": _TOLERANCE,
                "max_absolute": _TOLERANCE,
                "audited": Spec("bool"),
                "notes": Spec("str"),
            },
        ),
        "determinism": _enum(DETERMINISM),
    },
)

HEADER = Spec(
    "map",
    fields={
        "fkc_version": _req("int"),
        "provider": _req(
            "map",
            fields={
                "name": _req("str"),
                "backend": _req("str"),
                "kernel_source": _req("str"),
                "link_registry": Spec("str"),
                "revision_base": Spec("str"),
            },
        ),
    },
)


# ---- typed model -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Location:
    """Where a section lives: file, first line of its fkc block, and its markdown heading."""

    path: str
    line: int
    heading: str = ""


@dataclass(frozen=True)
class Quant:
    family: str
    ggml_dtypes: tuple[str, ...]
    role: str | None
    scale_operand: Any
    granularity: Any


@dataclass(frozen=True)
class Fdx:
    requires_ext: bool
    quant: Quant | None


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtypes: tuple[str, ...]
    layout: dict[str, str]
    ranks: tuple[int, ...] | None  # None: any rank
    shape_constraint: str | None
    fdx: Fdx | None
    load_layout: str | None = None

    @property
    def quant(self) -> Quant | None:
        return self.fdx.quant if self.fdx else None


@dataclass(frozen=True)
class ParamField:
    name: str
    kind: str | None
    constraint: str | None


@dataclass(frozen=True)
class OutputSpec:
    name: str
    dtype_rule: str
    shape_rule: str
    layout_guarantee: str | None
    aliasing: str | None
    fdx: Fdx | None


@dataclass(frozen=True)
class FastPath:
    when: str
    note: str


@dataclass(frozen=True)
class Caps:
    awkward_layout_strategy: str | None
    fast_paths: tuple[FastPath, ...]
    in_place: bool
    alignment_bytes: int | None
    access_granularity_bits: int | None
    also: frozenset[str] = frozenset()  # capabilities beyond the op (contracts/ops.py CAPABILITIES)
    q8_passes: str | None = None  # with q8_in: 'module:function' giving the int8 x passes it reads


@dataclass(frozen=True)
class Cost:
    provenance: str | None
    cls: str | None  # the YAML key is `class`
    flops: Any
    bytes_moved: Any
    overhead_ns: float | None
    memory: dict[str, Any]
    flop_rate: float | None = None  # flop/s this kernel sustains (tensor cores, cuBLAS); None: the device's default


@dataclass(frozen=True)
class Precision:
    bit_stable_on_same_hardware: bool
    max_ulp: float | None
    max_relative: float | dict[str, float] | None
    max_absolute: float | dict[str, float] | None
    audited: bool
    notes: str

    def tolerance(self, which: str, out_dtype: str) -> float | None:
        """`max_relative` / `max_absolute` for one output dtype (a per-dtype map or one number)."""
        tol = getattr(self, which)
        if isinstance(tol, dict):
            return tol.get(out_dtype)
        return tol


@dataclass(frozen=True)
class Provider:
    name: str
    backend: str
    kernel_source: str
    link_registry: str | None
    revision_base: str | None


@dataclass(frozen=True)
class KernelContract:
    """One ```fkc section, typed. `raw` is the YAML mapping it was built from; `lines` maps
    dotted field paths (`accept.inputs[0].rank`) to 1-based line numbers in the file."""

    kernel: str
    registrable: bool
    op_kind: str | None
    fused_op: str | None
    blurb: str
    backend: str
    kernel_source: str
    entry_point: str
    kernel_revision_hash: str
    inputs: tuple[InputSpec, ...]
    op_variant: Any
    op_fields: tuple[ParamField, ...]
    outputs: tuple[OutputSpec, ...]
    caps: Caps
    cost: Cost
    precision: Precision
    determinism: str | None
    location: Location
    raw: dict = field(repr=False, compare=False, default_factory=dict)
    lines: dict[str, int] = field(repr=False, compare=False, default_factory=dict)

    @property
    def op(self) -> str | None:
        """The op this kernel implements: its `op_kind`, else its `fused_op`."""
        return self.op_kind or self.fused_op

    def line_of(self, path: str) -> int:
        """Line of a dotted field path, falling back to its nearest present parent, then the block."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path.rsplit(".", 1)[0] if "." in path else path.rsplit("[", 1)[0] if "[" in path else ""
        return self.location.line


@dataclass(frozen=True)
class ContractFile:
    """A parsed .fkc.md file: front matter, sections, and the errors met while parsing."""

    path: str
    fkc_version: Any
    provider: Provider | None
    header_raw: dict
    header_lines: dict[str, int]
    sections: tuple[KernelContract, ...]
    parse_errors: tuple = ()


# ---- lenient builders (the validator reports type errors; these never raise) -------------------


def _map(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list:
    return v if isinstance(v, list) else []


def _str(v: Any, default: str = "") -> str:
    return v if isinstance(v, str) else default


def _opt_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _strs(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        return (v,)
    return tuple(x for x in _list(v) if isinstance(x, str))


def _num(v: Any) -> float | None:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _tol(v: Any) -> float | dict[str, float] | None:
    if isinstance(v, dict):
        return {str(k): float(x) for k, x in v.items() if _num(x) is not None}
    return _num(v)


def _ranks(v: Any) -> tuple[int, ...] | None:
    if v == "any" or v is None:
        return None
    if isinstance(v, list):
        return tuple(x for x in v if _int(x) is not None)
    return (v,) if _int(v) is not None else ()


def _fdx(v: Any) -> Fdx | None:
    if not isinstance(v, dict):
        return None
    q = v.get("quant")
    quant = None
    if isinstance(q, dict):
        quant = Quant(
            _str(q.get("family")),
            _strs(q.get("ggml_dtype")),
            _opt_str(q.get("role")),
            q.get("scale_operand"),
            q.get("granularity"),
        )
    return Fdx(v.get("requires_ext") is True, quant)


def build_input(v: Any) -> InputSpec:
    d = _map(v)
    return InputSpec(
        _str(d.get("name")),
        _strs(d.get("dtypes")),
        {k: str(x) for k, x in _map(d.get("layout")).items()},
        _ranks(d.get("rank")),
        _opt_str(d.get("shape_constraint")),
        _fdx(d.get("fdx")),
        _opt_str(d.get("load_layout")),
    )


def build_output(v: Any) -> OutputSpec:
    d = _map(v)
    return OutputSpec(
        _str(d.get("name")),
        _str(d.get("dtype_rule")),
        _str(d.get("shape_rule")),
        _opt_str(d.get("layout_guarantee")),
        _opt_str(d.get("aliasing")),
        _fdx(d.get("fdx")),
    )


def build_section(raw: dict, location: Location, lines: dict[str, int]) -> KernelContract:
    """Typed view of one fkc block's YAML mapping."""
    caps, cost, prec = _map(raw.get("caps")), _map(raw.get("cost")), _map(raw.get("precision"))
    params = _map(raw.get("op_params"))
    return KernelContract(
        kernel=_str(raw.get("kernel"), f"<block at line {location.line}>"),
        registrable=raw.get("registrable") is True,
        op_kind=_opt_str(raw.get("op_kind")),
        fused_op=_opt_str(raw.get("fused_op")),
        blurb=_str(raw.get("blurb")),
        backend=_str(raw.get("backend")),
        kernel_source=_str(raw.get("kernel_source")),
        entry_point=_str(raw.get("entry_point")),
        kernel_revision_hash=_str(raw.get("kernel_revision_hash"), "auto"),
        inputs=tuple(build_input(x) for x in _list(_map(raw.get("accept")).get("inputs"))),
        op_variant=params.get("variant"),
        op_fields=tuple(
            ParamField(str(k), _opt_str(_map(f).get("kind")), _opt_str(_map(f).get("constraint")))
            for k, f in _map(params.get("fields")).items()
        ),
        outputs=tuple(build_output(x) for x in _list(_map(raw.get("return")).get("outputs"))),
        caps=Caps(
            _opt_str(caps.get("awkward_layout_strategy")),
            tuple(
                FastPath(_str(_map(f).get("when")), _str(_map(f).get("note")))
                for f in _list(caps.get("fast_paths"))
            ),
            caps.get("in_place") is True,
            _int(caps.get("alignment_bytes")),
            _int(caps.get("access_granularity_bits")),
            frozenset(str(x) for x in _list(caps.get("also"))),
            _opt_str(caps.get("q8_passes")),
        ),
        cost=Cost(
            _opt_str(cost.get("provenance")),
            _opt_str(cost.get("class")),
            cost.get("flops"),
            cost.get("bytes_moved"),
            _num(cost.get("overhead_ns")),
            _map(cost.get("memory")),
            _num(cost.get("flop_rate")),
        ),
        precision=Precision(
            prec.get("bit_stable_on_same_hardware") is True,
            _num(prec.get("max_ulp")),
            _tol(prec.get("max_relative")),
            _tol(prec.get("max_absolute")),
            prec.get("audited") is True,
            _str(prec.get("notes")),
        ),
        determinism=_opt_str(raw.get("determinism")),
        location=location,
        raw=raw,
        lines=lines,
    )


def build_provider(raw: dict) -> Provider | None:
    p = raw.get("provider")
    if not isinstance(p, dict):
        return None
    return Provider(
        _str(p.get("name")),
        _str(p.get("backend")),
        _str(p.get("kernel_source")),
        _opt_str(p.get("link_registry")),
        _opt_str(p.get("revision_base")),
    )
