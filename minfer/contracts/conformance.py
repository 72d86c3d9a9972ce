"""Conformance harness: every registrable kernel against the torch reference, driven by its contract.

Modelled on llama.cpp's test-backend-ops. For each bound kernel of the registry:

1. cases: every dtype combination its `accept` block admits (a quant operand: every storage type
   in `ggml_dtype`; an output dtype chosen by a param: every dtype its tolerance map names) x
   the op's sizes for the size classes `tiny`, `odd`, `boundary` (harness.py), plus SmolLM2's
   layer sizes and the `large` class (GEMVs of weights above 2^24 values: the int8-activation path)
   with `--full`; sizes its rank / `shape_constraint` refuse are skipped;
2. each case draws fresh random inputs, poisons the output (NaN; 0xFF bytes for byte outputs)
   and launches through the op's keyword interface (`out=` when the launcher takes one);
3. the result is compared in float64 with the op's reference function using the tolerance the
   contract declares: ||out - ref|| / ||ref|| <= max_relative and max |out - ref| <= max_absolute;
   a quantized output is decoded first; a left-over poison value, a wrong shape or dtype, or an
   ignored `out=` fails the case;
4. kernels declared bit-stable are launched twice and must give identical bytes (on cpu only the
   `odd` cases: the interpreter is deterministic by construction).

On cpu the Triton kernels run in the interpreter (`main` sets TRITON_INTERPRET=1 before triton is
imported). Run: `python -m minfer.contracts.conformance [--full] [--device cuda]`.
"""

from __future__ import annotations

import argparse
import itertools
import math
import secrets
import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..config import set_process_env
from ..quant import reference
from ..quant.types import QuantInfo, by_name
from .harness import HARNESS, LARGE, MODELS, SIZE_CLASSES, Setting
from .ops import torch_dtype
from .picker import rejections
from .registry import BoundKernel, Registry, load_registry
from .rules import output_dtype, output_shape, same_as_target

FULL_MODEL = "SmolLM2-135M"


@dataclass
class CaseResult:
    kernel: str
    size: str
    dtypes: str
    shapes: str
    passed: bool
    rel_err: float = math.nan
    abs_err: float = math.nan
    tolerance: str = ""
    bit_stable: bool | None = None
    message: str = ""


# ---- cases ------------------------------------------------------------------------------------


def dtype_combinations(k: BoundKernel) -> list[tuple[dict[str, str], str | None]]:
    """Every (input dtypes, output dtype) the contract admits; the output dtype is None unless a
    `param(...)` dtype_rule lets the caller choose it (then: every dtype the tolerance map names)."""
    c = k.contract
    tied = {i.name: same_as_target(i.dtypes[0]) for i in c.inputs if i.dtypes and same_as_target(i.dtypes[0])}
    free = [i for i in c.inputs if i.name not in tied]
    options = [list(i.quant.ggml_dtypes) if i.quant else [d for d in i.dtypes if not same_as_target(d)]
               for i in free]
    out_choices: list[str | None] = [None]
    if c.outputs and c.outputs[0].dtype_rule.startswith("param("):
        p = c.precision
        out_choices = list(next((t for t in (p.max_relative, p.max_absolute) if isinstance(t, dict)), {}))
    combos = []
    for values in itertools.product(*options):
        chosen = dict(zip([i.name for i in free], values, strict=True))
        dts = {i.name: chosen[i.name] if i.name in chosen else chosen[tied[i.name]] for i in c.inputs}
        combos += [(dts, o) for o in out_choices]
    return combos


def _quant_info(k: BoundKernel, dtypes: Mapping[str, str]) -> QuantInfo | None:
    q = next((i for i in k.contract.inputs if i.quant), None)
    return by_name(dtypes[q.name]) if q else None


@dataclass(frozen=True)
class Case:
    """One case: sizes, input dtypes, output dtype choice, and whether operands with a
    `load_layout` are passed in that layout (else as the raw tensor)."""

    setting: Setting
    dtypes: dict[str, str]
    out_choice: str | None
    laid_out: bool = False

    @property
    def label(self) -> str:
        text = ", ".join(f"{n}:{dt}" for n, dt in self.dtypes.items())
        text += f" -> {self.out_choice}" if self.out_choice else ""
        return text + (" +layout" if self.laid_out else "")


