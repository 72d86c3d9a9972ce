"""Benchmark: the int8 MMQ (kernels/triton/mmq.py) against cuBLAS on the f16 copy (`linear_f16`, what
decode batches and prompt chunks run by default) at Qwen2.5-7B's projection shapes, for M = 1 .. 512
rows, on Q4_0 and Q4_K weights; M = 1 also shows the decode GEMV. Device µs per call from a CUDA
graph of 20 calls (bench/batch_matmul.py's timing); the autotuned MMQ config per cell is printed
after the tables. Not a test.

    python bench/mmq_matmul.py [--types Q4_0,Q4_K] [--ms 1,2,4,8,16,32,64,512]
"""

from __future__ import annotations

import argparse
import time

import torch
from batch_matmul import SHAPES, graph_us  # bench/ is the script's path: the same shapes and timing

from minfer.contracts.harness import random_blocks
from minfer.kernels.triton import mmq
from minfer.kernels.triton.qmatmul import gemv_default_config, launch_packed, repack_gemv
from minfer.kernels.triton.torch_ops import f16_weight, linear_f16
from minfer.quant.types import QUANT_TABLE, GGMLType

Q_BYTES = {GGMLType.Q4_0: 18 / 32, GGMLType.Q4_K: 144 / 256, GGMLType.Q6_K: 210 / 256, GGMLType.Q8_0: 34 / 32}


def weight(t: GGMLType, n: int, k: int) -> torch.Tensor:
    """Random valid blocks of an [n, k] weight on the GPU (speed does not depend on the values)."""
    return random_blocks(QUANT_TABLE[t], n, k, torch.Generator(device="cuda").manual_seed(n + k)).view(-1)


def time_shape(t: GGMLType, n: int, k: int, ms: list[int]) -> list[tuple]:
    """(m, cuBLAS µs, MMQ µs, GEMV µs or None, the MMQ's autotuned config) for each M."""
    raw = weight(t, n, k)
    packed = repack_gemv(raw, n, k, t)
    w16 = f16_weight(raw, n, k, t)
    lb, hb, _, mode = mmq.layout_of(packed)
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda")
        o1, o2 = torch.empty(m, n, device="cuda"), torch.empty(m, n, device="cuda")
        mmq.mmq_matmul(x, packed, n, k, t, out=o2)  # autotune outside the graph
        want = (triton_bucket(m), n, k, lb, hb, mode)
        cfg = next((c for key, c in mmq._mmq_tuned.cache.items() if tuple(key[:6]) == want), None)
        a = graph_us(lambda x=x, o=o1: linear_f16(x, w16, n, k, t, out=o))
        b = graph_us(lambda x=x, o=o2: mmq.mmq_matmul(x, packed, n, k, t, out=o))
        c = None
        if m == 1:
            gcfg, o3 = gemv_default_config(n, k, t), torch.empty(1, n, device="cuda")
            c = graph_us(lambda x=x, o=o3, g=gcfg: launch_packed("gemv", x, packed, o, g))
        rows.append((m, a, b, c, cfg))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="Q4_0,Q4_K")
    ap.add_argument("--ms", default="1,2,4,8,16,32,64,512")
    args = ap.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    torch.manual_seed(0)
    chosen, summary = [], []
    for tname in args.types.split(","):
        t = GGMLType[tname]
        print(f"\n{tname}: µs per call, cuBLAS f16 / MMQ (M=1: f16 / MMQ / GEMV)")
        print(f"{'shape':20} " + " ".join(f"{'M=' + str(m):>17}" for m in ms))
        for name, (n, k) in SHAPES.items():
            t0 = time.time()
            cells = []
            for m, a, b, c, cfg in time_shape(t, n, k, ms):
                chosen.append(f"{tname} {name} M={m}: {cfg}")
                cells.append(f"{a:6.1f}/{b:6.1f}" + (f"/{c:.1f}" if c is not None else ""))
                summary.append((tname, name, m, a, b, n * k * Q_BYTES[t] / (b * 1e-6) / 1e9))
            print(f"{name:20} " + " ".join(f"{c:>17}" for c in cells) + f"   ({time.time() - t0:.0f} s)", flush=True)
            torch.cuda.empty_cache()
    print("\nautotuned MMQ configs:")
    for line in chosen:
        print(" ", line)
    print("\nsummary: one 7B layer's 4 projections, cuBLAS f16 µs / MMQ µs (speedup); MMQ GB/s of W per shape")
    for tname in args.types.split(","):
        for m in ms:
            rows = [r for r in summary if r[0] == tname and r[2] == m]
            a, b = sum(r[3] for r in rows), sum(r[4] for r in rows)
            print(f"  {tname} M={m:<4} {a:8.1f} / {b:8.1f} µs ({a / b:4.2f}x)  GB/s "
                  + " ".join(f"{r[5]:5.0f}" for r in rows))


def triton_bucket(m: int) -> int:
    return 1 << (m - 1).bit_length()


if __name__ == "__main__":
    main()
