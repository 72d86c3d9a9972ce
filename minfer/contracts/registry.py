"""The kernel registry: every contract file of the package, validated, registrable ones bound.

`load_registry()` reads every `*.fkc.md` under `minfer/kernels/` (each kernel family's contract
sits beside its launchers: kernels/triton/, kernels/wgsl/, kernels/cpu/, kernels/sample.fkc.md;
or the files given), validates each section (validate.py), and binds every valid `registrable:
true` section to its launcher by importing its `entry_point`. A section with errors is listed with
them and never bound, so a broken contract cannot be dispatched to. A valid section whose module
needs a package this machine lacks (triton, for the CUDA backend's kernels) is left unbound with
that reason (`Registry.unbound`); the other backends' kernels bind as usual. Judge measurements
(judge.py's JSON report) are read back when a report is given or `minfer/kernels/judge.json`
exists; a measurement is used only while the kernel's revision hash still matches the one the
judge measured.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ContractError, MinferError
from .ops import OpSpec, op_spec
from .parser import parse_file
from .schema import ContractFile, KernelContract
from .validate import DependencyMissing, resolve_entry_point, validate_file

KERNELS_DIR = Path(__file__).resolve().parents[1] / "kernels"  # searched recursively for contract files
JUDGE_REPORT = KERNELS_DIR / "judge.json"


def contract_files() -> list[Path]:
    """Every contract file of the package, in path order (a backend's kernels rank in this order
    where their costs tie)."""
    return sorted(KERNELS_DIR.rglob("*.fkc.md"))


@dataclass(frozen=True)
class Measurement:
    """What the judge measured for one kernel (judge.py writes it, the picker reads it)."""

    overhead_ns: float
    revision: str
    device: str


@dataclass(frozen=True)
class BoundKernel:
    """A valid registrable contract and the launcher its entry point names."""

    contract: KernelContract
    launcher: Callable
    revision: str
    takes_out: bool  # the launcher has an `out=` parameter (outputs can be preallocated/poisoned)
    load_layouts: dict[str, Callable] = field(default_factory=dict)  # input name -> load-time transform
    q8_passes: Callable | None = None  # caps.q8_passes: (n, k, qtype, **settings) -> the int8 x passes it reads

    @property
    def name(self) -> str:
        return self.contract.kernel

    @property
    def op(self) -> OpSpec:
        spec = op_spec(self.contract.op or "")
        assert spec is not None  # guaranteed by validation (UnknownOpKind)
        return spec

    def __call__(self, **kwargs):
        """Launch with the op's keyword arguments (inputs, params, optional out)."""
        return self.launcher(**kwargs)

    def apply_load_layouts(self, inputs: dict, params: dict) -> dict:
        """`inputs` with every operand that has a `load_layout` transformed by it (called as
        fn(tensor, **the params it names)); what a backend does once at model load."""
        out = dict(inputs)
        for name, fn in self.load_layouts.items():
            wanted = inspect.signature(fn).parameters
            out[name] = fn(inputs[name], **{p: v for p, v in params.items() if p in wanted})
        return out


@dataclass
class Registry:
    """Contract files, their validation errors, bound kernels and judge measurements."""

    files: list[ContractFile]
    errors: dict[str, list[ContractError]]  # kernel name (or file path) -> errors
    kernels: dict[str, BoundKernel]
    measurements: dict[str, Measurement] = field(default_factory=dict)
    copy_bandwidth: dict[str, float] = field(default_factory=dict)  # backend -> bytes/s the judge measured
    unbound: dict[str, str] = field(default_factory=dict)  # valid kernel -> why it cannot bind here (a missing package)

    def sections(self) -> Iterable[KernelContract]:
        for f in self.files:
            yield from f.sections

    def for_op(self, op: str, backend: str | None = None) -> list[BoundKernel]:
        """Bound kernels implementing `op` (on `backend`, if given), in file order."""
        return [
            k for k in self.kernels.values() if k.contract.op == op and backend in (None, k.contract.backend)
        ]

    def measured_overhead_ns(self, kernel: BoundKernel) -> float | None:
        m = self.measurements.get(kernel.name)
        return m.overhead_ns if m and m.revision == kernel.revision else None

    def check(self) -> None:
        """Raise the first validation error, if any (for callers that need a clean registry)."""
        for errs in self.errors.values():
            if errs:
                raise errs[0]


