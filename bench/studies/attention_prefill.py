"""Benchmark: prompt-chunk attention, `attention_prefill` (one Triton launch, tile table on the
device) against `attention_sdpa` (torch SDPA per span), Qwen2.5-7B shapes (28 heads, 4 kv heads,
head_dim 128), f16 cache. Per configuration of spans: wall µs per call (host work included, 50
calls back to back) and, for attention_prefill, device µs per call in a CUDA graph. Not a test.

    python bench/studies/attention_prefill.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from minfer.kernels.triton.attention import attention_prefill, prefill_tiles
from minfer.kernels.triton.torch_ops import attention_sdpa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for batch_matmul
from batch_matmul import graph_us  # noqa: E402

NH, NKV, HD, CTX = 28, 4, 128, 4096
CONFIGS = {"1x128": [128], "4x128": [128] * 4, "8x64": [64] * 8, "1x512": [512], "8x128 (at 1024)": [128] * 8,
           "1x2048": [2048]}


def main() -> None:
    dev = "cuda"
    torch.manual_seed(0)
    ck = torch.randn(1, 9, NKV, CTX, HD, device=dev).half()
    cv = torch.randn(1, 9, NKV, CTX, HD, device=dev).half()
    print(f"{'spans':18} {'rows':>5} {'prefill wall us':>16} {'prefill graph us':>17} {'sdpa wall us':>13}")
    for name, lens in CONFIGS.items():
        start = 1024 if "at 1024" in name else 0
        slots, pos, spans, r = [], [], [], 0
        for i, n in enumerate(lens):
            spans.append((r, i, start, n))
            slots += [i] * n
            pos += range(start, start + n)
            r += n
        q = torch.randn(r, NH * HD, device=dev)
        k = torch.randn(r, NKV * HD, device=dev)
        v = torch.randn(r, NKV * HD, device=dev)
        rs = torch.tensor(slots, dtype=torch.int32, device=dev)
        ps = torch.tensor(pos, dtype=torch.int32, device=dev)
        tiles = torch.tensor(prefill_tiles(spans), dtype=torch.int32, device=dev)
        args = dict(q=q, k=k, v=v, cache_k=ck, cache_v=cv, row_slots=rs, positions=ps, layer=0, n_head=NH,
                    n_head_kv=NKV, head_dim=HD, scale=HD ** -0.5)
        a = attention_prefill(**args, tiles=tiles)
        b = attention_sdpa(**args, spans=spans)
        err = float((a - b).norm() / b.norm())

        def wall(fn) -> float:
            fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(50):
                fn()
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) / 50 * 1e6

        w_p = wall(lambda a=args, t=tiles: attention_prefill(**a, tiles=t))
        w_s = wall(lambda a=args, sp=spans: attention_sdpa(**a, spans=sp))
        out = torch.empty_like(a)
        d_p = graph_us(lambda a=args, t=tiles, o=out: attention_prefill(**a, tiles=t, out=o))
        print(f"{name:18} {r:5} {w_p:16.1f} {d_p:17.1f} {w_s:13.1f}   (rel diff {err:.1e})", flush=True)


if __name__ == "__main__":
    main()
