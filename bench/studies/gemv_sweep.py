"""Sweep the decode GEMV's launch configs on a model's real matmul shapes. Not a test.

Usage: python bench/studies/gemv_sweep.py MODEL.gguf [MODEL.gguf ...] [--q8]

For every matmul role of a model (q+k+v, o, gate+up, down, output), every config below is timed
as one CUDA graph of one call per layer (all layers' weights: more than the L2 holds, as in a real
step); device µs per call and % of the copy bandwidth. Prints the best config per shape, then a
line per shape for gemv_config's table. `--q8`: instead, each shape's default config with f32
activations and one or two int8 activation passes (GemvConfig.q8: the launcher's quantize kernel
is in the time), and tile variants around the default with two passes.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import replace

import torch

from minfer.api import load
from minfer.commands.bench import copy_bandwidth
from minfer.kernels.triton.gemv import PREFETCH_REGS, GemvConfig
from minfer.kernels.triton.int4 import Int4Packed, int4_gemv
from minfer.kernels.triton.planes import PLANES_REGS, PlanesPacked, planes_gemv
from minfer.kernels.triton.q4_0 import q4_0_gemv

CONFIGS = [GemvConfig(r=r, lr=lr, wk=wk, split=s, prefetch=pf, maxnreg=128 if pf else 96)
           for r, lr, wk in [(4, 8, 4), (4, 8, 2), (2, 8, 2), (2, 4, 4), (2, 8, 4)]
           for s in (1, 2, 3, 4, 6, 8)
           for pf in (False, True)]


def q8_configs(base: GemvConfig) -> list[GemvConfig]:
    """The default tile at 0 / 1 / 2 activation passes, and two-pass variants of it."""
    out = [replace(base, q8=p) for p in (0, 1, 2)]
    for r, wk, split, pf in [(8, base.wk, base.split, base.prefetch), (base.r, 4 if base.wk == 2 else 2, base.split,
                             base.prefetch), (base.r, base.wk, base.split * 2, base.prefetch),
                             (base.r, base.wk, max(1, base.split // 2), base.prefetch),
                             (base.r, base.wk, base.split, not base.prefetch)]:
        out.append(replace(base, r=r, wk=wk, split=split, prefetch=pf, q8=2, maxnreg=128 if pf or r == 8 else 96))
    return list(dict.fromkeys(out))


def time_calls(calls, cfg, x) -> float:
    w0 = calls[0][1]["w"]
    if cfg.prefetch:  # the register cap the tile compiles without spills for its mode (planes: Q5_1/Q5_K spill)
        mode = w0.mode if isinstance(w0, Int4Packed) else 0
        cfg = replace(cfg, maxnreg=PLANES_REGS if isinstance(w0, PlanesPacked) else PREFETCH_REGS[mode])
    elif isinstance(w0, PlanesPacked):
        cfg = replace(cfg, maxnreg=128)

    def run():
        for _kern, a in calls:
            if isinstance(a["w"], PlanesPacked):
                planes_gemv(x, a["w"], a["n"], a["k"], a["qtype"], config=cfg)
            elif isinstance(a["w"], Int4Packed):
                int4_gemv(x, a["w"], a["n"], a["k"], a["qtype"], config=cfg)
            else:
                q4_0_gemv(x, a["w"], a["n"], a["k"], config=cfg)

    run()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    g.replay()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(3):
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        best = min(best, e0.elapsed_time(e1) * 1e3 / len(calls))
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--q8", action="store_true", help="int8 activations: 0 / 1 / 2 passes and 2-pass tiles")
    a = ap.parse_args()
    bw = copy_bandwidth("cuda")
    table = []
    for path in a.models:
        m = load(path, "cuda", n_ctx=64, n_slots=1, progress=False)
        be = m.engine.backend
        roles = defaultdict(list)
        for node in m.engine.graph.nodes:
            if str(node.op) == "MatMul":
                kern = be.choices[node.id]["row"].kernel
                if kern.name in ("q4_0_gemv", "int4_gemv", "q8_0_gemv", "q6_k_gemv", "q5_gemv", "q3_k_gemv",
                                 "q2_k_gemv") and node.id not in be.parts:
                    roles[(node.name.split(".")[-1], kern.name)].append(node)
        for role, nodes in roles.items():
            calls = [be.matmul_args(node) for node in nodes]
            n, k = calls[0][1]["n"], calls[0][1]["k"]
            wbytes = sum(m.reader.tensors[t.name].nbytes for t in nodes[0].weights["w"].tensors)
            x = torch.randn(1, k, device="cuda")
            results = []
            for cfg in q8_configs(_default_for(n, k, calls[0][1])) if a.q8 else CONFIGS:
                if cfg.split > 1 and (k // 32) // (cfg.split * cfg.block_kb) < 1:
                    continue
                try:
                    us = time_calls(calls, cfg, x)
                except Exception as e:  # noqa: BLE001 (a config the shape cannot take)
                    print(f"  {cfg}: {type(e).__name__}")
                    continue
                results.append((us, cfg))
            results.sort(key=lambda r: r[0])
            default = next((us for us, c in results if _same_tile(c, _default_for(n, k, calls[0][1]))), float("nan"))
            print(f"{path.split('/')[-1]} {role} [{n}x{k}] {calls[0][0].name}: default {default:.1f} µs "
                  f"({100 * wbytes / (default * 1e-6) / bw:.1f} %)")
            for us, cfg in results[:5]:
                print(f"    {us:7.1f} µs {100 * wbytes / (us * 1e-6) / bw:5.1f} %  r={cfg.r} lr={cfg.lr} wk={cfg.wk} "
                      f"split={cfg.split} prefetch={cfg.prefetch} q8={cfg.q8}")
            if a.q8:
                for p in (0, 1, 2):
                    us = next((u for u, c in results if _same_tile(c, _default_for(n, k, calls[0][1])) and c.q8 == p),
                              float("nan"))
                    print(f"  Q8 {role[0]} [{n}x{k}] default tile q8={p}: {us:7.1f} µs "
                          f"{100 * wbytes / (us * 1e-6) / bw:5.1f} %")
            best = results[0][1]
            table.append((n, k, best, results[0][0], default))
    print("TABLE (n, k): r, lr, wk, split, prefetch -> best µs vs default µs")
    for n, k, c, us, d in table:
        print(f"    ({n}, {k}): ({c.r}, {c.lr}, {c.wk}, {c.split}, {c.prefetch}),  # {us:.1f} vs {d:.1f} µs")


def _default_for(n, k, args):
    """The config the launcher picks for this weight (its type's rule)."""
    from minfer.kernels.triton.gemv import gemv_config
    from minfer.kernels.triton.planes import planes_config

    w = args["w"]
    if isinstance(w, PlanesPacked):
        return planes_config(n, k, w.qtype)
    return gemv_config(n, k, isinstance(w, Int4Packed))


def _same_tile(a, b) -> bool:
    return (a.r, a.lr, a.wk, a.split, a.prefetch) == (b.r, b.lr, b.wk, b.split, b.prefetch)


if __name__ == "__main__":
    main()
