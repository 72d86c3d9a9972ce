"""`minfer plan`: which kernel contract runs every node, and what the contracts predict it costs.

    minfer plan [-m MODEL] [--device cuda] [-b B] [--prefill N] [--json] [--judge-report JSON]

Reads the model's header and the kernel contracts only: no weights are uploaded and no GPU is
needed. For a decode step of B rows (default 1), or with --prefill N a prompt chunk of N
tokens, it prints per node the chosen contract and its predicted cost (judge-measured launch
overhead where a judge report is loaded, else the contract's figures) and the sum as a
predicted tok/s, to set beside `minfer bench`. A node no contract accepts is an error naming it.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="the kernel each node would run, and the predicted step time (no GPU needed)",
                       description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", type=Path, default=None, help="GGUF model file (default: the SmolLM2 model)")
    p.add_argument("--device", default="cuda", help="backend whose contracts to plan with: cuda or cpu (matmuls only)")
    p.add_argument("-b", "--batch", type=int, default=1, help="decode rows per step (default 1)")
    p.add_argument("--prefill", type=int, default=0, metavar="N", help="plan a prompt chunk of N tokens instead")
    p.add_argument("--judge-report", type=Path, default=None, help="measured kernel overheads (judge.json)")
    p.add_argument("--by-node", action="store_true", help="one line per node (default: per layer 0 and totals)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=plan)


def plan(a: argparse.Namespace) -> int:
    from ..errors import MinferError

    if a.device not in ("cuda", "cpu"):
        raise MinferError(f"--device {a.device}: `minfer plan` covers the cuda and cpu backends "
                          "(the vulkan backend picks its kernels through contracts too, when it loads a model)")
    if a.batch < 1 or a.prefill < 0:
        raise MinferError("-b must be >= 1 and --prefill >= 0")
    from ..config import EngineConfig
    from ..default_model import default_model_path
    from ..engine import loader
    from ..gguf.reader import GGUFReader

    path = a.model or default_model_path()
    reader = GGUFReader(path)
    rows_per_step = a.prefill or a.batch
    # measured launch overheads (a judge report) instead of the contracts' figures, where given
    config = EngineConfig.from_env(device=a.device, judge_report=str(a.judge_report) if a.judge_report else None)
    # (cpu: matmuls only; the cpu backend's other ops have no contracts)
    be = loader.load(reader, config, progress=False, plan_only=True).backend
    rows = be.plan_rows(rows_per_step, prefill=bool(a.prefill))
    total_ns = sum(r["cost_ns"] for r in rows)
    tok_s = rows_per_step / (total_ns * 1e-9)
    by_kernel: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for r in rows:
        by_kernel[r["kernel"]][0] += 1
        by_kernel[r["kernel"]][1] += r["cost_ns"]
    what = f"prompt chunk of {a.prefill}" if a.prefill else f"decode step of {a.batch} row(s)"
    if a.json:
        print(json.dumps({"model": path.name, "step": what, "nodes": rows, "step_us": total_ns / 1e3,
                          "predicted_tok_s": tok_s}, indent=1))
        return 0
    launches = sum(len(r["kernel"].split("+")) for r in rows)  # "a+b": a node that runs two kernels
    print(f"{path.name}: {what}, {launches} kernel launches")
    shown = rows if a.by_node else [r for r in rows if r["layer"] in (None, 0)]
    widths = [max([w] + [len(r[key]) for r in shown]) for key, w in (("name", 28), ("op", 10), ("kernel", 28))]
    for r in shown:
        layer = "-" if r["layer"] is None else r["layer"]
        mark = "" if r["measured"] else " (contract)"
        print(f"  {r['name']:{widths[0]}} {r['op']:{widths[1]}} L{layer:<3} {r['kernel']:{widths[2]}} "
              f"{r['cost_ns'] / 1e3:9.2f} µs{mark}")
    if not a.by_node and len(shown) < len(rows):
        print(f"  ... {len(rows) - len(shown)} more (layers 1..; --by-node lists them)")
    print("by kernel:")
    for name, (count, ns) in sorted(by_kernel.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name:32} x{count:<4} {ns / 1e3:10.1f} µs  {100 * ns / total_ns:5.1f} %")
    print(f"predicted: {total_ns / 1e3:.1f} µs per step = {tok_s:,.0f} tok/s"
          + (" (matmuls only: the other ops have no cpu contracts)" if a.device == "cpu" else ""))
    return 0
