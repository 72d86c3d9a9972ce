"""How fast minfer starts on the cpu backend (issue 23, item 6), side by side with llama.cpp.

    python bench/start_time.py first-token [-m MODEL] [-r 5] [-t N] [--quiet]  # wall time to the first token
    python bench/start_time.py timeline [-m MODEL] [-r 3] [-t N] [--quiet]     # where a start's time goes
    python bench/start_time.py load -m 8b.gguf [--llama-python /work/llama-venv/bin/python] [-r 3]

first-token: launches `python -m minfer run -n 1 --temp 0 PROMPT` and times from the launch to the
first byte on stdout, and the process's CPU time (less sensitive to other work on a shared machine
than the wall time), two ways: with a resident process (the default `minfer run`: the first run
starts it, with a 10m keep-alive; the timed runs are the later ones, which connect to it) and
in-process (`--no-daemon`: the whole start, interpreter, torch import, load, first prefill); the
first in-process run fills the weight cache (MINFER_CACHE points at a fresh directory), the next
ones use it. Each timed pair is paired with a `python -c "import torch"` in the same seconds (the
floor of any start that imports torch), and the medians are printed; the resident process is
stopped at the end. `--quiet` waits before each pair until
the machine's cores are idle (IDLE of them over a second, up to QUIET_WAIT s).

timeline: the same command in-process, with a mark at each phase (interpreter up, the parser, torch's
import, the rest of minfer's imports, the GGUF header, the tokenizer, the cpu backend's load, the
KV cache, the first prefill): what each costs, per run.

load: the model load alone, each in a fresh process (import excluded, printed apart): minfer's
`load(path, n_ctx=512, n_slots=1)` with a cold weight cache once, then warm; llama-cpp-python's
`Llama(model_path=path, n_ctx=512)`. The file is read once first, so both start from the page cache.
Prints `uptime` first: the numbers mean something on a quiet machine only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MINFER_LOAD = """
import sys, time
t0 = time.perf_counter()
from minfer.api import load
t1 = time.perf_counter()
m = load(sys.argv[1], n_ctx=512, n_slots=1, progress=False)
t2 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f}")
"""

# llama.cpp without its extra buffer types: on this machine its AMX kernels die at their first
# `ldtilecfg` (the sandbox grants no AMX tile state; bench/cpu_vs_llama.py on the arch branch), and
# the switch that turns AMX off also turns off its repacked Q4_0 / Q4_K layouts: its load maps the
# file and repacks nothing.
LLAMA_PLAIN = """
import llama_cpp.llama_cpp as C
_default = C.llama_model_default_params
def _plain():
    p = _default(); p.use_extra_bufts = False; return p
C.llama_model_default_params = _plain
"""

LLAMA_FIRST_TOKEN = """
import sys
from llama_cpp import Llama
""" + LLAMA_PLAIN + """
m = Llama(model_path=sys.argv[1], n_ctx=4096, verbose=False)
for piece in m(sys.argv[2], max_tokens=1, temperature=0, stream=True):
    sys.stdout.write(piece["choices"][0]["text"] or " ")
    sys.stdout.flush()
"""

LLAMA_LOAD = """
import sys, time
t0 = time.perf_counter()
from llama_cpp import Llama
t1 = time.perf_counter()
""" + LLAMA_PLAIN + """
m = Llama(model_path=sys.argv[1], n_ctx=512, verbose=False)
t2 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f}")
"""


# `minfer run` with a mark at each phase of its start (the timeline mode): wraps the functions a
# start calls, in the order it calls them, and prints "seconds-since-process-start name" lines.
TIMELINE = r"""
import os, sys, time, functools
with open("/proc/self/stat") as f:
    ticks = int(f.read().rsplit(")", 1)[1].split()[19])
with open("/proc/uptime") as f:
    up = float(f.read().split()[0])
