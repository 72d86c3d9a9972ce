"""Another q4_vnni.c (e.g. `git show REV:minfer/kernels/cpu/q4_vnni.c > /tmp/old.c`) against the tree's: the same
bits from q4_gemm for every type the kernel reads, at 1-150 rows and one and two activation passes, then both
timed on prompt rows (one pass) and decode rows (two), interleaved (issue 26: a change to the C tiles that must
keep every output's bits).

    python3 bench/studies/cpu_gemm_versions.py OLD.c [--isa avx512] [--types Q4_0,Q4_K] [--threads 1,2]
        [--bits-only]

Prints the count of cases whose outputs differ (0 is the contract for a speed change), then one line per (type,
shape, threads): the best of 9 (prompts) or 25 (decode rows) calls of each, and new / old speed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from minfer.gguf.synth import random_blocks  # noqa: E402
from minfer.kernels import cbuild  # noqa: E402
from minfer.kernels.cpu import vnni  # noqa: E402
from minfer.quant.types import GGMLType, quant_info  # noqa: E402

SHAPES = [(512, 4096, 1024), (128, 4096, 4096), (1, 14336, 4096), (4, 14336, 4096)]  # m x n x k


def packed(qtype: GGMLType, n: int, k: int) -> vnni.Q4Vnni:
    info = quant_info(qtype)
    blocks = random_blocks(np.random.default_rng(1), qtype, n * k // info.block_elems)
    raw = torch.from_numpy(np.ascontiguousarray(blocks).view(np.uint8).reshape(n, info.nbytes(k)).copy())
    return vnni.Q4Vnni([(raw, qtype, n, k)])


def gemm(so, mm: vnni.Q4Vnni, x: torch.Tensor, passes: int, y: torch.Tensor) -> torch.Tensor:
    w, s, z, zm, n_pad, k = mm._ptrs
    rc = so.q4_gemm(w, s, z, zm, n_pad, k, x.data_ptr(), 0, x.shape[0], y.data_ptr(), n_pad, passes, mm.cbits, mm._lut)
    if rc != 0:
        raise SystemExit(f"q4_gemm returned {rc}")
    return y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("--isa", default="avx512")
    ap.add_argument("--types", default=",".join(t.name for t in vnni.ALL_TYPES))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--bits-only", action="store_true")
    args = ap.parse_args()
    types = [GGMLType[t] for t in args.types.split(",")]
    with vnni.isa_forced(args.isa):
        new = vnni._library()
        old = cbuild.build(args.old, vnni.ISAS[args.isa][1], "no old build") if new is not None else None
        if new is None or old is None:
            raise SystemExit(f"no {args.isa} build here")
        if "-DMINFER_AMX" in vnni.ISAS[args.isa][1] and old.amx_init() != 1:  # (else its prompts take the vector tile)
            raise SystemExit("the old amx build got no tile state")
        old.q4_gemm.argtypes = new.q4_gemm.argtypes
        bad = cases = 0
        for qtype in types:
            mm = packed(qtype, 96, 512)
            for m in (1, 2, 3, 4, 5, 6, 7, 13, 64, 150):
                x = torch.randn(m, 512, generator=torch.Generator().manual_seed(m))
                for passes in (1, 2):
                    a, b = (gemm(so, mm, x, passes, torch.full((m, mm.n_pad), float("nan"))) for so in (old, new))
                    cases += 1
                    if not torch.equal(a, b):
                        bad += 1
                        print(f"DIFFER: {qtype.name} {m} rows, {passes} passes, max {float((a - b).abs().max()):.3g}")
        print(f"# {args.isa}: {cases} cases, {bad} differ")
        if args.bits_only:
            return
        for qtype in types:
            for m, n, k in SHAPES:
                passes = 1 if m > 4 else 2
                mm, x = packed(qtype, n, k), torch.randn(m, k)
                y = torch.empty(m, mm.n_pad)
                for t in (int(v) for v in args.threads.split(",")):
                    torch.set_num_threads(t)  # (the kernels' OpenMP regions run on torch's libgomp threads)
                    best = {"old": float("inf"), "new": float("inf")}
                    for _ in range(9 if passes == 1 else 25):
                        for name, so in (("old", old), ("new", new)):
                            t0 = time.perf_counter()
                            gemm(so, mm, x, passes, y)
                            best[name] = min(best[name], time.perf_counter() - t0)
                    print(f"{args.isa:7} {qtype.name:6} {m:4}x{n}x{k} P{passes} {t}t: old {best['old'] * 1e3:7.2f} ms "
                          f"new {best['new'] * 1e3:7.2f} ms  new/old speed {best['old'] / best['new']:.3f}")


if __name__ == "__main__":
    main()
