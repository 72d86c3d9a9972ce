"""Tile sweep of the expert GEMV (kernels/triton/moe.py moe_gemv: the shared GEMV kernel in MOE
mode) at Qwen3-30B-A3B's shapes (128 experts, 8 used: gate Q4_K [768, 2048], down Q6_K
[2048, 768]) and gpt-oss-20b's (32 experts, 4 used, MXFP4 [2880, 2880] gate and down), for one
decode row and a batch of 16: µs per call (replayed in a CUDA graph, median) of each
tile, int8 x included (its quantize launch counted in the call), against `moe_gemv_config`'s
default, with the % of copy bandwidth counting only the chosen experts' bytes. With --glu, the gate
shapes again as the fused gate + up + SwiGLU call (moe_gemv_glu on the stacked gate and up experts:
twice the bytes, one launch). A study script (bench/NOTES.md), CUDA only.

    python3 bench/moe_gemv_sweep.py [--rows 1,16] [--glu] [--copy-gbs 4223]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from moe_mm16_sweep import SHAPES  # noqa: E402  (the same shapes: this script's folder is on the path)

from minfer.contracts.harness import random_blocks  # noqa: E402
from minfer.kernels.triton import moe  # noqa: E402
from minfer.kernels.triton.gemv import GemvConfig  # noqa: E402
from minfer.kernels.triton.qmatmul import Q8_TYPES  # noqa: E402
from minfer.quant.types import QUANT_TABLE, by_name  # noqa: E402

TILES = [(2, 4), (4, 4), (2, 8)]  # (rows per lane, lanes along rows)
WARPS = (1, 2)  # (4 warps: in no top five of the 16-row sweep, 2026-12-05)


ID_SETS = 16  # calls a timing cycles through, each with its own experts: 16 x 8 of 128 experts is every one


def us_of(kernel, x, id_sets, *args, **kw) -> float:
    """Median µs of one call, the calls replayed as a CUDA graph (do_bench_cudagraph): the
    device's time, not the host's ~30 us of Python a launch (plain do_bench measured that at one
    row, 2026-12-05). A replay makes ID_SETS calls, each on other experts, so one call's experts
    (7 MB at one qwen3moe row) are out of L2 (50 MB) by the time they come round again."""
    def calls():
        for ids in id_sets:
            kernel(x, ids, *args, **kw)
    return triton.testing.do_bench_cudagraph(calls) * 1e3 / len(id_sets)


def configs(int8_x: bool):
    for (r, lr), wk, prefetch, q8 in itertools.product(TILES, WARPS, (False, True), (0, 2) if int8_x else (0,)):
        yield GemvConfig(r=r, lr=lr, wk=wk, prefetch=prefetch, q8=q8, maxnreg=168 if prefetch else 128)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copy-gbs", type=float, default=4223.0, help="the GPU's copy bandwidth (GB/s) for %% copy")
    ap.add_argument("--rows", default="1,16", help="decode rows to time, comma-separated")
    ap.add_argument("--glu", action="store_true", help="also the gate shapes' fused gate + up + SwiGLU call")
    args = ap.parse_args()
    dev = "cuda"
    g = torch.Generator(device="cpu").manual_seed(0)
    summary = []
    cases = [(label, moe.moe_gemv, tname, e, used, n, k, per_slot) for label, tname, e, used, n, k, per_slot in SHAPES]
    if args.glu:
        cases += [(label.replace("gate", "gate+up"), moe.moe_gemv_glu, tname, e, used, n, k, per_slot)
                  for label, tname, e, used, n, k, per_slot in SHAPES if not per_slot]
    for label, kernel, tname, e, used, n, k, per_slot in cases:
        info = QUANT_TABLE[by_name(tname).type]
        halves = 2 if kernel is moe.moe_gemv_glu else 1  # (the GLU's weight: the gate experts, then the up ones)
        w = moe.repack_experts(random_blocks(info, halves * e * n, k, g).to(dev), n, k, info.type, halves * e)
        for rows in (int(v) for v in args.rows.split(",")):
            x = torch.randn(rows, used, k, device=dev) if per_slot else torch.randn(rows, k, device=dev)
            id_sets = [torch.stack([torch.randperm(e)[:used] for _ in range(rows)]).int().to(dev)
                       for _ in range(ID_SETS)]
            out = torch.empty(rows, used, n, device=dev)
            call = (x, id_sets, w, n, k, info.type, e)
            gb = halves * sum(ids.unique().numel() for ids in id_sets) / ID_SETS * info.nbytes(n * k) / 1e9
            pct = lambda us, gb=gb: 100 * gb / (us * 1e-6) / args.copy_gbs  # noqa: E731
            us_d = us_of(kernel, *call, out=out)
            res = []
            for cfg in configs(info.type in Q8_TYPES):
                try:
                    us = us_of(kernel, *call, out=out, config=cfg)
                except Exception as exc:  # noqa: BLE001  (a tile the compiler refuses: out of resources)
                    print(f"  {cfg}: {type(exc).__name__}", flush=True)
                    continue
                res.append((us, cfg))
            res.sort(key=lambda r: r[0])
            d = moe.moe_gemv_config(halves * n, k, info.type, rows * used)
            print(f"{label:14} rows {rows:3}: default {us_d:7.1f} us ({pct(us_d):4.1f} % copy) "
                  f"r{d.r} lr{d.lr} wk{d.wk} pf{int(d.prefetch)} q8 {d.q8}", flush=True)
            for us, c in res[:5]:
                print(f"{'':20} {us:7.1f} us ({pct(us):4.1f} %) r{c.r} lr{c.lr} wk{c.wk} pf{int(c.prefetch)} q8 {c.q8}",
                      flush=True)
            if res:
                b = res[0][1]
                summary.append(f"{label:14} {rows:3} rows  default {us_d:7.1f}  best {res[0][0]:7.1f} "
                               f"({us_d / res[0][0]:.2f}x, {pct(res[0][0]):4.1f} % copy)  "
                               f"r{b.r} lr{b.lr} wk{b.wk} pf{int(b.prefetch)} q8 {b.q8}")
    print("\n".join(["--- moe_gemv: default against the sweep's best"] + summary))


if __name__ == "__main__":
    main()
