"""The judge: measure every registrable kernel so contract costs are measured, not guessed (CUDA).

For each bound kernel at the layer sizes of SmolLM2-135M, Qwen2.5-0.5B and Qwen2.5-7B
(harness.MODELS; decode and 512-token prefill shapes), with operands in their load layout:

- median time (`triton.testing.do_bench`, µs),
- achieved GB/s from the contract's `bytes_moved` formula, and its % of the copy bandwidth the
  judge measures itself (a large device-to-device torch copy),
- the norm-relative error against the float64 reference (harness.py) and whether it is within
  the contract's tolerance,
- bit-stability: five runs, identical bytes or not;
- the kernel's overhead: its time at the smallest conformance size (`tiny`), which the picker
  reads back as `overhead_ns` (contracts say `provenance: judge_measured`).

Writes `judge.json` (read by registry.read_judge_report; measurements are keyed by kernel
revision, so editing a kernel retires its numbers) and `judge.md` (a table). Needs a GPU: without
one it raises DeviceError. Run: `python -m minfer.contracts.judge --out DIR` (< 4 min on an H200).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..errors import DeviceError, MinferError
from .conformance import Case, Prepared, cases, compare, device_args, launch, poisoned, prepare
from .expr import parse_arith
from .harness import HARNESS, MODELS
from .ops import torch_dtype
from .registry import BoundKernel, Registry, load_registry

REPORT_VERSION = 1
BIT_RUNS = 5
COPY_BYTES = 1 << 30

Timer = Callable[[Callable[[], object]], float]  # fn -> median µs


@dataclass
class Row:
    kernel: str
    model: str
    shapes: str
    dtypes: str
    us: float
    gbs: float
    pct_copy: float
    rel_err: float
    within_tolerance: bool
    bit_stable: bool
    error: str = ""  # the exception a launch raised, if any (the row's numbers are then NaN)


def do_bench_us(fn: Callable[[], object]) -> float:
    """Median µs of `fn` on the GPU (triton.testing.do_bench, CUDA-event timed)."""
    from triton.testing import do_bench

    return 1000.0 * do_bench(fn, warmup=10, rep=50, return_mode="median")


def copy_bandwidth(device: str, timer: Timer, nbytes: int = COPY_BYTES) -> float:
    """Bytes/s of a device-to-device copy of `nbytes` (read + write counted)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    us = timer(lambda: dst.copy_(src))
    return 2 * nbytes / (us * 1e-6)


def _timed_call(k: BoundKernel, p: Prepared, device: str) -> Callable[[], object]:
    """A zero-argument launch of the prepared case with its buffers allocated once."""
    args = device_args(k, p, device)
    if k.takes_out and k.contract.outputs[0].aliasing != "in_place":
        out = poisoned(p.out_shape, torch_dtype(p.out_dtype), device)
        return lambda: k(**args, **p.params, out=out)
    return lambda: k(**args, **p.params)


def measure(k: BoundKernel, case: Case, gen, device: str, timer: Timer, bandwidth: float) -> Row | None:
    """One judge row (None if the contract does not admit the case)."""
    p = prepare(k, case, gen)
    if p is None:
        return None
    ref = HARNESS[k.op.name].reference(p.inputs, p.params, case.dtypes)
    runs = [launch(k, p, device)[0] for _ in range(BIT_RUNS)]
    bit_stable = all(torch.equal(runs[0].view(torch.uint8), r.view(torch.uint8)) for r in runs[1:])
    rel, _, _, failure = compare(k, runs[0], ref, p.out_dtype)
    del runs, ref
    us = timer(_timed_call(k, p, device))
    nbytes = float(parse_arith(k.contract.cost.bytes_moved).evaluate(p.env))
    gbs = nbytes / (us * 1e-6) / 1e9
    shapes = " ".join(f"{n}{list(t.shape)}" for n, t in p.inputs.items())
    pct = 100.0 * gbs * 1e9 / bandwidth
    return Row(k.name, case.setting.size, shapes, case.label, us, gbs, pct, rel, not failure, bit_stable)