T0 = time.perf_counter() - (up - ticks / os.sysconf("SC_CLK_TCK"))
marks = [("interpreter up", time.perf_counter() - T0)]
mark = lambda name: marks.append((name, time.perf_counter() - T0))
def wrap(obj, attr, name):
    f = getattr(obj, attr)
    @functools.wraps(f)
    def g(*a, **k):
        r = f(*a, **k)
        mark(name)
        return r
    setattr(obj, attr, g)
import gc
import minfer.cli as cli
args = cli.build_parser().parse_args(sys.argv[1:])
mark("parser built")
gc.disable()  # as the command's load_model (start_without_gc) has it around these imports
import torch
mark("import torch")
import minfer.api as api, minfer.backends as backends, minfer.engine.loader as loader
from minfer.tokenizer.tokenizer import Tokenizer
import minfer.backends.cpu.backend as cb
mark("minfer's other imports")
wrap(api, "GGUFReader", "GGUF header")
wrap(Tokenizer, "from_metadata", "tokenizer")
wrap(loader, "model_graph", "graph")
wrap(cb.CPUBackend, "load", "cpu backend load (registry, cache map, plan)")
wrap(cb.CPUBackend, "allocate", "KV cache, RoPE tables")
wrap(cb.CPUBackend, "forward", "first prefill")
args.func(args)
prev = 0.0
for name, t in marks:
    if name == "first prefill":
        print(f"MARK {t:.4f} {t - prev:.4f} {name}", file=sys.stderr)
        break
    print(f"MARK {t:.4f} {t - prev:.4f} {name}", file=sys.stderr)
    prev = t
"""

QUIET_IDLE = 0.9  # --quiet: both cores at least this idle
QUIET_WAIT = 120.0  # --quiet: the longest wait before a run goes ahead anyway (and says so)


def _idle_over(seconds: float = 1.0) -> float:
    """The fraction of CPU time the machine's cores spent idle over `seconds` (/proc/stat)."""
    def read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[3] + v[4], sum(v)
    i0, t0 = read()
    time.sleep(seconds)
    i1, t1 = read()
    return (i1 - i0) / max(t1 - t0, 1)


def wait_quiet(enabled: bool) -> str:
    """Wait (when enabled) for QUIET_IDLE idle cores; '' or a note that it never got quiet."""
    if not enabled:
        return ""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < QUIET_WAIT:
        if _idle_over() >= QUIET_IDLE:
            return ""
    return " (not quiet)"


def import_torch(env: dict) -> float:
    """Wall seconds of `python -c "import torch"` (interpreter start included)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True, env=env)
    return time.perf_counter() - t0


def run_timed(python: str, code: str, path: str, env: dict) -> tuple[float, float]:
    out = subprocess.run([python, "-c", code, path], capture_output=True, text=True, env=env, timeout=900)
    if out.returncode:
        sys.exit(out.stderr[-3000:])
    imp, ld = out.stdout.split()[-2:]
    return float(imp), float(ld)


def first_token(argv: list[str], env: dict) -> tuple[float, float]:
    """Wall seconds from launching `argv` to the first byte on its stdout, and the process's CPU
    seconds (user + system, the whole run: it ends right after its first token)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    p.stdout.read(1)
    dt = time.perf_counter() - t0
    p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        sys.exit(f"{' '.join(argv[:4])} ... exited with {p.returncode}")
    return dt, usage.ru_utime + usage.ru_stime


