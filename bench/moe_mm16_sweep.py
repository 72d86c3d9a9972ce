"""Tile sweep of the grouped expert matmul on f16 tensor cores (kernels/triton/moe.py moe_mm16) at
Qwen3-30B-A3B's shapes (128 experts, 8 used: gate Q4_K [768, 2048], down Q6_K [2048, 768]) and
gpt-oss-20b's (32 experts, 4 used, MXFP4 [2880, 2880] gate and down), for a
decode batch of 16 and a 512-token prompt: µs per call (triton.testing.do_bench, median) of each
config, and which `mm16_config` picks. `--glu`: the gate shapes again as the fused gate + up + SwiGLU call
(moe_mm16_glu on the stacked gate and up experts: two dots a step, about twice the registers, so its best
tile may differ). A study script (bench/NOTES.md), CUDA only.

    python3 bench/moe_mm16_sweep.py [--glu] [--rows 16,512] [--quick]

`--quick`: only the 128-column, 2-block tiles (16, 32 and 64 rows; 4 and 8 warps): the compiles are most
of the sweep's time.
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


CONFIGS = [{"BLOCK_M": bm, "BLOCK_N": bn, "KB": kb, "num_warps": warps, "num_stages": 3}
           for bm, bn, kb, warps in itertools.product((16, 32, 64), (64, 128), (2, 4), (4, 8))
           if warps == 8 or bm * bn <= 4096]  # (4 warps only where the accumulators fit them)


def sweep(label: str, kernel, default: dict, call: tuple, kw: dict, k: int, gemv=None) -> None:
    """Each config of CONFIGS on `call` (best four printed), the default's time, and moe_gemv's / moe_gemv_glu's."""
    res = []
    for cfg in CONFIGS:
        if k % (32 * cfg["KB"]):
            continue
        try:
            res.append((us_of(kernel, *call, **kw, config=cfg), cfg))
        except Exception as exc:  # noqa: BLE001  (a config the compiler refuses: out of resources)
            print(f"  {cfg}: {type(exc).__name__}")
    res.sort(key=lambda r: r[0])
    us_d = us_of(kernel, *call, **kw)
    other = f"; {gemv.__name__} {us_of(gemv, *call, **kw):8.1f} us" if gemv is not None else ""
    print(f"{label:26} default {us_d:8.1f} us {default}{other}", flush=True)
    for us, cfg in res[:4]:
        print(f"{'':26} {us:8.1f} us {cfg}", flush=True)


def main() -> None:
    args = sys.argv[1:]
    glu = "--glu" in args
    rows_list = [int(r) for r in args[args.index("--rows") + 1].split(",")] if "--rows" in args else [16, 512]
    if "--quick" in args:
        CONFIGS[:] = [c for c in CONFIGS if c["BLOCK_N"] == 128 and c["KB"] == 2]
    dev = "cuda"
    g = torch.Generator(device="cpu").manual_seed(0)
    for label, tname, e, used, n, k, per_slot in SHAPES:
        info = QUANT_TABLE[by_name(tname).type]
        w = moe.repack_experts(random_blocks(info, e * n, k, g).to(dev), n, k, info.type, e)
        wglu = None if per_slot or not glu else moe.repack_glu_experts(random_blocks(info, 2 * e * n, k, g).to(dev),
                                                                         n, k, info.type, e)
        for rows in rows_list:
            x = torch.randn(rows, used, k, device=dev) if per_slot else torch.randn(rows, k, device=dev)
            ids = torch.stack([torch.randperm(e)[:used] for _ in range(rows)]).int().to(dev)
            out = torch.empty(rows, used, n, device=dev)
            dflt = moe.mm16_config(rows * used, e, n, k)
            sweep(f"{label} rows {rows}", moe.moe_mm16, dflt, (x, ids, w, n, k, info.type, e), {"out": out}, k,
                  moe.moe_gemv)
            if wglu is not None:
                sweep(f"{label}+up+glu rows {rows}", moe.moe_mm16_glu, dflt, (x, ids, wglu, n, k, info.type, e),
                      {"out": out}, k, moe.moe_gemv_glu)


if __name__ == "__main__":
    main()