def cases(k: BoundKernel, sizes: tuple[str, ...], covering: bool = False) -> Iterator[Case]:
    """Every case of a kernel for `sizes` (CI size classes and/or model names of harness.MODELS);
    operands with a load_layout are tried both raw and laid out. `covering`: every size and layout
    with the first dtype combination, and every other combination once, at size i mod len(sizes) and
    layout i mod 2 (for kernels whose per-dtype paths another kernel's conformance runs at every
    size: the fused GEMVs, whose weight loops are the GEMV's)."""
    h = HARNESS[k.op.name]
    layouts = (False, True) if k.load_layouts else (False,)
    for i, (dtypes, out_choice) in enumerate(dtype_combinations(k)):
        q = _quant_info(k, dtypes)
        picked = sizes if not covering or i == 0 else (sizes[i % len(sizes)],)
        lays = layouts if not covering or i == 0 else (layouts[i % len(layouts)],)
        for size in picked:
            if size == LARGE:
                settings = h.large(q) if h.large else []
            else:
                settings = h.model(size, MODELS[size], q) if size in MODELS else h.settings(size, q)
            for s in settings:
                if not set(s.needs) <= k.contract.caps.also:  # extra inputs the kernel does not take
                    continue
                for laid_out in lays:
                    yield Case(s, dtypes, out_choice, laid_out)


# ---- one launch -------------------------------------------------------------------------------


@dataclass
class Prepared:
    """A built case: inputs, params, the output's (shape, dtype name) and the float64 reference."""

    inputs: dict[str, torch.Tensor]
    params: dict[str, Any]
    env: dict[str, Any]
    out_shape: tuple[int, ...]
    out_dtype: str
    laid_out: bool


def prepare(k: BoundKernel, case: Case, gen) -> Prepared | None:
    """Draw the inputs of a case on gen's device; None if the contract does not admit it."""
    inputs, params = HARNESS[k.op.name].build(case.setting, case.dtypes, case.out_choice, gen)
    shapes = {n: tuple(t.shape) for n, t in inputs.items()}
    why, env = rejections(k, case.dtypes, shapes, params)  # the picker's own admission test
    if why:
        return None
    out_dtype = output_dtype(k.contract, case.dtypes, params) or "F32"
    return Prepared(inputs, params, env, output_shape(k.contract, shapes, env), out_dtype, case.laid_out)


