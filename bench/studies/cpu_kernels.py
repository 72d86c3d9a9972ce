"""Benchmark: the cpu matmul and decode-attention primitives behind the kernel choice (issue 11).

Not a test. Usage:  python bench/studies/cpu_kernels.py [torch|vnni|cold|attention ...] [--threads 2]

- torch:     torch 2.13's CPU int8 / int4 / bf16 options at m = 128 (4096x4096, 14336x4096).
- vnni:      the C kernel (cpu_q4_vnni) against torch's int4 kernel at m = 1, 8, 128, 8B and
             SmolLM2 layer shapes (the weights stay in cache between repeats).
- cold:      one- and two-pass decode rows streaming weights that do not fit in cache.
- attention: the C decode attention against a loop of SDPA calls, L = 64 and 540, B = 1 and 8.
- embed:     a decode step's token embedding row, embed_rows (C) against the reference's torch decoder, SmolLM2's
             Q8_0 [49152, 576] and Qwen2.5-0.5B's Q4_0 [151936, 896] tables, warm and after 64 MB streamed.
Prints medians; quote them only from a quiet machine (bench/NOTES.md).
"""

# ruff: noqa: B023  (every lambda below is timed at once, inside the loop that binds its variables)
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from minfer.backends.cpu import ops as cpu_ops
from minfer.kernels.cpu import vnni as cpu_vnni
from minfer.kernels.cpu.matmul import pack_int4
from minfer.quant.reference import quantize
from minfer.quant.types import GGMLType


