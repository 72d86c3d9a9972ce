"""What `minfer kernels` prints: the contract listing and the check of outside contract files.

- `listing(registry)`: every contract section of the package (registrable or not): file:line,
  kernel, op, backend, validation result, bound launcher (or why a valid kernel is unbound: a
  package it needs is missing); `format_listing` as a table.
- `check_files(paths)`: validate any contract files; one line per error (rule, section, field,
  reason); exit status 1 when there is any error.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import registry
from .registry import Registry
from .validate import check_file


def shown_path(path: str | Path) -> str:
    """A contract file as the listing names it: its path under minfer/kernels/ (triton/norm.fkc.md
    and wgsl/norm.fkc.md are different files), else its name."""
    p = Path(path).resolve()
    try:
        return p.relative_to(registry.KERNELS_DIR.resolve()).as_posix()
    except ValueError:
        return p.name


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
                    "file": shown_path(f.path),
                    "line": sec.location.line,
                    "op": sec.op,
                    "backend": sec.backend,
                    "registrable": sec.registrable,
                    "valid": not errors,
                    "errors": [str(e) for e in errors],
                    "launcher": sec.entry_point if bound else None,
                    "unbound": reg.unbound.get(sec.kernel),
                    "revision": bound.revision if bound else None,
                    "overhead_ns": measured,
                    "blurb": sec.blurb,
                }
            )
    for path, errors in reg.errors.items():
        if path.endswith(".md"):  # file-level problems (parse errors, front matter)
            rows.append({"kernel": "-", "file": shown_path(path), "line": 0, "op": None, "backend": None,
                         "registrable": False, "valid": False, "errors": [str(e) for e in errors],
                         "launcher": None, "unbound": None, "revision": None, "overhead_ns": None, "blurb": ""})
    return rows


def format_listing(rows: list[dict]) -> str:
    head = f"{'kernel':<18} {'op':<14} {'backend':<8} {'reg':<4} {'contract':<32} {'status':<10} launcher"
    lines = [head, "-" * len(head)]
    for r in rows:
        status = ("unbound" if r.get("unbound") else "ok") if r["valid"] else f"{len(r['errors'])} error(s)"
        where = f"{r['file']}:{r['line']}"
        launcher = r["launcher"] or ("-" if r["registrable"] else "(describe-only)")
        reg = "yes" if r["registrable"] else "no"
        lines.append(
            f"{r['kernel']:<18} {r['op'] or '-':<14} {r['backend'] or '-':<8} {reg:<4} "
            f"{where:<32} {status:<10} {launcher}"
        )
    bad = [r for r in rows if r["errors"]]
    for r in bad:
        lines += [f"  {r['kernel']}: {e}" for e in r["errors"]]
    reasons: dict[str, list[str]] = {}
    for r in rows:
        if r.get("unbound"):
            reasons.setdefault(r["unbound"].split(" needs ", 1)[-1], []).append(r["kernel"])
    lines += [f"  unbound ({len(ks)}: {', '.join(ks[:3])}{', ...' if len(ks) > 3 else ''}): needs {why}"
              for why, ks in reasons.items()]
    n_bound = sum(1 for r in rows if r["launcher"])
    n_unbound = sum(len(ks) for ks in reasons.values())
    lines.append(f"{len(rows)} sections, {n_bound} bound, {len(bad)} with errors"
                 + (f", {n_unbound} unbound (a package is missing)" if n_unbound else ""))
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
