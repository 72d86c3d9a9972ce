"""Where a cuda step's time goes: device time per kernel family, the gaps, and the host's share.

Usage: python bench/studies/cuda_study.py MODEL.gguf [--prefill 512] [--batch 1]

1. decode: the CUDA-graph replay of one decode step (device time, CUDA events over 50 replays),
   the backend's forward() (host + device, synced), and the engine's step (scheduler + sampler);
2. an eager decode step under torch.profiler: device µs per kernel (summed by name), the sum,
   and the step's span on the device (span - sum = gaps between kernels);
3. the same for one prompt chunk of --prefill tokens;
4. per matmul node of the decode step: its kernel's device µs and % of the copy bandwidth for its
   weight bytes.
Not a test; prints tables.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from minfer.api import load
from minfer.backends.base import Batch
from minfer.engine.params import SamplingParams


def kernel_table(prof, title: str, top: int = 14) -> None:
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by = defaultdict(lambda: [0, 0.0])
    for e in evs:
        name = e.name.split("(")[0][:60]
        by[name][0] += 1
        by[name][1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    total = sum(v[1] for v in by.values())
    if evs:
        start = min(e.time_range.start for e in evs)
        end = max(e.time_range.end for e in evs)
        span = end - start
    else:
        span = 0
    print(f"== {title}: {len(evs)} kernels, device sum {total:.0f} µs, span {span:.0f} µs "
          f"(gaps {span - total:.0f} µs)")
    for name, (n, us) in sorted(by.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {name:60} x{n:<4} {us:9.1f} µs {100 * us / max(total, 1e-9):5.1f} %")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1)
    a = ap.parse_args()
    m = load(a.model, "cuda", n_ctx=1024, n_slots=max(a.batch, 1), progress=False)
    be, eng = m.engine.backend, m.engine
    b = a.batch
    for s in range(b):
        be.forward(Batch.single([(3 * i + s) % m.n_vocab for i in range(64)], 0, slot=s))
    step = Batch.build([(s, 64, [5 + s]) for s in range(b)], list(range(b)), n_decode=b)
    for _ in range(3):
        be.forward(step)
    torch.cuda.synchronize()
    graph = be._graphs[next(x for x in (1, 2, 4, 8, 16, 32, 64) if x >= b), False].graph
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(50):
        graph.replay()
    e1.record()
    torch.cuda.synchronize()
    replay_us = e0.elapsed_time(e1) * 1e3 / 50
    ts = []
    for _ in range(50):
        t0 = time.perf_counter()
        be.forward(step).argmax(-1).tolist()
        ts.append(time.perf_counter() - t0)
    fwd_us = statistics.median(ts) * 1e6
    seq = eng.add([1, 2, 3, 4], SamplingParams(max_tokens=60, temperature=0, ignore_eos=True))
    for _ in range(4):
        eng.step()
    ts = []
    while not seq.finished:
        t0 = time.perf_counter()
        eng.step()
        ts.append(time.perf_counter() - t0)
    step_us = statistics.median(ts) * 1e6
    print(f"== decode of {b} row(s): graph replay {replay_us:.1f} µs device | forward()+argmax {fwd_us:.1f} µs | "
          f"engine.step (1 seq) {step_us:.1f} µs")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # the replayed graph: kernels overlap under PDL
        graph.replay()
        torch.cuda.synchronize()
    kernel_table(prof, f"graph replay of a decode step, {b} row(s)")
    be.use_graphs = False
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        be.forward(step)
        torch.cuda.synchronize()
    kernel_table(prof, f"eager decode step, {b} row(s)")
    if a.prefill:
        chunk = Batch.single([(7 * i + 1) % m.n_vocab for i in range(a.prefill)], 0, slot=0)
        be.forward(chunk)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            be.forward(chunk)
            torch.cuda.synchronize()
        kernel_table(prof, f"prompt chunk of {a.prefill}")
    # per-matmul-role GEMV timing: one call per layer's weight in one CUDA graph (the weights of
    # many layers exceed the L2, as in a real step), device time / calls
    from minfer.commands.bench import copy_bandwidth

    bw = copy_bandwidth("cuda")
    print(f"== decode matmuls, one row (copy bandwidth {bw / 1e9:.0f} GB/s)")
    roles = defaultdict(list)
    for node in m.engine.graph.nodes:
        if str(node.op) == "MatMul" and node.id not in be.parts:  # mixed-type fused weights: per-type kernels
            roles[node.name.split(".")[-1] + " " + be.choices[node.id]["row"].kernel.name].append(node)
    for role, nodes in roles.items():
        calls = [be.matmul_args(node) for node in nodes]
        kern, args = calls[0]
        n, k = args["n"], args["k"]
        x = torch.randn(1, k, device="cuda")
        for kn, a in calls[:2]:
            kn(x=x, **a)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for kn, a in calls:
                kn(x=x, **a)
        g.replay()
        torch.cuda.synchronize()
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        us = e0.elapsed_time(e1) * 1e3 / len(calls)
        w0 = nodes[0].weights["w"]
        wbytes = sum(m.reader.tensors[t.name].nbytes for t in w0.tensors)
        print(f"  {role:12} {kern.name:14} [{n}x{k}] x{len(calls):<3} {us:8.1f} µs {wbytes / us / 1e3:7.0f} GB/s "
              f"{100 * wbytes / (us * 1e-6) / bw:5.1f} %")

if __name__ == "__main__":
    main()