def timed(f, n: int) -> float:
    f()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def torch_options() -> None:
    for n, k in ((4096, 4096), (14336, 4096)):
        m, flops = 128, 2 * 128 * n * k
        xa = torch.randint(-127, 127, (m, k), dtype=torch.int8)
        wb = torch.randint(-127, 127, (k, n), dtype=torch.int8)
        xf, xb = torch.randn(m, k), torch.randn(m, k).bfloat16()
        wq = torch.quantize_per_channel(torch.randn(n, k), torch.rand(n) * 0.01 + 1e-3,
                                        torch.zeros(n, dtype=torch.long), 0, torch.qint8)
        rows = {"torch._int_mm": lambda: torch._int_mm(xa, wb),
                "_weight_int8pack_mm": lambda: torch.ops.aten._weight_int8pack_mm(
                    xb, wb.t().contiguous(), torch.rand(n).bfloat16()),
                "bf16 F.linear": lambda w=torch.randn(n, k).bfloat16(): F.linear(xb, w)}
        for engine in ("fbgemm", "onednn"):
            torch.backends.quantized.engine = engine
            packed = torch.ops.quantized.linear_prepack(wq, None)
            rows[f"linear_dynamic ({engine})"] = lambda p=packed: torch.ops.quantized.linear_dynamic(xf, p)
        p, sz = pack_int4(torch.randint(0, 16, (n, k), dtype=torch.uint8)), torch.rand(k // 32, n, 2).bfloat16()
        rows["torch int4 (_weight_int4pack_mm_for_cpu)"] = lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(
            xb, p, 32, sz)
        for name, f in rows.items():
            print(f"{n}x{k} m=128 {name:42s} {flops / timed(f, 5) / 1e9:7.0f} GOP/s")


def vnni_vs_int4() -> None:
    for n, k in ((4096, 4096), (14336, 4096), (960, 576), (576, 576), (3072, 576), (576, 1536)):
        mm = cpu_vnni.Q4Vnni([(quantize(torch.randn(n, k), GGMLType.Q4_0), GGMLType.Q4_0, n, k)])
        p, sz = pack_int4(torch.randint(0, 16, (n, k), dtype=torch.uint8)), torch.rand(k // 32, n, 2).bfloat16()
        for m in (1, 8, 128):
            x = torch.randn(m, k).bfloat16()
            reps = 20 if m == 128 else 200
            tv = timed(lambda x=x: mm(x), reps)
            tt = timed(lambda x=x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, p, 32, sz), reps)
            f = 2 * m * n * k
            print(f"{n}x{k} m={m:3d}: vnni {tv * 1e6:8.1f} us {f / tv / 1e9:6.0f} GOP/s | torch int4 "
                  f"{tt * 1e6:8.1f} us {f / tt / 1e9:6.0f} GFLOP/s | {tt / tv:.2f}x")


def cold() -> None:
    big = [cpu_vnni.Q4Vnni([(quantize(torch.randn(4096, 4096), GGMLType.Q4_0), GGMLType.Q4_0, 4096, 4096)])
           for _ in range(4)]  # 42 MB: more than the L3 cache
    x = torch.randn(1, 4096)
    for passes in (1, 2):
        t = timed(lambda p=passes: [m(x, p) for m in big], 10) / len(big)
        print(f"4096x4096 one row, {passes} pass(es), cold: {t * 1e6:.1f} us = {big[0].nbytes / t / 1e9:.1f} GB/s")


def attention() -> None:
    n_slots, n_kv, n_ctx, hd, n_head = 8, 3, 1024, 64, 9
    kc, vc = torch.randn(n_slots, n_kv, n_ctx, hd), torch.randn(n_slots, n_kv, n_ctx, hd)
    for length in (64, 540):
        for b in (1, 8):
            q = torch.randn(b, 768)[:, :n_head * hd]
            slots, lens = torch.arange(b, dtype=torch.int32), torch.full((b,), length, dtype=torch.int32)
            tc = timed(lambda q=q, s=slots, ln=lens: cpu_vnni.attention_decode(q, kc, vc, s, ln, n_head, 0.125), 500)
            ts = timed(lambda q=q, b=b: [cpu_ops.attention_decode(q[i].view(1, n_head, 1, hd), kc[i:i + 1, :, :length],
                                                                  vc[i:i + 1, :, :length], 0.125) for i in range(b)],
                       500)
            print(f"decode attention L={length} B={b}: C {tc * 1e6:.1f} us, SDPA loop {ts * 1e6:.1f} us")


def embed() -> None:
    from minfer.quant.reference import dequantize
    from minfer.quant.types import quant_info

    flush = torch.empty(16 << 20)  # 64 MB: streamed between calls, as a decode step's weights would be
    for qtype, rows, width in ((GGMLType.Q8_0, 49152, 576), (GGMLType.Q4_0, 151936, 896)):
        raw = torch.randint(0, 256, (rows, quant_info(qtype).nbytes(width)), dtype=torch.uint8)
        raw[:, 1] &= 0x3B  # (finite float16 scales)
        for cold in (False, True):
            def c(cold=cold, raw=raw, qtype=qtype, width=width):
                if cold:
                    flush.add_(1.0)
                ids = torch.randint(0, rows, (1,), dtype=torch.int32)
                t = time.perf_counter()
                cpu_vnni.embed_rows(raw, qtype, ids, width)
                return time.perf_counter() - t

            def ref(cold=cold, raw=raw, qtype=qtype, width=width):
                if cold:
                    flush.add_(1.0)
                ids = torch.randint(0, rows, (1,))
                t = time.perf_counter()
                dequantize(raw.index_select(0, ids), qtype, (1, width))
                return time.perf_counter() - t

            tc, tr = (statistics.median(f() for _ in range(200)) for f in (c, ref))
            print(f"embedding row {qtype.name} [{rows}, {width}] {'cold' if cold else 'warm'}: C {tc * 1e6:.1f} us, "
                  f"reference {tr * 1e6:.1f} us")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", nargs="*", default=["torch", "vnni", "cold", "attention", "embed"])
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if not cpu_vnni.available() and set(a.what) - {"torch"}:
        raise SystemExit("the C kernels do not run here (AVX512-VNNI and a C compiler needed)")
    with torch.inference_mode():
        for w in a.what:
            {"torch": torch_options, "vnni": vnni_vs_int4, "cold": cold, "attention": attention, "embed": embed}[w]()


if __name__ == "__main__":
    main()
