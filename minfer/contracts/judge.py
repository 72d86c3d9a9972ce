"""The judge: measure every registrable kernel so contract costs are measured, not guessed (CUDA,
or the WGSL kernels on a wgpu adapter with `--device vulkan`).

For each bound kernel at the layer sizes of SmolLM2-135M, Qwen2.5-0.5B and Qwen2.5-7B
(harness.MODELS; decode and 512-token prefill shapes), with operands in their load layout:

- two times per call: `us`, the median of host-launched calls (`triton.testing.do_bench`: the
  launcher's Python work is in it whenever it exceeds the kernel's), and `graph_us`, the device
  time per call of a CUDA-graph replay of 20 launches that rotate over enough operand copies to
  keep the inputs out of L2 (`graph_replay_us`);
- achieved GB/s from the call's compulsory traffic (harness.traffic: operands read once, the
  output written once, counted from the real tensors, so it follows their dtypes) over the
  device time, and its % of the copy bandwidth the judge measures itself (a large
  device-to-device torch copy); the contract's `bytes_moved` formula is evaluated too and a
  row whose formula disagrees with the real traffic by more than 1% says so (`bytes` column);
- the norm-relative error against the float64 reference (harness.py) and whether it is within
  the contract's tolerance,
- bit-stability: five runs, identical bytes or not;
- the kernel's overhead: its host-launched time at the smallest conformance size (`tiny`), which
  the picker reads back as `overhead_ns` (contracts say `provenance: judge_measured`).

Writes `judge.json` (read by registry.read_judge_report; measurements are keyed by kernel
revision, so editing a kernel retires its numbers) and `judge.md` (a table). Needs a GPU: without
one it raises DeviceError. Run: `python -m minfer.contracts.judge --out DIR` (< 1 min on an H200).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..errors import DeviceError, MinferError
from .conformance import (
    WGPU_DEVICES,
    Case,
    Prepared,
    cases,
    compare,
    device_args,
    launch,
    poisoned,
    prepare,
    torch_device,
)
from .expr import parse_arith
from .harness import HARNESS, MODELS, traffic
from .ops import torch_dtype
from .registry import BoundKernel, Registry, load_registry

REPORT_VERSION = 1
BIT_RUNS = 5
COPY_BYTES = 1 << 30
GRAPH_CALLS = 20  # launches per captured graph
ROTATE_BYTES = 256 << 20  # operand bytes a graph rotates over: > 4x an H200's 60 MB L2
BYTES_SLACK = 0.01  # relative disagreement between a contract's bytes_moved and the real traffic

Timer = Callable[[Callable[[], object]], float]  # fn -> median µs
GraphTimer = Callable[[Callable[[], Callable[[], object]], int], float]  # (make a call, copies) -> µs


@dataclass
class Row:
    kernel: str
    model: str
    shapes: str
    dtypes: str
    us: float  # host-launched
    graph_us: float  # device time per call (CUDA-graph replay); NaN when not measured
    gbs: float  # traffic over the device time (graph_us, else us)
    pct_copy: float
    rel_err: float
    within_tolerance: bool
    bit_stable: bool
    traffic_bytes: float = math.nan  # compulsory traffic of the call (harness.traffic)
    contract_bytes: float = math.nan  # the contract's bytes_moved for the call
    error: str = ""  # the exception a launch raised, if any (the row's numbers are then NaN)


def do_bench_us(fn: Callable[[], object]) -> float:
    """Median µs of `fn` on the GPU (triton.testing.do_bench, CUDA-event timed)."""
    from triton.testing import do_bench

    return 1000.0 * do_bench(fn, warmup=10, rep=50, return_mode="median")


def graph_replay_us(make_call: Callable[[], Callable[[], object]], copies: int, reps: int = 10) -> float:
    """Device µs per call: a CUDA graph of GRAPH_CALLS launches rotating over `copies` calls made
    by `make_call` (each with its own operands), replayed `reps` times, timed with CUDA events
    (median). No launcher work, no launch gaps beyond the graph's own, no L2 flush in between."""
    calls = [make_call() for _ in range(max(1, min(copies, GRAPH_CALLS)))]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:  # compile and autotune outside the capture
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(GRAPH_CALLS):
            calls[i % len(calls)]()
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(1000.0 * start.elapsed_time(end) / GRAPH_CALLS)
    return statistics.median(times)


def rotation(nbytes: float) -> int:
    """Operand copies a graph rotates over so that a call's inputs are not left in L2."""
    return max(1, min(GRAPH_CALLS, math.ceil(ROTATE_BYTES / max(nbytes, 1.0))))