def poisoned(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A fresh tensor full of NaN (floats) or all-ones bits (integers)."""
    t = torch.empty(shape, dtype=dtype, device=device)
    return t.fill_(math.nan) if dtype.is_floating_point else t.view(torch.uint8).fill_(0xFF).view(dtype)


GUARD = 64  # poisoned elements before and after an output (64 bytes at least: the output stays 64-byte aligned)


def guarded(shape: tuple[int, ...], dtype: torch.dtype, device, fill: torch.Tensor | None = None) -> tuple:
    """(buffer, view): a poisoned buffer of GUARD + numel + GUARD elements and the [shape] view in its
    middle (holding a copy of `fill`, else poison), so a write past either end of the view shows."""
    n = math.prod(shape)
    buf = poisoned((n + 2 * GUARD,), dtype, device)
    view = buf[GUARD:GUARD + n].view(shape)
    if fill is not None:
        view.copy_(fill)
    return buf, view


def _guard_damage(buf: torch.Tensor) -> int:
    """Bytes of the guard regions of a `guarded` buffer that are not poison any more."""
    b = buf.view(torch.uint8)
    edge = GUARD * buf.element_size()
    clean = poisoned((GUARD,), buf.dtype, buf.device).view(torch.uint8)
    return int((b[:edge] != clean).sum() + (b[-edge:] != clean).sum())


def _changed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: do a and b differ in their bytes (NaN payloads included)?"""
    n = a.element_size()
    return (a.contiguous().view(torch.uint8).view(-1, n) != b.contiguous().view(torch.uint8).view(-1, n)).any(-1) \
        .view(a.shape)


def side_effects(k: BoundKernel, p: Prepared, args: dict, before: dict, skip: str | None) -> list[str]:
    """What a launch changed in its inputs beyond what the op writes (harness `writes`), and written
    elements that do not hold their expected values; `skip`: an in-place output (checked as the output)."""
    writes = HARNESS[k.op.name].writes
    allowed = writes(p.inputs, p.params) if writes is not None else {}
    problems = []
    for name, old in before.items():
        new = args[name]
        if name == skip or not isinstance(new, torch.Tensor) or new.shape != old.shape:
            continue
        diff = _changed(new, old)
        mask, want = allowed.get(name, (None, None))
        if mask is not None:
            mask = mask.to(diff.device)
            if want is not None and bool(_changed(new, want.to(new.device))[mask].any()):
                problems.append(f"{name}: the elements written differ from the expected values")
            diff = diff & ~mask
        if bool(diff.any()):
            problems.append(f"{name}: {int(diff.sum())} elements changed that the op must not write")
    return problems


WGPU_DEVICES = ("vulkan", "gpu")  # the wgpu kernels take host tensors and run on the process's adapter


def torch_device(device: str) -> str:
    """Where a case's torch tensors live: the device itself, or the host for a wgpu device."""
    return "cpu" if device in WGPU_DEVICES else device


def device_args(k: BoundKernel, p: Prepared, device) -> dict:
    """Fresh device copies of the inputs, in their load layout if the case asks for it."""
    args = {n: t.clone().to(torch_device(device)) for n, t in p.inputs.items()}
    return k.apply_load_layouts(args, p.params) if p.laid_out else args


def launch(k: BoundKernel, p: Prepared, device) -> tuple[torch.Tensor, torch.Tensor | None, list[str]]:
    """Run once on fresh copies of the inputs; (result tensor, the poisoned out= passed or None,
    the problems seen around it: guard bytes written, inputs changed beyond the op's writes).
    An in-place kernel's result is the input it updates (placed between guard regions too)."""
    args = device_args(k, p, device)
    spec = k.contract.outputs[0]
    target = in_place_target(spec.shape_rule) if spec.aliasing == "in_place" else None
    buf = None
    if target is not None:
        t = args[target]
        buf, args[target] = guarded(tuple(t.shape), t.dtype, t.device, fill=t)
    before = {n: t.clone() for n, t in args.items() if isinstance(t, torch.Tensor) and n != target}
    out = None
    if target is not None:
        k(**args, **p.params)
        result = args[target]
    else:
        if k.takes_out:
            buf, out = guarded(p.out_shape, torch_dtype(p.out_dtype), torch_device(device))
        result = k(**args, **p.params, out=out) if out is not None else k(**args, **p.params)
        result = result if isinstance(result, (torch.Tensor, tuple)) else out  # (a tuple: several outputs)
    problems = side_effects(k, p, args, before, target)
    if buf is not None and (damage := _guard_damage(buf)):
        problems.insert(0, f"wrote {damage} bytes outside its output (the guard regions around it)")
    return result, out, problems


def in_place_target(shape_rule: str) -> str:
    """The input an in-place output updates (its shape_rule is same_as(that input))."""
    return shape_rule.split("(", 1)[1].rstrip(") ")


def compare(
    k: BoundKernel, got: torch.Tensor, ref: torch.Tensor, out_dtype: str
) -> tuple[float, float, str, str]:
    """(norm-relative error, max absolute error, tolerance text, failure message or '')."""
    c = k.contract
    q = c.outputs[0].fdx.quant if c.outputs[0].fdx else None
    if q is not None:  # a quantized output: decode it with the reference codec first
        got = reference.dequantize(got, by_name(q.ggml_dtypes[0]).type, ref.shape)
    got = got.detach().double()
    ref = ref.to(got.device)
    if tuple(got.shape) != tuple(ref.shape):
        return math.nan, math.nan, "", f"shape {tuple(got.shape)} != expected {tuple(ref.shape)}"
    diff = got - ref
    rel = float(torch.linalg.vector_norm(diff)) / (float(torch.linalg.vector_norm(ref)) or 1.0)
    abs_err = float(diff.abs().max()) if diff.numel() else 0.0
    if not torch.isfinite(got[torch.isfinite(ref)]).all():
        return rel, abs_err, "", "non-finite values where the reference is finite (poison left in out?)"
    max_rel = c.precision.tolerance("max_relative", out_dtype)
    max_abs = c.precision.tolerance("max_absolute", out_dtype)
    if max_rel is None and max_abs is None:
        return rel, abs_err, "", f"the contract declares no tolerance for output dtype {out_dtype}"
    tol, why = [], []
    if max_rel is not None:
        tol.append(f"rel<={max_rel:g}")
        if not rel <= max_rel:
            why.append(f"relative error {rel:.3g} > max_relative {max_rel:g}")
    if max_abs is not None:
        tol.append(f"abs<={max_abs:g}")
        if not abs_err <= max_abs:
            why.append(f"absolute error {abs_err:.3g} > max_absolute {max_abs:g}")
    return rel, abs_err, " ".join(tol), "; ".join(why)


def compare_outputs(k: BoundKernel, got: tuple, ref: tuple, out_dtype: str,
                    out: torch.Tensor | None) -> tuple[float, float, str, str]:
    """compare() for an op of several outputs (MoERoute: weights, then ids): the first within the
    contract's tolerance (in `out` when one was passed), every integer one equal to the reference."""
    if not isinstance(ref, tuple) or len(got) != len(ref):
        return math.nan, math.nan, "", f"{len(got)} outputs, the op has {len(ref) if isinstance(ref, tuple) else 1}"
    if out is not None and got[0].data_ptr() != out.data_ptr():
        return math.nan, math.nan, "", "the launcher ignored out= (its first result is another tensor)"
    if got[0].dtype != torch_dtype(out_dtype):
        return math.nan, math.nan, "", f"output dtype {got[0].dtype} != the contract's {out_dtype}"
    rel, abs_err, tol, why = compare(k, got[0], ref[0], out_dtype)
    for j, (g, r) in enumerate(zip(got[1:], ref[1:], strict=True), 1):
        if g.dtype != r.dtype or tuple(g.shape) != tuple(r.shape) or not torch.equal(g.cpu(), r.cpu()):
            why = "; ".join(filter(None, [why, f"output {j} ({g.dtype} {tuple(g.shape)}) differs from the reference's "
                                               f"({r.dtype} {tuple(r.shape)}), which it must equal"]))
    return rel, abs_err, tol, why


def run_case(k: BoundKernel, case: Case, gen, device: str) -> CaseResult | None:
    """Build, launch, compare one case (twice for bit-stable kernels); None if not admitted."""
    p = prepare(k, case, gen)
    if p is None:
        return None
    shapes = " ".join(f"{n}{list(t.shape)}" for n, t in p.inputs.items())
    res = CaseResult(k.name, case.setting.size, case.label, shapes, False)
    try:
        ref = HARNESS[k.op.name].reference(p.inputs, p.params, case.dtypes)
        got, out, problems = launch(k, p, device)
        if problems:
            res.message = "; ".join(problems)
        elif isinstance(got, tuple):
            res.rel_err, res.abs_err, res.tolerance, res.message = compare_outputs(k, got, ref, p.out_dtype, out)
        elif out is not None and got.data_ptr() != out.data_ptr():
            res.message = "the launcher ignored out= (its result is another tensor)"
        elif got.dtype != torch_dtype(p.out_dtype):
            res.message = f"output dtype {got.dtype} != the contract's {p.out_dtype}"
        else:
            res.rel_err, res.abs_err, res.tolerance, res.message = compare(k, got, ref, p.out_dtype)
        rerun = device != "cpu" or case.setting.size == "odd"
        if rerun and not res.message and k.contract.determinism in ("bitwise", "same_hardware_bitwise"):
            again, _, _ = launch(k, p, device)
            pairs = zip(got, again, strict=True) if isinstance(got, tuple) else [(got, again)]
            res.bit_stable = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in pairs)
            if not res.bit_stable:
                res.message = f"declared {k.contract.determinism} but two runs differ"
    except Exception as e:  # noqa: BLE001 - any exception from a launch is a failed case, not a crash
        res.message = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
    res.passed = not res.message
    return res


