"""`minfer kernels` and `minfer judge`: the parsers (added by minfer/cli.py) and what they run.

- `minfer kernels`: every contract section of the package (registrable or not): file:line,
  kernel, op, backend, validation result, bound launcher; `--json` for machines.
- `minfer kernels --check FILE.fkc.md ...`: validate any contract files; one line per error
  (rule, section, field, reason); exit status 1 when there is any error.
- `minfer judge --out DIR`: measure the kernels on the GPU (judge.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .registry import Registry, load_registry
from .validate import check_file


def add_kernels_parser(sub) -> None:
    p = sub.add_parser("kernels", help="list kernel contracts and their validation; --check validates files")
    p.add_argument("--check", nargs="+", metavar="FILE", help="validate these .fkc.md files, do not list")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--judge-report", metavar="JSON", help="read measured overheads from this judge report")
    p.set_defaults(func=cmd_kernels)


def add_judge_parser(sub) -> None:
    from . import judge

    p = sub.add_parser("judge", help="measure every registrable kernel on the GPU (µs, GB/s, error, bits)")
    judge.add_arguments(p)
    p.set_defaults(func=cmd_judge)


def cmd_judge(args: argparse.Namespace) -> int:
    from . import judge

    return judge.run_cli(args)


def cmd_kernels(args: argparse.Namespace) -> int:
    if args.check:
        return check_files(args.check, as_json=args.json)
    reg = load_registry(judge_report=args.judge_report)
    rows = listing(reg)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(format_listing(rows))
    return 0


def listing(reg: Registry) -> list[dict]:
    """One dict per contract section: where it is, what it is, whether it validated, what it binds."""
    rows = []
    for f in reg.files:
        for sec in f.sections:
            errors = reg.errors.get(sec.kernel, [])
            bound = reg.kernels.get(sec.kernel)
            measured = reg.measured_overhead_ns(bound) if bound else None
            rows.append(
                {
                    "kernel": sec.kernel,
                    "file": Path(f.path).name,
                    "line": sec.location.line,
                    "op": sec.op,
                    "backend": sec.backend,
                    "registrable": sec.registrable,
                    "valid": not errors,
                    "errors": [str(e) for e in errors],
                    "launcher": sec.entry_point if bound else None,
                    "revision": bound.revision if bound else None,
                    "overhead_ns": measured,
                    "blurb": sec.blurb,
                }
            )
    for path, errors in reg.errors.items():
        if path.endswith(".md"):  # file-level problems (parse errors, front matter)
            rows.append({"kernel": "-", "file": Path(path).name, "line": 0, "op": None, "backend": None,
                         "registrable": False, "valid": False, "errors": [str(e) for e in errors],
                         "launcher": None, "revision": None, "overhead_ns": None, "blurb": ""})
    return rows


def format_listing(rows: list[dict]) -> str:
    head = f"{'kernel':<18} {'op':<14} {'backend':<8} {'reg':<4} {'contract':<26} {'status':<10} launcher"
    lines = [head, "-" * len(head)]
    for r in rows:
        status = "ok" if r["valid"] else f"{len(r['errors'])} error(s)"
        where = f"{r['file']}:{r['line']}"
        launcher = r["launcher"] or ("-" if r["registrable"] else "(describe-only)")
        reg = "yes" if r["registrable"] else "no"
        lines.append(
            f"{r['kernel']:<18} {r['op'] or '-':<14} {r['backend'] or '-':<8} {reg:<4} "
            f"{where:<26} {status:<10} {launcher}"
        )
    bad = [r for r in rows if r["errors"]]
    for r in bad:
        lines += [f"  {r['kernel']}: {e}" for e in r["errors"]]
    n_bound = sum(1 for r in rows if r["launcher"])
    lines.append(f"{len(rows)} sections, {n_bound} bound, {len(bad)} with errors")
    return "\n".join(lines)


def check_files(paths: list[str], as_json: bool = False) -> int:
    """Validate files; print every error (rule, section, field, reason); 1 if any, else 0."""
    report = []
    for path in paths:
        cf, errors = check_file(path)
        report.append(
            {
                "file": path,
                "sections": [s.kernel for s in cf.sections],
                "errors": [
                    {"rule": e.rule, "section": e.section, "field": e.field, "reason": e.reason,
                     "line": getattr(e, "line", None)}
                    for e in errors
                ],
            }
        )
    if as_json:
        print(json.dumps(report, indent=1))
    else:
        for f in report:
            verdict = "ok" if not f["errors"] else f"{len(f['errors'])} error(s)"
            print(f"{f['file']}: {len(f['sections'])} section(s), {verdict}")
            for e in f["errors"]:
                print(f"  {e['rule']:<22} [{e['section']}] {e['field']}: {e['reason']}")
    return 1 if any(f["errors"] for f in report) else 0


def main(argv: list[str] | None = None) -> int:
    """`python -m minfer.contracts.cli [kernels|judge] ...` (the same as the `minfer` subcommands)."""
    ap = argparse.ArgumentParser(prog="python -m minfer.contracts.cli")
    sub = ap.add_subparsers(dest="command", required=True)
    add_kernels_parser(sub)
    add_judge_parser(sub)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