def copy_bandwidth(device: str, timer: Timer, nbytes: int = COPY_BYTES) -> float:
    """Bytes/s of a device-to-device copy of `nbytes` (read + write counted)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    us = timer(lambda: dst.copy_(src))
    return 2 * nbytes / (us * 1e-6)


# ---- a wgpu device (the Vulkan contracts): its launchers name their device (`launcher.wgpu_device`);
# operands are uploaded once, a "graph" is a captured recording of GRAPH_CALLS dispatches


def wgpu_device_of(reg: Registry):
    """The wgpu device the registry's Vulkan launchers run on (DeviceError without one)."""
    k = next((k for k in reg.kernels.values() if k.contract.backend == "Vulkan"), None)
    if k is None or not hasattr(k.launcher, "wgpu_device"):
        raise DeviceError("no Vulkan kernel is registered: nothing to judge on a wgpu device")
    return k.launcher.wgpu_device()


def wgpu_timers(dev, reps: int = 20) -> tuple[Timer, GraphTimer]:
    """(host-launched µs: record, submit and wait per call, median; device µs per call: a
    captured recording of GRAPH_CALLS calls rotating over operand copies, replayed, median of the
    replay's GPU-timestamped pass; the replay's wall time, submission and wait included, only
    where the adapter has no timestamps: run 47's H200 rows measured that way carried ~300 µs of
    submit-and-wait per replay, several times a 7B GEMV's own time)."""

    def timer(fn: Callable[[], object]) -> float:
        for _ in range(3):
            fn()
        dev.sync()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            dev.sync()
            times.append(1e6 * (time.perf_counter() - t0))
        return statistics.median(times)

    def graph_timer(make_call: Callable[[], Callable[[], object]], copies: int) -> float:
        calls = [make_call() for _ in range(max(1, min(copies, GRAPH_CALLS)))]
        for call in calls:  # pipelines compiled outside the capture
            call()
        dev.sync()
        rec, _ = dev.capture(lambda: [calls[i % len(calls)]() for i in range(GRAPH_CALLS)])
        dev.replay(rec)
        dev.sync()
        times = []
        for _ in range(max(3, reps // 4)):
            t0 = time.perf_counter()
            s = dev.gpu_seconds(lambda: dev.replay(rec))
            times.append(1e6 * (s if s is not None else time.perf_counter() - t0) / GRAPH_CALLS)
        return statistics.median(times)

    return timer, graph_timer


def _timed_call(k: BoundKernel, p: Prepared, device: str) -> Callable[[], object]:
    """A zero-argument launch of the prepared case with its buffers allocated once (on a wgpu
    device: uploaded once, so a call is the kernel alone, not the host bridge's copies)."""
    if device in WGPU_DEVICES:
        dev = k.launcher.wgpu_device()
        args = {n: dev.upload(t) for n, t in p.inputs.items()}
        if k.takes_out and k.contract.outputs[0].aliasing != "in_place":
            out = dev.empty(p.out_shape, p.out_dtype)
            return lambda: k(**args, **p.params, out=out)
        return lambda: k(**args, **p.params)
    args = device_args(k, p, device)
    if k.takes_out and k.contract.outputs[0].aliasing != "in_place":
        out = poisoned(p.out_shape, torch_dtype(p.out_dtype), device)
        return lambda: k(**args, **p.params, out=out)
    return lambda: k(**args, **p.params)


def measure(
    k: BoundKernel,
    case: Case,
    gen,
    device: str,
    timer: Timer,
    bandwidth: float,
    graph_timer: GraphTimer | None,
) -> Row | None:
    """One judge row (None if the contract does not admit the case)."""
    p = prepare(k, case, gen)
    if p is None:
        return None
    ref = HARNESS[k.op.name].reference(p.inputs, p.params, case.dtypes)
    runs = [launch(k, p, device)[0] for _ in range(BIT_RUNS)]
    bit_stable = all(torch.equal(runs[0].view(torch.uint8), r.view(torch.uint8)) for r in runs[1:])
    rel, _, _, failure = compare(k, runs[0], ref, p.out_dtype)
    out_bytes = runs[0].numel() * runs[0].element_size()
    del runs, ref
    nbytes = float(traffic(k.op.name, p.inputs, p.params, out_bytes))
    contract_bytes = float(parse_arith(k.contract.cost.bytes_moved).evaluate(p.env))
    us = timer(_timed_call(k, p, device))
    graph_us = graph_timer(lambda: _timed_call(k, p, device), rotation(nbytes)) if graph_timer else math.nan
    device_us = graph_us if math.isfinite(graph_us) else us
    gbs = nbytes / (device_us * 1e-6) / 1e9
    shapes = " ".join(f"{n}{list(t.shape)}" for n, t in p.inputs.items())
    pct = 100.0 * gbs * 1e9 / bandwidth
    return Row(k.name, case.setting.size, shapes, case.label, us, graph_us, gbs, pct, rel, not failure,
               bit_stable, nbytes, contract_bytes)


def run_judge(
    registry: Registry | None = None,
    *,
    device: str = "cuda",
    models: tuple[str, ...] = tuple(MODELS),
    kernels: list[str] | None = None,
    timer: Timer | None = None,
    graph_timer: GraphTimer | None = None,
    bandwidth: float | None = None,
    seed: int = 0,
    progress: Callable[[str], None] = lambda s: None,
) -> dict:
    """Measure the registry's kernels; the report as a JSON-ready dict.

    `timer` / `graph_timer` / `bandwidth` default to do_bench, `graph_replay_us` and a measured
    copy; they are parameters so the report logic can be exercised without a GPU (an injected
    `timer` without a `graph_timer` measures no graph times)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise DeviceError("the judge measures CUDA kernels and no CUDA device is available")
    reg = registry or load_registry()
    wgpu = device in WGPU_DEVICES
    if wgpu:
        dev = wgpu_device_of(reg)
        if timer is None:
            timer, graph_timer = wgpu_timers(dev)
        bandwidth = bandwidth or dev.copy_bandwidth()
        backend, device_name = "Vulkan", dev.name
    else:
        if timer is None:
            timer, graph_timer = do_bench_us, graph_timer or graph_replay_us
        bandwidth = bandwidth or copy_bandwidth(device, timer)
        backend = "CUDA" if device == "cuda" else "CPU"
        device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    gen = torch.Generator(device=torch_device(device)).manual_seed(seed)
    report: dict = {
        "minfer_judge": REPORT_VERSION,
        "backend": backend,
        "device": device_name,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "copy_bandwidth_gbs": bandwidth / 1e9,
        "kernels": {},
    }
    for name, k in reg.kernels.items():
        if (kernels and name not in kernels) or k.op.name not in HARNESS:
            continue
        if (k.contract.backend == "Vulkan") != wgpu:  # WGSL kernels on a wgpu adapter, the others on torch's device
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
                row = measure(k, case, gen, device, timer, bandwidth, graph_timer)
            except Exception as e:  # noqa: BLE001 - one failing launch must not lose the whole report
                nan = math.nan
                msg = f"{type(e).__name__}: {e}".splitlines()[0]
                shapes = str(case.setting.shapes)
                row = Row(name, case.setting.size, shapes, case.label, nan, nan, nan, nan, nan, False, False,
                          error=msg)
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


def _bytes_note(r: dict) -> str:
    """'ok' when the contract's bytes_moved matches the real traffic, else what it claims."""
    real, claimed = r.get("traffic_bytes", math.nan), r.get("contract_bytes", math.nan)
    if not (math.isfinite(real) and math.isfinite(claimed)):
        return "-"
    return "ok" if abs(claimed - real) <= BYTES_SLACK * real else f"contract {claimed / real:.2f}x"


def markdown(report: dict) -> str:
    """The report as markdown tables: one row per measurement, then the overheads."""
    lines = [
        f"# minfer judge — {report['device']}, {report['date']}",
        "",
        f"Copy bandwidth (measured): {report['copy_bandwidth_gbs']:.0f} GB/s. µs: host-launched "
        + ("(record, submit, wait); graph µs: device time per call in a replayed recording (GB/s and % use it). "
           if report.get("backend") == "Vulkan" else
           "(do_bench); graph µs: device time per call in a CUDA-graph replay (GB/s and % use it). ")
        +
        "Error: ||out - ref|| / ||ref|| against the float64 reference. bytes: the contract's "
        "bytes_moved against the real traffic.",
        "",
        "| kernel | model | shapes | dtypes | µs | graph µs | GB/s | % copy BW | rel err | in tol "
        "| bit-stable | bytes |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for name, k in report["kernels"].items():
        for r in k["results"]:
            in_tol = "yes" if r["within_tolerance"] else f"NO {r.get('error', '')}".strip()
            stable = "yes" if r["bit_stable"] else "no"
            graph = r.get("graph_us", math.nan)
            lines.append(
                f"| {name} | {r['model']} | {r['shapes']} | {r['dtypes']} | {r['us']:.1f} | {graph:.1f} | "
                f"{r['gbs']:.0f} | {r['pct_copy']:.0f}% | {r['rel_err']:.1e} | {in_tol} | {stable} | "
                f"{_bytes_note(r)} |"
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
    ap.add_argument("--device", choices=("cuda", *WGPU_DEVICES), default="cuda",
                    help="cuda: the Triton / torch kernels; vulkan: the WGSL kernels on wgpu's adapter")


def run_cli(args: argparse.Namespace) -> int:
    """Run the judge for parsed arguments; prints the table; exit status."""
    try:
        report = run_judge(
            device=getattr(args, "device", "cuda"),
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
