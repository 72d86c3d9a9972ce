"""Tile sweep of the grouped expert matmul on f16 tensor cores (kernels/triton/moe.py moe_mm16) at
Qwen3-30B-A3B's shapes (128 experts, 8 used: gate Q4_K [768, 2048], down Q6_K [2048, 768]) and
gpt-oss-20b's (32 experts, 4 used, MXFP4 [2880, 2880] gate and down), for a
decode batch of 16 and a 512-token prompt: µs per call (triton.testing.do_bench, median) of each
config, and which `mm16_config` picks. A study script (bench/NOTES.md), CUDA only.

    python3 bench/moe_mm16_sweep.py
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402

from minfer.contracts.harness import random_blocks  # noqa: E402
from minfer.kernels.triton import moe  # noqa: E402
from minfer.quant.types import QUANT_TABLE, by_name  # noqa: E402

SHAPES = [  # (label, type, experts, used, n, k, x per slot)
    ("qwen3moe gate", "Q4_K", 128, 8, 768, 2048, False),
    ("qwen3moe down", "Q6_K", 128, 8, 2048, 768, True),
    ("gpt-oss gate", "MXFP4", 32, 4, 2880, 2880, False),
    ("gpt-oss down", "MXFP4", 32, 4, 2880, 2880, True),
]


def us_of(kernel, *args, **kw) -> float:
    """Median µs of one call (do_bench: L2 flushed between calls)."""
    return triton.testing.do_bench(lambda: kernel(*args, **kw)) * 1e3


def main() -> None:
    dev = "cuda"
    g = torch.Generator(device="cpu").manual_seed(0)
    for label, tname, e, used, n, k, per_slot in SHAPES:
        info = QUANT_TABLE[by_name(tname).type]
        w = moe.repack_experts(random_blocks(info, e * n, k, g).to(dev), n, k, info.type, e)
        for rows in (16, 512):
            x = torch.randn(rows, used, k, device=dev) if per_slot else torch.randn(rows, k, device=dev)
            ids = torch.stack([torch.randperm(e)[:used] for _ in range(rows)]).int().to(dev)
            out = torch.empty(rows, used, n, device=dev)
            res = []
            for bm, bn, kb in itertools.product((16, 32, 64), (64, 128), (2, 4)):
                if k % (32 * kb):
                    continue
                warps = 4 if bm * bn <= 4096 else 8
                cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "KB": kb, "num_warps": warps, "num_stages": 3}
                call = (x, ids, w, n, k, info.type, e)
                try:
                    us = us_of(moe.moe_mm16, *call, out=out, config=cfg)
                except Exception as exc:  # noqa: BLE001  (a config the compiler refuses: out of resources)
                    print(f"  {cfg}: {type(exc).__name__}")
                    continue
                res.append((us, cfg))
            res.sort(key=lambda r: r[0])
            dflt = moe.mm16_config(rows * used, e, n, k)
            call = (x, ids, w, n, k, info.type, e)
            us_d, gemv = us_of(moe.moe_mm16, *call, out=out), us_of(moe.moe_gemv, *call, out=out)
            print(f"{label:14} rows {rows:4}: default {us_d:8.1f} us {dflt}; moe_gemv {gemv:8.1f} us")
            for us, cfg in res[:4]:
                print(f"{'':24} {us:8.1f} us {cfg}")


if __name__ == "__main__":
    main()
