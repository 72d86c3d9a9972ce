"""Where a mixture-of-experts step's GPU time goes (issue 25): torch-profiler kernel tables of one
512-token prompt chunk, one batched decode step of B rows and one single-row decode step, each
after warm-up, on a `minfer synth` file (qwen3-30b-a3b Q4_K_M, gpt-oss-20b MXFP4).

    python3 bench/moe_profile.py FILE [--rows 16] [--top 25]

Prints, per phase: wall ms of the step, then the kernels by summed CUDA time (calls, total ms, %
of the phase's kernel time, µs per call). The kernel names are Triton's (`_mmq_kernel`,
`_gemv_kernel`, ...) and torch's (moe_align's argsort / scatter / searchsorted), so the table
says which of the picker's kernels ran and what the grouping costs beside the matmuls.
"""

from __future__ import annotations

import argparse
import collections
import time

import torch
from torch.profiler import ProfilerActivity, profile

from minfer.api import Model
from minfer.backends.base import Batch
from minfer.config import EngineConfig

ACTS = [ProfilerActivity.CUDA] if torch.cuda.is_available() else [ProfilerActivity.CPU]


def table(prof, title: str, wall_ms: float, top: int) -> None:
    agg: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA or ACTS[0] == ProfilerActivity.CPU:
            a = agg[ev.name[:60]]
            a[0] += 1
            a[1] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
    total = sum(v[1] for v in agg.values()) or 1.0
    print(f"\n=== {title}: wall {wall_ms:.2f} ms, kernels {total / 1e3:.2f} ms, "
          f"{sum(v[0] for v in agg.values())} launches")
    print(f"{'kernel':60} {'calls':>6} {'ms':>8} {'%':>6} {'us/call':>8}")
    for name, (n, us) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{name:60} {n:6d} {us / 1e3:8.2f} {100 * us / total:6.1f} {us / n:8.1f}")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, reps: int = 3) -> float:
    sync()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    m = Model(a.file, config=EngineConfig(device=a.device, n_ctx=1024, n_slots=a.rows, prefill_chunk=a.prompt),
              progress=False)
    be, nv = m.engine.backend, m.n_vocab
    ids = [(7 * i + 11) % nv for i in range(a.prompt)]

    def prompt():
        be.forward(Batch.single(ids, 0, slot=0))

    wall = timed(prompt)
    with profile(activities=ACTS) as prof:
        prompt()
        sync()
    table(prof, f"prompt chunk of {a.prompt}", wall, a.top)

    from minfer.engine.params import SamplingParams

    eng = m.engine
    for rows in (a.rows, 1):
        params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
        prompts = [[(13 * i + 7 * j + 1) % nv for i in range(32)] for j in range(rows)]
        seqs = [eng.add(p, params, reuse_prefix=False) for p in prompts]
        for _ in range(40):  # prefill, then warm the decode graphs
            eng.step()
        sync()
        t0 = time.perf_counter()
        for _ in range(20):
            eng.step()
        sync()
        wall = (time.perf_counter() - t0) / 20 * 1e3
        with profile(activities=ACTS) as prof:
            for _ in range(5):
                eng.step()
            sync()
        table(prof, f"decode, {rows} rows (5 steps; wall is one step)", wall, a.top)
        for s in seqs:
            eng.abort(s)
        eng.step()


if __name__ == "__main__":
    main()
