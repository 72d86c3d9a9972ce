"""The decode GEMVs at 1, 2, 4 and 8 rows of x (small batches, issue 27 item 1) on an H200.

    python bench/gemv_rows.py            # every projection of the 7B Q4_0 and 8B Q4_K_M decode steps

Per projection and row count: the GEMV's device µs (its one-row tile, each row its own programs side
by side; a CUDA graph of launches rotating over weight copies so W is not in L2:
minfer.contracts.judge.graph_replay_us), its share of the copy bandwidth (the weight's bytes once),
and cuBLAS on the f16 copy (linear_f16, what batches of 2-8 rows ran before) at the same rows. Also
checks, compiled, that each row of a batch equals that row launched alone, bit for bit (`same`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = [  # (model, role, qtype, n, k): the decode step's projections (q+k+v and gate+up as one weight)
    ("7B", "qkv", "Q4_0", 4608, 3584), ("7B", "o", "Q4_0", 3584, 3584), ("7B", "gate+up", "Q4_0", 37888, 3584),
    ("7B", "down", "Q4_0", 3584, 18944), ("7B", "vocab", "Q6_K", 152064, 3584),
    ("8B", "qkv", "Q4_K", 6144, 4096), ("8B", "o", "Q4_K", 4096, 4096), ("8B", "gate+up", "Q4_K", 28672, 4096),
    ("8B", "down", "Q6_K", 4096, 14336), ("8B", "down", "Q4_K", 4096, 14336),
]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8")
    args = ap.parse_args(argv)

    import torch

    from minfer.contracts.harness import random_blocks
    from minfer.contracts.judge import graph_replay_us, rotation
    from minfer.kernels.triton import qmatmul, torch_ops
    from minfer.quant.types import QUANT_TABLE, by_name

    dev = "cuda"
    src = torch.empty(1 << 28, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_us = graph_replay_us(lambda: lambda: dst.copy_(src), 1)
    copy_bw = 2 * src.numel() / copy_us / 1e3  # GB/s, read + write
    print(f"copy bandwidth {copy_bw:.0f} GB/s", flush=True)
    gen = torch.Generator().manual_seed(0)
    rows_list = [int(r) for r in args.rows.split(",")]
    print(f"{'model':5} {'role':8} {'type':5} {'n':>6} {'k':>6} {'rows':>4} {'tile':14} {'us':>8} {'% copy':>7} "
          f"{'tok-us':>7} {'f16 us':>8} same", flush=True)
    for model, role, tname, n, k in SHAPES:
        info = by_name(tname)
        raw = random_blocks(QUANT_TABLE[info.type], n, k, gen).reshape(-1).to(dev)
        packs = [qmatmul.repack_gemv(raw.clone() if i else raw, n, k, info.type) for i in range(rotation(raw.numel()))]
        w16 = torch_ops.f16_weight(raw, n, k, info.type)
        w16s = [w16] + [w16.clone() for _ in range(rotation(w16.numel() * 2) - 1)]
        one = qmatmul.gemv_default_config(n, k, info.type)
        for rows in rows_list:
            x = torch.randn(rows, k, device=dev)
            out = torch.empty(rows, n, device=dev)
            f16_us = graph_replay_us(_rotating(w16s, lambda w, x=x, n=n, k=k: torch_ops.linear_f16(x, w, n, k, "F16")),
                                     len(w16s))
            us = graph_replay_us(_rotating(packs, lambda p, x=x, out=out, cfg=one: qmatmul.launch_packed(
                "bench", x, p, out, cfg)), len(packs))
            same = ""
            if rows > 1:  # each row against itself launched alone
                qmatmul.launch_packed("bench", x, packs[0], out, one)
                alone = torch.empty_like(out)
                for i in range(rows):
                    qmatmul.launch_packed("bench", x[i:i + 1], packs[0], alone[i:i + 1], one)
                same = "yes" if torch.equal(out, alone) else f"NO {float((out - alone).abs().max()):.2e}"
            tile = f"r{one.r} wk{one.wk} s{one.split} q{one.q8}"
            pct = 100 * raw.numel() / us / 1e3 / copy_bw
            print(f"{model:5} {role:8} {tname:5} {n:6} {k:6} {rows:4} {tile:14} {us:8.2f} "
                  f"{pct:7.1f} {us / rows:7.2f} {f16_us:8.2f} {same}", flush=True)
    return 0


def _rotating(operands: list, run):
    """make_call for graph_replay_us: each call made runs `run` on the next of `operands`."""
    turn = iter(range(10 ** 9))

    def make():
        op = operands[next(turn) % len(operands)]
        return lambda: run(op)
    return make


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
