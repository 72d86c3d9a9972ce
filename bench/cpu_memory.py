"""Benchmark: the cpu backend's load time and resident memory for a model at a context size.

Not a test. Usage:  python bench/cpu_memory.py MODEL.gguf [--ctx 4096] [--threads 2]

Prints the load time, resident memory after load and its peak, then makes every position of
the KV cache resident (as a full context would) and runs one 128-token prefill, and prints
resident and peak memory again beside the file size (issue 11: peak <= file + 2 GB for 8B).
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

from minfer.backends.base import Batch
from minfer.config import EngineConfig
from minfer.engine.engine import Engine
from minfer.gguf.reader import GGUFReader


def rss_gib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    t0 = time.perf_counter()
    eng = Engine.load(GGUFReader(a.model), EngineConfig(n_slots=1, n_ctx=a.ctx, threads=a.threads), progress=False)
    print(f"load {time.perf_counter() - t0:.1f} s, resident {rss_gib():.2f} GiB, peak {peak_gib():.2f} GiB")
    be = eng.backend
    be.cache.k.fill_(1.0)
    be.cache.v.fill_(1.0)
    be.forward(Batch.single([5] * 128, 0))
    print(f"KV cache resident + a 128-token prefill: resident {rss_gib():.2f} GiB, peak {peak_gib():.2f} GiB, "
          f"file {a.model.stat().st_size / 2**30:.2f} GiB (+ 2 GB = {(a.model.stat().st_size + 2e9) / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
