"""Benchmark: decode batches (M = 2..64 rows) through the quantized tiled matmul `q4_0_matmul`
against cuBLAS on the f16 copy (`linear_f16`, what a decode batch runs today), Qwen2.5-7B Q4_0
shapes. Device µs per call from a CUDA graph of 20 calls. Not a test.

    python bench/batch_matmul.py
"""

from __future__ import annotations

import torch

from minfer.kernels.triton.q4_0 import q4_0_matmul, repack_q4_0
from minfer.kernels.triton.torch_ops import f16_weight, linear_f16
from minfer.quant import reference
from minfer.quant.types import GGMLType

SHAPES = {"qkv 4608x3584": (4608, 3584), "o 3584x3584": (3584, 3584), "gate+up 37888x3584": (37888, 3584),
          "down 3584x18944": (3584, 18944)}


def graph_us(fn) -> float:
    """Device µs per call of `fn`: two eager calls, then a CUDA graph of 20 calls replayed 5 times."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(20):
            fn()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(5):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1e3 / 100


def main() -> None:
    torch.manual_seed(0)
    print(f"{'shape':20} " + " ".join(f"{'M=' + str(m) + ' f16/q4':>16}" for m in (1, 2, 4, 8, 16, 32, 64)))
    for name, (n, k) in SHAPES.items():
        raw = reference.quantize(torch.randn(n, k) * 0.02, GGMLType.Q4_0).view(-1).cuda()
        packed = repack_q4_0(raw, n, k)
        w16 = f16_weight(raw, n, k, GGMLType.Q4_0)
        cells = []
        for m in (1, 2, 4, 8, 16, 32, 64):
            x = torch.randn(m, k, device="cuda")
            o1 = torch.empty(m, n, device="cuda")
            o2 = torch.empty(m, n, device="cuda")
            q4_0_matmul(x, packed, n, k, out=o2)  # autotune outside the graph
            a = graph_us(lambda x=x, o=o1, w=w16, n=n, k=k: linear_f16(x, w, n, k, GGMLType.Q4_0, out=o))
            b = graph_us(lambda x=x, o=o2, w=packed, n=n, k=k: q4_0_matmul(x, w, n, k, out=o))
            cells.append(f"{a:7.1f}/{b:7.1f}")
        print(f"{name:20} " + " ".join(f"{c:>16}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