def run_conformance(
    registry: Registry | None = None,
    *,
    full: bool = False,
    device: str = "cpu",
    kernels: list[str] | None = None,
    seed: int | None = None,
    sizes: tuple[str, ...] | None = None,
    covering: bool = False,
) -> tuple[list[CaseResult], int]:
    """Run every case of every registrable kernel of the device's backend (or those named):
    Vulkan contracts on a wgpu device, the others on cpu / cuda; (results, seed used).
    `covering`: `cases`' covering subset."""
    reg = registry or load_registry()
    seed = secrets.randbits(31) if seed is None else seed
    gen = torch.Generator().manual_seed(seed)  # inputs are drawn on cpu, then copied to `device`
    sizes = sizes or (SIZE_CLASSES + ((FULL_MODEL, LARGE) if full else ()))
    results = []
    for name, k in reg.kernels.items():
        if kernels and name not in kernels:
            continue
        if (k.contract.backend == "Vulkan") != (device in WGPU_DEVICES):
            continue
        if k.op.name not in HARNESS:
            results.append(CaseResult(name, "-", "-", "-", False, message=f"no harness for op {k.op.name}"))
            continue
        # a C kernel runs on the host whatever the device (the cuda runs check it there too)
        where = "cpu" if k.contract.kernel_source == "c" else device
        for case in cases(k, sizes, covering):
            r = run_case(k, case, gen, where)
            if r is not None:
                results.append(r)
    return results, seed


