"""The prompt product (q4_gemm) of each build of the cpu C kernels, timed alone on random codes (issue 26:
prompts at 4 / 8 / 16 threads; the amx build against the avx512 one), with a check that the builds' outputs
are the same bits.

    python3 bench/studies/cpu_gemm_builds.py [--builds avx512,amx] [--threads 1,4,16]
        [--shapes 512x9728x896,512x896x4864,128x28672x4096z] [--reps 5]

A shape is m x n x k (rows, output columns, inner size) of 4-bit codes: Q4_0's symmetric form, or with a
stored zero per group (`z` suffix: Q4_1 / Q4_K). Prints one line per (shape, threads, build): the best of
--reps calls in ms and int8 TOP/s (2 m n k / time).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from minfer.kernels.cpu import vnni  # noqa: E402


def case(shape: str, rng: np.random.Generator) -> dict:
    zed = shape.endswith("z")
    m, n, k = (int(v) for v in shape.rstrip("z").split("x"))
    g = k // 32
    return dict(m=m, n=n, k=k, zed=zed,
                W=rng.integers(0, 256, size=n // 16 * g * 256, dtype=np.uint8),
                S=(rng.random(n // 16 * g * 16, dtype=np.float32) * 0.01).astype(np.float16),
                Z=(rng.random(n // 16 * g * 16, dtype=np.float32) * -0.1).astype(np.float16) if zed else None,
                x=rng.standard_normal((m, k), dtype=np.float32))


def gemm(so, c: dict) -> np.ndarray:
    y = np.full((c["m"], c["n"]), np.nan, np.float32)
    z = c["Z"].ctypes.data if c["zed"] else None
    rc = so.q4_gemm(c["W"].ctypes.data, c["S"].ctypes.data, z, 0.0 if c["zed"] else -8.0, c["n"], c["k"],
                    c["x"].ctypes.data, 0, c["m"], y.ctypes.data, c["n"], 1, 4, None)
    if rc != 0:
        raise SystemExit(f"q4_gemm returned {rc}")
    return y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--builds", default="avx512,amx")
    ap.add_argument("--threads", default="1,4,16")
    ap.add_argument("--shapes", default="512x9728x896,512x896x4864,128x28672x4096z")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    libs = {}
    for b in args.builds.split(","):
        so = vnni._build(b)
        print(f"# {b}: {'built' if so is not None else 'not available on this machine'}")
        if so is not None:
            libs[b] = so
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        c = case(shape, rng)
        outs = {b: gemm(so, c) for b, so in libs.items()}
        first = next(iter(outs.values()))
        same = all(np.array_equal(o, first) for o in outs.values())
        print(f"## {shape}: the builds' outputs {'are the same bits' if same else 'DIFFER'}")
        for t in (int(v) for v in args.threads.split(",")):
            torch.set_num_threads(t)  # (the kernels' OpenMP regions run on torch's libgomp threads)
            for b, so in libs.items():
                best = float("inf")
                for _ in range(args.reps):
                    t0 = time.perf_counter()
                    gemm(so, c)
                    best = min(best, time.perf_counter() - t0)
                tops = 2 * c["m"] * c["n"] * c["k"] / best / 1e12
                print(f"{shape:>18} {t:>3} threads {b:>8}: {best * 1e3:8.2f} ms {tops:6.3f} TOP/s")


if __name__ == "__main__":
    main()
