"""The cpu backend's expert matmuls at Qwen3-30B-A3B's shapes (a script, not a test):

    python bench/moe_cpu.py [--threads 2] [--reps 20]

One expert tensor (128 experts of [768, 2048] gate / up, Q4_K; [2048, 768] down, Q6_K as the Q4_K_M
file's more-bits layers, Q8_0) through the two paths of backends/cpu/weights.py `Experts`: one C call
for every chosen expert (`cpu_vnni2_moe`, threads across the experts' column tiles) against one call
per chosen expert (the VNNI GEMM per expert: its threads split one expert's 768 or 2048 columns), for
a decode row (8 slots), a decode batch of 16 (128 slots) and a 64-token prompt chunk. Reports µs per
call and GB/s of the distinct experts' packed bytes (the bytes a call must read)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import numpy as np
    import torch

    from minfer.backends.cpu.weights import Experts
    from minfer.gguf.reader import GGUFReader
    from minfer.gguf.synth import random_blocks
    from minfer.gguf.writer import TensorSpec, write_gguf
    from minfer.kernels.cpu import vnni
    from minfer.quant.types import GGMLType, quant_info

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    if not vnni.available():
        print("no AVX512-VNNI / C compiler here: the grouped kernel does not run", file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    e, used, d, ff = 128, 8, 2048, 768
    g = np.random.default_rng(0)
    print(f"{'tensor':22} {'rows':>5} {'slots':>5} {'experts':>7} {'grouped µs':>11} {'per-expert µs':>14} "
          f"{'GB/s':>7} {'speedup':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, qtype, n, k, per_slot in (("gate Q4_K", GGMLType.Q4_K, ff, d, False),
                                            ("down Q6_K->int4", GGMLType.Q6_K, d, ff, True),
                                            ("down Q8_0", GGMLType.Q8_0, d, ff, True)):
            info = quant_info(qtype)
            data = random_blocks(g, qtype, e * n * k // info.block_elems)
            path = write_gguf(Path(tmp) / f"{qtype.name}.gguf", {"general.architecture": "bench"},
                              [TensorSpec("blk.0.ffn_up_exps.weight", (k, n, e), qtype, lambda data=data: data)])
            with GGUFReader(path) as r:
                ex = Experts(r, r.tensors["blk.0.ffn_up_exps.weight"])
                per_expert_bytes = ex.nbytes / e
                for rows in (1, 16, 64):
                    ids = torch.stack([torch.randperm(e)[:used] for _ in range(rows)]).int()
                    x = torch.randn(rows, used, k) if per_slot else torch.randn(rows, k)
                    touched = int(torch.unique(ids).numel())

                    def timed(fn):
                        fn()
                        t0 = time.perf_counter()
                        for _ in range(a.reps):
                            fn()
                        return (time.perf_counter() - t0) / a.reps * 1e6

                    grouped = timed(lambda ex=ex, x=x, ids=ids: ex(x, ids))
                    single = timed(lambda ex=ex, x=x, ids=ids: ex.per_expert(x, ids))
                    gbs = touched * per_expert_bytes / grouped / 1e3
                    label = f"{name} ({ex.kernel})" if rows == 1 else ""
                    print(f"{label:22} {rows:5} {rows * used:5} {touched:7} {grouped:11.0f} {single:14.0f} {gbs:7.1f} "
                          f"{single / grouped:8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