def revision_of(contract: KernelContract, launcher: Callable, revision_base: str | None) -> str:
    """The kernel revision: the contract's explicit hash, else a hash of the launcher's module
    source (and of the files its REVISION_SOURCES names) and the provider's revision_base, so
    editing a kernel invalidates its measurements."""
    if contract.kernel_revision_hash != "auto":
        return contract.kernel_revision_hash
    h = hashlib.sha256((revision_base or "").encode())
    try:
        h.update(Path(inspect.getsourcefile(launcher) or "").read_bytes())
        # a module whose kernels live in other files (the WGSL shaders) names them in REVISION_SOURCES
        for extra in getattr(inspect.getmodule(inspect.unwrap(launcher)), "REVISION_SOURCES", ()):
            h.update(Path(extra).read_bytes())
    except (OSError, TypeError):
        h.update(contract.entry_point.encode())
    return h.hexdigest()[:16]


def _takes_out(fn: Callable) -> bool:
    try:
        return "out" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def load_registry(
    paths: Iterable[str | Path] | None = None, judge_report: str | Path | None = None, trusted: tuple[str, ...] = (),
    backend: str | None = None,
) -> Registry:
    """Load, validate and bind contract files (default: every contract file of the package; with
    `backend`, only the files with a contract of that backend). Entry points resolve inside
    minfer.kernels only, plus the top-level modules in `trusted` (tests)."""
    paths = contract_files() if paths is None else list(paths)
    if backend is not None:  # (a file that never names the backend has none of its contracts: not parsed)
        named = re.compile(rf"backend:\s*[\"']?{re.escape(backend)}\b")
        paths = [p for p in paths if named.search(Path(p).read_text(encoding="utf-8", errors="replace"))]
    files = [parse_file(p) for p in paths]
    if backend is not None:
        files = [cf for cf in files if any(s.backend == backend for s in cf.sections)]
    errors: dict[str, list[ContractError]] = {}
    kernels: dict[str, BoundKernel] = {}
    unbound: dict[str, str] = {}
    seen: dict[str, str] = {}
    for cf in files:
        names = {s.kernel for s in cf.sections}
        for e in validate_file(cf, trusted=trusted):
            errors.setdefault(e.section if e.section in names else cf.path, []).append(e)
        for sec in cf.sections:
            if sec.kernel in seen and seen[sec.kernel] != cf.path:
                why = f"also defined in {seen[sec.kernel]}"
                dup = ContractError("DuplicateKernel", sec.kernel, "kernel", why)
                errors.setdefault(sec.kernel, []).append(dup)
            seen.setdefault(sec.kernel, cf.path)
            if not sec.registrable or errors.get(sec.kernel):
                continue
            try:  # validated above, so it resolves unless an optional package is missing
                fn = resolve_entry_point(sec.entry_point, trusted)
                layouts = {i.name: resolve_entry_point(i.load_layout, trusted) for i in sec.inputs if i.load_layout}
                passes = resolve_entry_point(sec.caps.q8_passes, trusted) if sec.caps.q8_passes else None
            except DependencyMissing as e:
                unbound[sec.kernel] = str(e)
                continue
            base = cf.provider.revision_base if cf.provider else None
            kernels[sec.kernel] = BoundKernel(sec, fn, revision_of(sec, fn, base), _takes_out(fn), layouts, passes)
    reg = Registry(files, errors, kernels, unbound=unbound)
    report = Path(judge_report) if judge_report else (JUDGE_REPORT if JUDGE_REPORT.is_file() else None)
    if report is not None:
        read_judge_report(reg, report)
    return reg


def read_judge_report(reg: Registry, path: Path) -> None:
    """Fill `reg.measurements` / `reg.copy_bandwidth` from a judge JSON report (MinferError if malformed)."""
    try:
        data = json.loads(Path(path).read_text())
        backend = data["backend"]
        bandwidth = float(data["copy_bandwidth_gbs"]) * 1e9
        if not (math.isfinite(bandwidth) and bandwidth > 0):
            raise ValueError(f"copy_bandwidth_gbs must be a positive number, found {bandwidth / 1e9}")
        reg.copy_bandwidth[backend] = bandwidth
        for name, k in data["kernels"].items():
            if k.get("overhead_ns") is not None and math.isfinite(float(k["overhead_ns"])):
                m = Measurement(float(k["overhead_ns"]), str(k["revision"]), data["device"])
                reg.measurements[name] = m
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise MinferError(f"judge report {path}: unreadable or malformed ({type(e).__name__}: {e})") from None


@functools.lru_cache(maxsize=4)
def default_registry(judge_report: str | None = None) -> Registry:
    """The package's registry (with a judge report's measurements, when given), loaded once per
    process (contracts are package data: read-only)."""
    return load_registry(judge_report=judge_report)


@functools.cache
def backend_registry(backend: str) -> Registry:
    """The package's contract files of one backend, loaded once per process: the cpu backend's
    load binds its own kernels and imports no GPU kernel module (Triton's import alone is ~1 s)."""
    return load_registry(backend=backend)
