"""Benchmark: many sequences at once on the cpu backend (SmolLM2 by default). Not a test.

Usage:  python bench/batch_cpu.py [MODEL.gguf] [--threads 2] [--tokens 64] [--sizes 1,4,8,16]

1. Aggregate decode tok/s with B sequences decoding together (B = --sizes), greedy, every
   sequence its own short prompt, through the engine's real loop (scheduler + sampler): tokens
   generated after the last prompt finished prefilling / seconds. Also checks batch invariance:
   every sequence's tokens equal the ones it produced alone (B = 1 runs).
2. Chunked prefill under load: 4 sequences decode while a 1,500-token prompt arrives; the
   running sequences' largest gap between two tokens vs their median gap, and the time of one
   step that carries a prefill chunk (the bound the largest gap should stay under).
3. Abort: 50 sequences aborted mid-generation leave 0 slots in use; a next request succeeds.
Prints one RESULT line per part.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from minfer.api import load
from minfer.default_model import default_model_path
from minfer.engine.params import SamplingParams

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "1, 2, 3, 4,",
           "The three primary colors are", "In 1969, Neil Armstrong", "Water boils at", "Here is a list of fruits:",
           "The best way to learn", "My favourite book is", "import numpy as np", "Dear Sir or Madam,",
           "The weather today is", "A haiku about the sea:", "Step 1: preheat the oven", "Q: What is 2 + 2? A:"]


def prompt(i: int) -> str:
    return PROMPTS[i % len(PROMPTS)] + " ..." * (i // len(PROMPTS))


def decode_rate(m, b: int, n: int, first: int = 0) -> tuple[float, list[list[int]]]:
    """Aggregate decode tok/s of b sequences (prompts first..first+b-1) generating n tokens each,
    and their tokens."""
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    seqs = [m.submit(prompt(first + i), params) for i in range(b)]
    eng = m.engine
    while any(s.prefilling or s.status.value == "waiting" for s in seqs):
        eng.step()
    start_tokens = sum(len(s.generated) for s in seqs)
    t0 = time.perf_counter()
    eng.run(seqs)
    dt = time.perf_counter() - t0
    return (sum(len(s.generated) for s in seqs) - start_tokens) / dt, [s.generated for s in seqs]


def prefill_under_load(m, long_tokens: int = 1500) -> dict:
    eng = m.engine
    params = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
    runners = [m.submit(p, params) for p in PROMPTS[:4]]
    while any(s.prefilling or s.status.value == "waiting" for s in runners):
        eng.step()
    for _ in range(8):
        eng.step()
    ids = (m.tokenize(Path(__file__).read_text()) * 20)[:long_tokens]
    long = eng.add(ids, SamplingParams(max_tokens=1, temperature=0))
    step_times = []
    while not long.finished:
        t0 = time.perf_counter()
        eng.step()
        step_times.append((time.perf_counter() - t0, long.n_cached))
    for _ in range(8):
        eng.step()
    gaps = [b - a for s in runners for a, b in zip(s.stats.token_times, s.stats.token_times[1:], strict=False)]
    for s in runners:
        eng.abort(s)
    chunk_steps = [t for t, _ in step_times]
    return {"median_gap_ms": statistics.median(gaps) * 1e3, "max_gap_ms": max(gaps) * 1e3,
            "chunk_step_ms": max(chunk_steps) * 1e3, "chunks": len(chunk_steps),
            "prefill_chunk": m.config.prefill_chunk}


def abort_flood(m) -> tuple[int, bool]:
    eng = m.engine
    seqs = [m.submit(PROMPTS[i % len(PROMPTS)], SamplingParams(max_tokens=100, temperature=0)) for i in range(50)]
    for _ in range(10):
        eng.step()
    for s in seqs:
        eng.abort(s)
    in_use = eng.scheduler.slots_in_use
    ok = m.generate("The capital of France is", max_tokens=4, temperature=0)
    return in_use, bool(ok)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64, help="tokens each sequence generates")
    ap.add_argument("--sizes", default="1,4,8,16")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    sizes = [int(x) for x in a.sizes.split(",")]
    path = a.model or default_model_path()
    with load(path, n_ctx=2048, n_slots=max(sizes), threads=a.threads, progress=False) as m:
        decode_rate(m, 2, 4)  # warm-up
        alone = {i: decode_rate(m, 1, a.tokens, first=i)[1][0] for i in range(max(sizes))}
        rates = {}
        invariant = True
        for b in sizes:
            runs = []
            for _ in range(a.repeats):
                r, toks = decode_rate(m, b, a.tokens)
                runs.append(r)
                invariant &= all(t == alone[i] for i, t in enumerate(toks))
            rates[b] = statistics.median(runs)
            print(f"B={b:3d}: {rates[b]:7.1f} tok/s aggregate (median of {a.repeats}; runs "
                  f"{', '.join(f'{x:.1f}' for x in runs)})  x{rates[b] / rates[sizes[0]]:.2f}", flush=True)
        print("RESULT decode " + " ".join(f"B{b}={rates[b]:.1f}" for b in sizes) +
              f" ratio8={rates.get(8, 0) / rates[1]:.2f} batch_invariant={invariant}")
    with load(path, n_ctx=2048, n_slots=5, threads=a.threads, progress=False) as m:
        r = prefill_under_load(m)
        print(f"RESULT prefill_under_load median_gap_ms={r['median_gap_ms']:.1f} max_gap_ms={r['max_gap_ms']:.1f} "
              f"chunk_step_ms={r['chunk_step_ms']:.1f} chunks={r['chunks']} prefill_chunk={r['prefill_chunk']}")
    with load(path, n_ctx=512, n_slots=8, threads=a.threads, progress=False) as m:
        in_use, ok = abort_flood(m)
        print(f"RESULT abort50 slots_in_use={in_use} next_request_ok={ok}")


if __name__ == "__main__":
    main()
