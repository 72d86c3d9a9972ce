"""The WGSL GEMV (`vk_qmatvec_q4_0` / `vk_qmatvec`) alone on a wgpu adapter: µs, GB/s of weight
streamed and % of the adapter's copy bandwidth, for 7B-class decode shapes and a few launch
configs (workgroup size WG, invocations per output column TPR).

    python bench/studies/vulkan_gemv.py [--quick]

Each measurement records `reps` dispatches into one compute pass and times their submit + wait:
the per-dispatch figure includes no Python or submit overhead beyond 1 / reps of it.
"""

from __future__ import annotations

import argparse
import time

import torch

import minfer.contracts.registry  # noqa: F401  (triton before a Vulkan driver: wgpu/device.py)
from minfer.contracts.harness import random_blocks
from minfer.kernels.wgpu.device import default_device
from minfer.kernels.wgsl import matmul as vk_matmul
from minfer.quant.types import by_name

# (name, quant, n, k): Qwen2.5-7B decode projections, the SmolLM2 FFN
SHAPES = [("7B ffn_up", "Q4_0", 18944, 3584), ("7B ffn_down", "Q4_0", 3584, 18944), ("7B attn_q", "Q4_0", 3584, 3584),
          ("7B ffn_up", "Q4_K", 18944, 3584), ("7B ffn_up", "Q8_0", 18944, 3584),
          ("135M ffn_up", "Q4_1", 1536, 576)]
CONFIGS = [{"WG": 128, "TPR": 16, "TM": 1}, {"WG": 256, "TPR": 32, "TM": 1}, {"WG": 64, "TPR": 8, "TM": 1},
           {"WG": 256, "TPR": 8, "TM": 1}, {"WG": 128, "TPR": 4, "TM": 1}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the default config only")
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    dev = default_device()
    bw = dev.copy_bandwidth(1 << 30)
    print(f"adapter: {dev.name}; subgroups {dev.subgroups}; copy bandwidth {bw / 1e9:.0f} GB/s")
    g = torch.Generator().manual_seed(0)
    default = dict(vk_matmul.GEMV)
    print(f"{'shape':12} {'type':5} {'n':>6} {'k':>6} {'config':22} {'us':>8} {'GB/s':>7} {'%copy':>6}")
    for name, qt, n, k in SHAPES:
        info = by_name(qt)
        w = dev.upload(random_blocks(info, n, k, g))
        x = dev.upload(torch.randn(1, k))
        out = dev.empty((1, n))
        for cfg in [default] if a.quick else CONFIGS:
            vk_matmul.GEMV.clear()
            vk_matmul.GEMV.update(cfg)
            vk_matmul.qmatvec(x=x, w=w, n=n, k=k, qtype=info.type, out=out)
            dev.sync()
            t0 = time.perf_counter()
            for _ in range(a.reps):
                vk_matmul.qmatvec(x=x, w=w, n=n, k=k, qtype=info.type, out=out)
            dev.sync()
            dt = (time.perf_counter() - t0) / a.reps
            gbs = info.nbytes(k) * n / dt / 1e9
            label = f"WG {cfg['WG']} TPR {cfg['TPR']}"
            print(f"{name:12} {qt:5} {n:6} {k:6} {label:22} {dt * 1e6:8.1f} {gbs:7.1f} {100 * gbs * 1e9 / bw:5.1f}%")
    vk_matmul.GEMV.clear()
    vk_matmul.GEMV.update(default)


if __name__ == "__main__":
    main()
