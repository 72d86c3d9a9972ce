"""`minfer ps`, `minfer stop`: the resident model processes `minfer run` keeps (Ollama's verbs).

    minfer ps [--json]       each resident process: model, pid, address, idle time, keep-alive, settings
    minfer stop [MODEL]      end the resident processes of MODEL (a file name, its stem, or its path; all without)

resident.py keeps the state files these read; a state file whose process is gone is removed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import MinferError


def add_parser(sub) -> None:
    p = sub.add_parser("ps", help="the resident model processes `minfer run` keeps loaded",
                       description="List the resident model processes (started by `minfer run`; each exits after "
                                   "its keep-alive with no request): model, pid, address, idle time, settings.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=ps)

    p = sub.add_parser("stop", help="unload a model: end its resident processes",
                       description="End the resident processes of MODEL (all of them without MODEL): the model is "
                                   "unloaded now instead of after its keep-alive.")
    p.add_argument("model", nargs="?", default=None, metavar="MODEL",
                   help="a model file's name (SmolLM2-135M-Instruct.Q4_1.gguf), its stem, or its path")
    p.set_defaults(func=stop)


def _idle(st) -> str | float:
    """Seconds idle (the process's /health), or what it is doing instead."""
    from . import resident

    if not st.ready:
        return "loading"
    try:
        status, body = resident.Client(st.url, st.data["token"]).json("GET", "/health")
    except resident.Stale:
        return "not answering"
    return body.get("idle_s", "?") if status == 200 else str(body.get("status", status))


def _settings(opts: dict) -> str:
    c = opts["config"]
    out = [c["device"], f"ctx {c['n_ctx'] or 'default'}", f"kv {c['kv_dtype']}"]
    if c.get("threads"):
        out.append(f"{c['threads']} threads")
    if opts.get("chat_template"):
        out.append("own chat template")
    return ", ".join(out)


def ps(a: argparse.Namespace) -> int:
    from . import resident

    rows = []
    for st in resident.all_states():
        keep = st.data.get("keep_alive_s")
        rows.append({"model": Path(st.data["model"]).name, "path": st.data["model"], "pid": st.pid,
                     "address": st.url or "-", "idle": _idle(st), "keep_alive": keep,
                     "settings": _settings(st.data["options"]), "key": st.data["key"]})
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print("no resident model processes", file=sys.stderr)
        return 0
    table = [("MODEL", "PID", "ADDRESS", "IDLE", "KEEP-ALIVE", "SETTINGS")]
    for r in rows:
        idle = f"{r['idle']:.0f}s" if isinstance(r["idle"], int | float) else r["idle"]
        keep = resident.format_duration(float("inf") if r["keep_alive"] is None else r["keep_alive"])
        table.append((r["model"], str(r["pid"]), r["address"], idle, keep, r["settings"]))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _matches(st, model: str) -> bool:
    path = Path(st.data["model"])
    return model in (path.name, path.stem, str(path)) or Path(model).resolve() == path


def stop(a: argparse.Namespace) -> int:
    from . import resident

    states = resident.all_states()
    chosen = [st for st in states if a.model is None or _matches(st, a.model)]
    if a.model is not None and not chosen:
        running = ", ".join(sorted({Path(st.data["model"]).name for st in states})) or "none"
        raise MinferError(f"no resident process serves {a.model} (resident: {running}; see `minfer ps`)")
    for st in chosen:
        gone = resident.stop(st)
        print(f"minfer: {'stopped' if gone else 'could not stop'} {Path(st.data['model']).name} (pid {st.pid})",
              file=sys.stderr)
    return 0