def run_judge(
    registry: Registry | None = None,
    *,
    device: str = "cuda",
    models: tuple[str, ...] = tuple(MODELS),
    kernels: list[str] | None = None,
    timer: Timer | None = None,
    bandwidth: float | None = None,
    seed: int = 0,
    progress: Callable[[str], None] = lambda s: None,
) -> dict:
    """Measure the registry's kernels; the report as a JSON-ready dict.

    `timer` / `bandwidth` default to do_bench and a measured copy; they are parameters so the
    report logic can be exercised without a GPU."""
    if device == "cuda" and not torch.cuda.is_available():
        raise DeviceError("the judge measures CUDA kernels and no CUDA device is available")
    reg = registry or load_registry()
    timer = timer or do_bench_us
    bandwidth = bandwidth or copy_bandwidth(device, timer)
    gen = torch.Generator(device=device).manual_seed(seed)
    report: dict = {
        "minfer_judge": REPORT_VERSION,
        "backend": "CUDA" if device == "cuda" else "CPU",
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "copy_bandwidth_gbs": bandwidth / 1e9,
        "kernels": {},
    }
    for name, k in reg.kernels.items():
        if (kernels and name not in kernels) or k.op.name not in HARNESS:
            continue
        t0 = time.perf_counter()
        rows, tiny = [], None
        seen: set[tuple] = set()
        for case in cases(k, ("tiny",) + tuple(models)):
            # operands in their load layout (if any); one output-dtype choice per input dtypes;
            # the overhead from the first tiny case only
            key = (tuple(case.dtypes.items()), case.setting.size, str(case.setting.shapes))
            skip_tiny = case.setting.size == "tiny" and tiny is not None
            if case.laid_out != bool(k.load_layouts) or key in seen or skip_tiny:
                continue
            seen.add(key)
            try:
                row = measure(k, case, gen, device, timer, bandwidth)
            except Exception as e:  # noqa: BLE001 - one failing launch must not lose the whole report
                nan = math.nan
                msg = f"{type(e).__name__}: {e}".splitlines()[0]
                row = Row(name, case.setting.size, str(case.setting.shapes), case.label, nan, nan, nan, nan,
                          False, False, msg)
                progress(f"{name} {case.setting.size} {case.label}: {msg}")
            if row is None:
                continue
            if case.setting.size == "tiny":
                tiny = None if row.error else row.us  # a failed tiny case: try the next one
            else:
                rows.append(row)
        report["kernels"][name] = {
            "revision": k.revision,
            "overhead_ns": None if tiny is None else tiny * 1000.0,
            "results": [asdict(r) for r in rows],
        }
        progress(f"{name}: {len(rows)} shapes in {time.perf_counter() - t0:.1f} s")
    return report


def markdown(report: dict) -> str:
    """The report as markdown tables: one row per measurement, then the overheads."""
    lines = [
        f"# minfer judge — {report['device']}, {report['date']}",
        "",
        f"Copy bandwidth (measured): {report['copy_bandwidth_gbs']:.0f} GB/s. "
        "Error: ||out - ref|| / ||ref|| against the float64 reference.",
        "",
        "| kernel | model | shapes | dtypes | µs | GB/s | % copy BW | rel err | in tol | bit-stable |",
        "|---|---|---|---|---:|---:|---:|---:|---|---|",
    ]
    for name, k in report["kernels"].items():
        for r in k["results"]:
            in_tol = "yes" if r["within_tolerance"] else f"NO {r.get('error', '')}".strip()
            stable = "yes" if r["bit_stable"] else "no"
            lines.append(
                f"| {name} | {r['model']} | {r['shapes']} | {r['dtypes']} | {r['us']:.1f} | {r['gbs']:.0f} | "
                f"{r['pct_copy']:.0f}% | {r['rel_err']:.1e} | {in_tol} | {stable} |"
            )
    lines += ["", "| kernel | overhead (tiny case) |", "|---|---:|"]
    for name, k in report["kernels"].items():
        overhead = "-" if k["overhead_ns"] is None else f"{k['overhead_ns'] / 1000:.1f} µs"
        lines.append(f"| {name} | {overhead} |")
    return "\n".join(lines) + "\n"


def write_report(report: dict, out_dir: str | Path) -> tuple[Path, Path]:
    """Write judge.json and judge.md into `out_dir`; their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / "judge.json", out / "judge.md"
    js.write_text(json.dumps(report, indent=1, allow_nan=True))
    md.write_text(markdown(report))
    return js, md


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", required=True, help="directory for judge.json and judge.md")
    ap.add_argument("--kernel", action="append", help="only this kernel (repeatable)")
    ap.add_argument("--model", action="append", choices=list(MODELS), help="only these sizes (repeatable)")


def run_cli(args: argparse.Namespace) -> int:
    """Run the judge for parsed arguments; prints the table; exit status."""
    try:
        report = run_judge(
            kernels=args.kernel,
            models=tuple(args.model or MODELS),
            progress=lambda s: print(s, file=sys.stderr),
        )
    except MinferError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    js, md = write_report(report, args.out)
    print(md.read_text())
    print(f"wrote {js} and {md}")
    bad = [r for k in report["kernels"].values() for r in k["results"] if not r["within_tolerance"]]
    return 1 if bad or not math.isfinite(report["copy_bandwidth_gbs"]) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minfer.contracts.judge", description=__doc__.split("\n")[0])
    add_arguments(ap)
    return run_cli(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
