"""cpu decode beside another busy process: how libgomp's barrier wait moves it (a laptop is rarely idle).

A decode token of the C program is ~240 steps, each ending in an OpenMP barrier. With as many threads as cores and
one more runnable process, a thread is often off its core at a barrier: its team spins until the kernel gives it
back a core (the spinning thread holding one of them). libgomp spins GOMP_SPINCOUNT times (default 300,000, ~0.1-1 ms)
before it sleeps on a futex; a shorter spin gives the core back sooner but costs a wake-up wherever a barrier waits
longer than the spin on an idle machine.

    python3 bench/studies/cpu_contention.py [MODEL] [--threads 2] [--tokens 64] [--spins default,100000,10000,1000]

For each GOMP_SPINCOUNT (a fresh process each: libgomp reads it once) and with 0 and 1 busy competitors (a Python
`while True` loop, unpinned), the decode tok/s of `--tokens` greedy tokens, the median of 3 runs after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER = r"""
import json, sys, time
from minfer.api import load
path, threads, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
m = load(path, "cpu", n_slots=1, n_ctx=tokens + 64, threads=threads, progress=False)
m.generate("The capital of France is", max_tokens=8, temperature=0)
rates = []
for _ in range(3):
    m.generate("The capital of France is", max_tokens=tokens, temperature=0, ignore_eos=True)
    st = m.last_stats
    rates.append((st.generated_tokens - 1) / st.decode_seconds)
print(json.dumps(rates))
"""


def run(model: str, threads: int, tokens: int, spin: str, busy: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if spin != "default":
        env["GOMP_SPINCOUNT"] = spin
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        out = subprocess.run([sys.executable, "-c", WORKER, model, str(threads), str(tokens)], env=env,
                             capture_output=True, text=True, timeout=900)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    if out.returncode:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--spins", default="default,100000,10000,1000")
    args = ap.parse_args()
    model = args.model
    if model is None:
        sys.path.insert(0, str(ROOT))
        from minfer.default_model import default_model_path

        model = str(default_model_path())
    print("| GOMP_SPINCOUNT | busy competitors | decode tok/s (3 runs) | median |\n|---|---:|---|---:|")
    for spin in args.spins.split(","):
        for busy in (0, 1):
            rates = run(model, args.threads, args.tokens, spin, busy)
            print(f"| {spin} | {busy} | {', '.join(f'{r:.1f}' for r in rates)} | {statistics.median(rates):.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
