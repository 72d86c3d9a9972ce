"""How fast minfer starts on the cpu backend (issue 23, item 6), side by side with llama.cpp.

    python bench/start_time.py first-token [-m MODEL] [-r 3]     # `minfer run` wall time to its first token
    python bench/start_time.py load -m 8b.gguf [--llama-python /work/llama-venv/bin/python] [-r 3]

first-token: launches `python -m minfer run -n 1 --temp 0 PROMPT` and times from the launch to the
first byte on stdout (the whole start: interpreter, torch import, load, first prefill); the first
run fills the weight cache (MINFER_CACHE points at a fresh directory), the next ones use it.

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

LLAMA_LOAD = """
import sys, time
t0 = time.perf_counter()
from llama_cpp import Llama
t1 = time.perf_counter()
m = Llama(model_path=sys.argv[1], n_ctx=512, verbose=False)
t2 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f}")
"""


def run_timed(python: str, code: str, path: str, env: dict) -> tuple[float, float]:
    out = subprocess.run([python, "-c", code, path], capture_output=True, text=True, env=env, timeout=900)
    if out.returncode:
        sys.exit(out.stderr[-3000:])
    imp, ld = out.stdout.split()[-2:]
    return float(imp), float(ld)


def first_token(model: str | None, env: dict, prompt: str) -> float:
    argv = [sys.executable, "-m", "minfer", "run", "-n", "1", "--temp", "0", prompt] + (["-m", model] if model else [])
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    p.stdout.read(1)
    dt = time.perf_counter() - t0
    p.stdout.read()
    p.wait()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["first-token", "load"])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--llama-python", default="/work/llama-venv/bin/python")
    ap.add_argument("--prompt", default="The capital of France is")
    a = ap.parse_args()
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, PYTHONPATH=str(ROOT), MINFER_CACHE=cache)
        if a.what == "first-token":
            cold = first_token(a.model, env, a.prompt)
            warm = [first_token(a.model, env, a.prompt) for _ in range(a.repetitions)]
            print(f"minfer run, wall to the first token: first {cold:.2f} s (fills the cache); then "
                  f"{' '.join(f'{x:.2f}' for x in warm)} s (median {statistics.median(warm):.2f})")
            return
        with open(a.model, "rb") as f:  # into the page cache
            while f.read(64 << 20):
                pass
        imp, cold = run_timed(sys.executable, MINFER_LOAD, a.model, env)
        warm = [run_timed(sys.executable, MINFER_LOAD, a.model, env) for _ in range(a.repetitions)]
        print(f"minfer load: first {cold:.2f} s (prepares, writes the cache); then "
              f"{' '.join(f'{x[1]:.2f}' for x in warm)} s (median {statistics.median(x[1] for x in warm):.2f}); "
              f"import {imp:.2f} s")
        if Path(a.llama_python).exists():
            ll = [run_timed(a.llama_python, LLAMA_LOAD, a.model, dict(os.environ)) for _ in range(a.repetitions)]
            print(f"llama-cpp-python Llama(n_ctx=512): {' '.join(f'{x[1]:.2f}' for x in ll)} s "
                  f"(median {statistics.median(x[1] for x in ll):.2f}); import {ll[0][0]:.2f} s")
            ratio = statistics.median(x[1] for x in warm) / statistics.median(x[1] for x in ll)
            print(f"minfer second load / llama.cpp load: {ratio:.2f}x")


if __name__ == "__main__":
    main()
