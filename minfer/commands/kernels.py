"""`minfer kernels` (the contract listing, or `--check FILE...`) and `minfer judge` (measure them)."""

from __future__ import annotations

import argparse
import json


def add_parser(sub) -> None:
    p = sub.add_parser("kernels", help="list kernel contracts and their validation; --check validates files",
                       description="Every contract section of minfer's kernels with its validation result and "
                                   "bound launcher. Exit status 1 when any contract has errors.")
    p.add_argument("--check", nargs="+", metavar="FILE", help="validate these .fkc.md files, do not list")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--judge-report", metavar="JSON", help="read measured overheads from this judge report")
    p.set_defaults(func=kernels)

    j = sub.add_parser("judge", help="measure every registrable kernel on the GPU (µs, GB/s, error, bits)")
    j.add_argument("--out", required=True, help="directory for judge.json and judge.md")
    j.add_argument("--kernel", action="append", help="only this kernel (repeatable)")
    j.add_argument("--model", action="append", help="only these model sizes (repeatable)")
    j.add_argument("--device", choices=("cuda", "vulkan", "gpu"), default="cuda",
                   help="cuda: the Triton / torch kernels; vulkan or gpu: the WGSL kernels on wgpu's adapter")
    j.set_defaults(func=judge)


def kernels(a: argparse.Namespace) -> int:
    from ..contracts.registry import load_registry
    from ..contracts.report import check_files, format_listing, listing

    if a.check:
        return check_files(a.check, as_json=a.json)
    rows = listing(load_registry(judge_report=a.judge_report))
    print(json.dumps(rows, indent=1) if a.json else format_listing(rows))
    return 1 if any(r["errors"] for r in rows) else 0


def judge(a: argparse.Namespace) -> int:
    from ..contracts import judge as j
    from ..errors import MinferError

    unknown = sorted(set(a.model or ()) - set(j.MODELS))
    if unknown:
        raise MinferError(f"--model {unknown[0]!r}: known sizes are {', '.join(j.MODELS)}")
    return j.run_cli(a)
