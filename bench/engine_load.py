"""The server's workload without HTTP: C requests arriving at once, each P random prompt tokens
and G generated (greedy, ignore_eos), straight through Engine.step. Not a test.

Usage: python bench/engine_load.py MODEL.gguf [--device cuda] [--concurrency 1,16,64] [-p 128] [-n 128]

Per concurrency: aggregate generated tok/s over the whole round (prefill included, as
bench/serve.py counts it), and the time spent in steps that carry prompt chunks vs decode-only
steps, with their counts: what HTTP adds is bench/serve.py's number against this one.
"""

from __future__ import annotations

import argparse
import random
import time

from minfer.api import load
from minfer.engine.params import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=128)
    a = ap.parse_args()
    sizes = [int(x) for x in a.concurrency.split(",")]
    m = load(a.model, a.device, n_ctx=a.p + a.n + 8, n_slots=max(sizes), progress=False)
    eng, rnd = m.engine, random.Random(0)
    params = SamplingParams(max_tokens=a.n, temperature=0, ignore_eos=True)
    for c in [1] + [x for x in sizes for _ in range(2)]:  # (the first round warms up; each size twice: the
        # first of them compiles the Triton variants its row counts specialize to)
        seqs = [eng.add([rnd.randrange(m.n_vocab) for _ in range(a.p)], params, reuse_prefix=False) for _ in range(c)]
        t_pre = t_dec = 0.0
        n_pre = n_dec = 0
        t0 = time.perf_counter()
        while any(not s.finished for s in seqs):
            prefilling = any(s.prefilling for s in seqs) or eng.scheduler.waiting
            ts = time.perf_counter()
            eng.step()
            dt = time.perf_counter() - ts
            if prefilling:
                t_pre, n_pre = t_pre + dt, n_pre + 1
            else:
                t_dec, n_dec = t_dec + dt, n_dec + 1
        wall = time.perf_counter() - t0
        toks = sum(len(s.generated) for s in seqs)
        print(f"concurrency {c:3}: {toks / wall:9.1f} tok/s aggregate | steps with prompts {n_pre:4} "
              f"{1e3 * t_pre:8.1f} ms | decode-only {n_dec:4} {1e3 * t_dec:8.1f} ms", flush=True)


if __name__ == "__main__":
    main()
