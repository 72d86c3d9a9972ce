"""Programmatic dependent launch variants on whole models: tg and pp tok/s per variant. Not a test.

Usage: python bench/studies/pdl_study.py MODEL.gguf [MODEL.gguf ...]

A variant sets, per kernel kind (the GEMV, every other Triton kernel), whether PDL is off (0),
releases the next kernel late (1: after the main work) or early (2: at the start), and whether
only kernels captured into CUDA graphs take it. The decode graphs are captured again for each.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from minfer.api import load
from minfer.commands.bench import run_pp, run_tg
from minfer.kernels.triton import _common

VARIANTS = [  # (name, gemv mode, other mode, graph only)
    ("off", 0, 0, False), ("early", 2, 2, False), ("late", 1, 1, False), ("gemv early", 2, 0, False),
    ("gemv late", 1, 0, False), ("other early", 0, 2, False), ("early, graphs only", 2, 2, True),
    ("late, graphs only", 1, 1, True), ("gemv late other early, graphs", 1, 2, True),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("-n", type=int, default=64)
    a = ap.parse_args()
    rows = []
    for path in a.models:
        m = load(path, "cuda", n_ctx=1024, n_slots=1, progress=False)
        for name, g, o, graphs in VARIANTS:
            _common.PDL_MODES.update(gemv=g, other=o)
            _common.PDL_GRAPH_ONLY = graphs
            be = m.engine.backend
            be._graphs.clear()  # captured again, into a fresh memory pool
            be._pool = None
            torch.cuda.synchronize()
            tg = statistics.mean(run_tg(m, a.n, 2))
            pp = statistics.mean(run_pp(m, 512, 2))
            rows.append((path.split("/")[-1], name, tg, pp))
            print(f"{rows[-1][0]:28} {name:32} tg{a.n} {tg:8.1f}  pp512 {pp:9.1f}", flush=True)
        del m
    print("TABLE")
    for r in rows:
        print(f"  {r[0]:28} {r[1]:32} {r[2]:8.1f} {r[3]:9.1f}")


if __name__ == "__main__":
    main()
