"""Benchmark: the cpu engine on SmolLM2 — load time, decode tok/s, pp512 tok/s, Python overhead.

Not a test. Usage:  python bench/cpu_engine.py [MODEL.gguf] [--threads 2] [--decode 128] [--repeats 5]

- load: GGUF open + graph build + weight preparation (float32 copies, int4 packing).
- decode: tokens/s of single-token steps after a 16-token prompt (greedy, logits of each step),
  from the median step time of a run.
- pp512: tokens/s of one 512-token prefill (logits of the last token, as llama-bench's pp512).
- overhead: a decode step of a "skeleton" model with SmolLM2's graph (30 layers, same node
  count) but widths of 64, whose compute is negligible: what graph walking, Python closures
  and torch dispatch cost per step and per node.
Each figure is the median of --repeats runs, with their range (the machine may be shared: quote
the median of >= 5 runs, and compare variants A B A B). Reference points on a
2-core AVX2 machine: llama.cpp ~71 tok/s decode, ~165 tok/s pp512; HF transformers f32 ~21 / ~428.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from minfer.backends.base import Batch
from minfer.config import EngineConfig
from minfer.default_model import default_model_path
from minfer.engine.engine import Engine
from minfer.gguf.reader import GGUFReader


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def tokens(engine: Engine, first: int, n: int) -> list[int]:
    return [t % engine.n_vocab for t in range(first, first + n)]


def decode_steps(engine: Engine, n: int) -> list[float]:
    """Seconds of each of n greedy decode steps after a 16-token prompt (backend steps: no sampler)."""
    be = engine.backend
    logits = be.forward(Batch.single(tokens(engine, 1000, 16), 0))[0]
    times = []
    for pos in range(16, 16 + n):
        t0 = time.perf_counter()
        logits = be.forward(Batch.build([(0, pos, [int(logits.argmax())])], [0], n_decode=1))[0]
        times.append(time.perf_counter() - t0)
    return times


def measure(engine: Engine, n_decode: int, repeats: int) -> dict[str, list[float]]:
    """Per run (decode then pp512, alternating): decode tok/s from the run's median step, and
    pp512 tok/s."""
    decode_steps(engine, 4)  # warm-up
    r = {"decode_tps": [], "pp512_tps": [], "step_ms": []}
    for _ in range(repeats):
        step = statistics.median(decode_steps(engine, n_decode))
        r["decode_tps"].append(1 / step)
        r["step_ms"].append(step * 1e3)
        r["pp512_tps"].append(512 / timed(lambda: engine.backend.forward(Batch.single(tokens(engine, 2000, 512), 0))))
    return r


def med(xs: list[float]) -> str:
    """'median (min-max)'."""
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"


def skeleton_model(model: Path, out: Path) -> Path:
    """A GGUF with the model's layer count and heads but every width 64 (synth, Q4_1 like SmolLM2)."""
    from minfer.gguf.synth import PRESETS, synth

    with GGUFReader(model) as r:
        n_layer = r.get_int(f"{r.architecture()}.block_count")
    PRESETS["bench-skeleton"] = replace(PRESETS["tiny-llama"], name="bench-skeleton", n_layers=n_layer,
                                        d_model=64, d_ff=64, n_head=4, n_kv_head=2, vocab=512)
    try:
        return synth("bench-skeleton", "q4_1", out, progress=False)
    finally:
        del PRESETS["bench-skeleton"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode", type=int, default=128, help="decode steps per run")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    path = a.model or default_model_path()

    t0 = time.perf_counter()
    engine = Engine.load(GGUFReader(path), EngineConfig(n_ctx=1024, n_slots=1), progress=False)
    load_s = time.perf_counter() - t0
    r = measure(engine, a.decode, a.repeats)
    n_nodes = len(engine.graph.nodes)

    with tempfile.TemporaryDirectory() as tmp:
        skel_path = skeleton_model(path, Path(tmp) / "skeleton.gguf")
        skel = Engine.load(GGUFReader(skel_path), EngineConfig(n_ctx=1024, n_slots=1), progress=False)
        s = measure(skel, a.decode, a.repeats)

    print(f"model: {path.name}  threads: {a.threads}  graph nodes: {n_nodes}")
    print(f"load (graph + weight preparation): {load_s:.2f} s")
    step, skel_step = statistics.median(r["step_ms"]), statistics.median(s["step_ms"])
    print(f"decode: {med(r['decode_tps'])} tok/s ({step:.2f} ms/step, median of {a.repeats} runs)")
    print(f"pp512: {med(r['pp512_tps'])} tok/s")
    print(f"overhead (skeleton decode step): {skel_step:.2f} ms/step = "
          f"{skel_step * 1e3 / len(skel.graph.nodes):.1f} us/node = {100 * skel_step / step:.0f}% of a SmolLM2 step")
    print(f"RESULT decode_tps={statistics.median(r['decode_tps']):.1f} "
          f"pp512_tps={statistics.median(r['pp512_tps']):.1f} load_s={load_s:.2f} overhead_ms={skel_step:.2f}")


if __name__ == "__main__":
    main()