def format_results(results: list[CaseResult], failures_only: bool = False) -> str:
    """A fixed-width table, one row per case, and a summary line."""
    head = f"{'kernel':<18} {'size':<12} {'dtypes':<26} {'shapes':<30} {'rel_err':>9} {'tolerance':<13}"
    head += " result"
    lines = [head, "-" * len(head)]
    for r in results:
        if failures_only and r.passed:
            continue
        verdict = "ok" if r.passed else f"FAIL: {r.message}"
        if r.passed and r.bit_stable:
            verdict += " (bit-stable)"
        lines.append(
            f"{r.kernel:<18} {r.size:<12} {r.dtypes:<26} {r.shapes:<30} {r.rel_err:>9.2e} "
            f"{r.tolerance:<13} {verdict}"
        )
    n_fail = sum(not r.passed for r in results)
    lines.append(f"{len(results)} cases, {len(results) - n_fail} passed, {n_fail} failed")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m minfer.contracts.conformance", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--full", action="store_true",
                    help=f"add {FULL_MODEL}'s layer sizes and weights above 2^24 values (slow on cpu)")
    ap.add_argument("--device", choices=("cpu", "cuda", *WGPU_DEVICES), default="cpu",
                    help="cpu: the Triton interpreter; vulkan: the WGSL kernels on wgpu's Vulkan adapter")
    ap.add_argument("--kernel", action="append", help="only this kernel (repeatable)")
    ap.add_argument("--seed", type=int, help="random seed (default: fresh; printed for replay)")
    ap.add_argument("--failures", action="store_true", help="list failing cases only")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        set_process_env("TRITON_INTERPRET", "1", default_only=False)  # before the registry imports triton
        # the interpreter computes with numpy, which warns on the inf/NaN arithmetic of random bits
        warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")
    elif args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is available", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    results, seed = run_conformance(full=args.full, device=args.device, kernels=args.kernel, seed=args.seed)
    print(format_results(results, args.failures))
    print(f"seed {seed}, {time.perf_counter() - t0:.1f} s on {args.device}")
    return 0 if results and all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