def _series(xs: list[float]) -> str:
    return f"{' '.join(f'{x:.2f}' for x in xs)} s (median {statistics.median(xs):.2f}, min {min(xs):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["first-token", "timeline", "load"])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("--quiet", action="store_true", help="wait for idle cores before each timed run")
    ap.add_argument("--llama-python", default="/work/llama-venv/bin/python")
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("-t", "--threads", type=int, default=None, help="first-token: minfer run's -t (default: its own)")
    a = ap.parse_args()
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, PYTHONPATH=str(ROOT), MINFER_CACHE=cache)
        # bytecode written and read as an installed package has it (a PYTHONDONTWRITEBYTECODE=1
        # shell would compile minfer's modules from source at every start)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        flags = ["run", "-n", "1", "--temp", "0", a.prompt]
        flags += (["-m", a.model] if a.model else []) + (["-t", str(a.threads)] if a.threads else [])
        flags += ["--keep-alive", "0"] if a.what != "first-token" else []
        if a.what == "timeline":
            first_token([sys.executable, "-m", "minfer", *flags], env)  # fills the cache
            for _ in range(a.repetitions):
                note = wait_quiet(a.quiet)
                out = subprocess.run([sys.executable, "-c", TIMELINE, *flags], capture_output=True, text=True,
                                     env=env, check=True)
                print(f"--- {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}{note}")
                for line in out.stderr.splitlines():
                    if line.startswith("MARK "):
                        _, t, dt, name = line.split(" ", 3)
                        print(f"  {float(t):6.3f} s  +{float(dt):6.3f}  {name}")
            return
        if a.what == "first-token":
            argv = [sys.executable, "-m", "minfer", *flags, "--no-daemon"]
            kept = [sys.executable, "-m", "minfer", *flags, "--keep-alive", "10m"]
            cold = first_token(argv, env)
            started = first_token(kept, env)
            warm, resident, torch_s, notes = [], [], [], []
            try:
                for _ in range(a.repetitions):
                    notes.append(wait_quiet(a.quiet))
                    torch_s.append(import_torch(env))
                    resident.append(first_token(kept, env))
                    warm.append(first_token(argv, env))
            finally:
                subprocess.run([sys.executable, "-m", "minfer", "stop"], env=env, capture_output=True)
            print(f"minfer run (resident process), wall to the first token: first {started[0]:.2f} s (starts it, "
                  f"loads); then {_series([w for w, _ in resident])}{''.join(sorted(set(notes)))}")
            print(f"  CPU time of the client process: first {started[1]:.2f} s; "
                  f"then {_series([c for _, c in resident])}")
            print(f"minfer run --no-daemon (in-process), wall to the first token: first {cold[0]:.2f} s (fills the "
                  f"cache); then {_series([w for w, _ in warm])}")
            print(f"  CPU time of the process: first {cold[1]:.2f} s; then {_series([c for _, c in warm])}")
            print(f"python -c 'import torch', each just before a run: {_series(torch_s)}")
            print(f"  minfer's own share (median of run - import torch, pairwise): "
                  f"{statistics.median(w - t for (w, _), t in zip(warm, torch_s, strict=True)):.2f} s")
            print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
            if a.model and Path(a.llama_python).exists():
                ll = [first_token([a.llama_python, "-c", LLAMA_FIRST_TOKEN, a.model, a.prompt], dict(os.environ))
                      for _ in range(a.repetitions)]
                print(f"llama-cpp-python, the same (import, Llama(n_ctx=4096), one token): "
                      f"{_series([w for w, _ in ll])}")
                print(f"  CPU time of the process: {_series([c for _, c in ll])}")
            return
        with open(a.model, "rb") as f:  # into the page cache
            while f.read(64 << 20):
                pass
        imp, cold = run_timed(sys.executable, MINFER_LOAD, a.model, env)
        warm = [run_timed(sys.executable, MINFER_LOAD, a.model, env) for _ in range(a.repetitions)]
        print(f"minfer load: first {cold:.2f} s (prepares, writes the cache); then {_series([x[1] for x in warm])}; "
              f"import {imp:.2f} s")
        if Path(a.llama_python).exists():
            ll = [run_timed(a.llama_python, LLAMA_LOAD, a.model, dict(os.environ)) for _ in range(a.repetitions)]
            print(f"llama-cpp-python Llama(n_ctx=512): {_series([x[1] for x in ll])}; import {ll[0][0]:.2f} s")
            ratio = statistics.median(x[1] for x in warm) / statistics.median(x[1] for x in ll)
            print(f"minfer second load / llama.cpp load: {ratio:.2f}x")


if __name__ == "__main__":
    main()
