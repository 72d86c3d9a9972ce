"""Benchmark: minfer's cpu backend against llama.cpp on the same file, interleaved (A B A B).

Not a test; llama.cpp is never a minfer dependency. Usage:

    python bench/cpu_vs_llama.py [MODEL.gguf] --llama-python /work/llama-venv/bin/python \
        [--threads 2] [--pp 512] [--tg 32] [--batch 8] [--repeats 3]

llama.cpp runs through `llama-cpp-python` (built from source for this CPU) in a separate
process, which receives one command per round; minfer runs in this process. Per round: pp
(one prompt of --pp tokens, logits of the last one, as llama-bench's ppN) then tg (--tg
single-token decode steps after it, as tgN), minfer then llama.cpp, so both see the same
machine state. With --batch B, minfer also runs B sequences decoding together (aggregate tok/s).
Prints the median of each, the ratios minfer / llama.cpp, and minfer's peak RSS.

llama.cpp runs as its users get it by default, with its extra buffer types (the repacked Q4_0 / Q4_K
layouts, its AMX kernels where the CPU has them: llama_model_params.use_extra_bufts), unless
--llama-extra-bufts off. With the default (auto) its worker first runs a 32-token prompt; where that
dies (the 2026-12-02 machine: a Xeon with AMX in /proc/cpuinfo whose sandbox does not grant the tile
state, so llama.cpp's AMX kernels fault at their first `ldtilecfg`) the run goes on without them, and
the report says which llama.cpp it measured. (Before 2026-12-04 this bench ran without them by
default: bench/NOTES.md's earlier 2-thread tables are against llama.cpp without its repacked layouts.)
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from minfer.backends.base import Batch
from minfer.config import EngineConfig
from minfer.default_model import default_model_path
from minfer.engine.engine import Engine
from minfer.gguf.reader import GGUFReader
from minfer.kernels.cpu import vnni as cpu_vnni

LLAMA_WORKER = r"""
import json, sys, time
import llama_cpp.llama_cpp as C
from llama_cpp import Llama
path, threads, n_ctx, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
if not extra:  # no AMX / repack buffer types (--llama-extra-bufts: the module docstring says why)
    _default = C.llama_model_default_params
    def _plain():
        p = _default(); p.use_extra_bufts = False; return p
    C.llama_model_default_params = _plain
t0 = time.perf_counter()
llm = Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=512,
            n_ubatch=512, verbose=False)
load = time.perf_counter() - t0
llm.eval([10 + i for i in range(32)])  # a prompt's kernels once (where the extra buffer types die, they die here)
llm.reset()
print(json.dumps({"load": load}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    ids = [10 + i % 1000 for i in range(cmd["pp"])]
    llm.reset()
    llm._ctx.memory_clear(True) if hasattr(llm._ctx, "memory_clear") else None
    t0 = time.perf_counter(); llm.eval(ids); pp = time.perf_counter() - t0
    tok = 5
    t0 = time.perf_counter()
    for _ in range(cmd["tg"]):
        llm.eval([tok])
    tg = time.perf_counter() - t0
    print(json.dumps({"pp": cmd["pp"] / pp, "tg": cmd["tg"] / tg}), flush=True)
"""


def minfer_round(engine: Engine, pp: int, tg: int) -> dict[str, float]:
    be = engine.backend
    ids = [10 + i % 1000 for i in range(pp)]
    t0 = time.perf_counter()
    logits = be.forward(Batch.single(ids, 0))[0]
    t_pp = time.perf_counter() - t0
    t0 = time.perf_counter()
    for pos in range(pp, pp + tg):
        logits = be.forward(Batch.build([(0, pos, [int(logits.argmax())])], [0], n_decode=1))[0]
    return {"pp": pp / t_pp, "tg": tg / (time.perf_counter() - t0)}


def minfer_batched(engine: Engine, n_seq: int, tg: int) -> tuple[float, list[list[int]]]:
    """Aggregate tok/s of n_seq sequences decoding together (greedy), and their tokens."""
    be = engine.backend
    last = []
    for s in range(n_seq):
        last.append(int(be.forward(Batch.single([10 + s + i for i in range(16)], s))[0].argmax()))
    toks = [[t] for t in last]
    t0 = time.perf_counter()
    for step in range(tg):
        rows = [(s, 16 + step, [toks[s][-1]]) for s in range(n_seq)]
        logits = be.forward(Batch.build(rows, list(range(n_seq)), n_decode=n_seq))
        for s in range(n_seq):
            toks[s].append(int(logits[s].argmax()))
    return n_seq * tg / (time.perf_counter() - t0), toks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--llama-python", default="/work/llama-venv/bin/python")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=32)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--isa", default="auto", help="minfer's C kernel build (EngineConfig.cpu_isa: auto, avx512, "
                    "avxvnni, avx2); pair avx2 with a llama.cpp built for AVX2 only")
    ap.add_argument("--llama-extra-bufts", choices=("auto", "on", "off"), default="auto",
                    help="llama.cpp's extra buffer types (AMX, repacked Q4_0/Q4_K): on (its default), off, or auto: "
                         "on, unless its worker dies on them (then off)")
    a = ap.parse_args()
    path = Path(a.model) if a.model else default_model_path()
    torch.set_num_threads(a.threads)

    def start_llama(extra: bool):
        proc = subprocess.Popen([a.llama_python, "-c", LLAMA_WORKER, str(path), str(a.threads), str(a.ctx),
                                 "1" if extra else "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        if not line:
            proc.wait()
            return None, None
        return proc, json.loads(line)["load"]

    extra = a.llama_extra_bufts != "off"
    llama, llama_load = start_llama(extra)
    if llama is None and a.llama_extra_bufts == "auto":
        print("llama.cpp's worker died with its extra buffer types (AMX without the tile state?): measuring it "
              "without them", flush=True)
        extra = False
        llama, llama_load = start_llama(extra)
    if llama is None:
        raise SystemExit("llama.cpp's worker died before its first round")
    t0 = time.perf_counter()
    slots = max(1, a.batch)
    config = EngineConfig.from_env(n_slots=slots, n_ctx=a.ctx, threads=a.threads, cpu_isa=a.isa)  # (MINFER_* too)
    engine = Engine.load(GGUFReader(path), config, progress=False)
    minfer_load = time.perf_counter() - t0
    minfer_round(engine, 8, 2)  # warm-up
    ours, theirs = [], []
    for _ in range(a.repeats):
        ours.append(minfer_round(engine, a.pp, a.tg))
        llama.stdin.write(json.dumps({"pp": a.pp, "tg": a.tg}) + "\n")
        llama.stdin.flush()
        theirs.append(json.loads(llama.stdout.readline()))
        print(f"  round: minfer pp {ours[-1]['pp']:.1f} tg {ours[-1]['tg']:.2f} | "
              f"llama.cpp pp {theirs[-1]['pp']:.1f} tg {theirs[-1]['tg']:.2f}", flush=True)
    llama.stdin.close()
    llama.wait()

    def med(rows, key):
        return statistics.median(r[key] for r in rows)

    print(f"model {path.name}, {a.threads} threads, {a.repeats} rounds (median), minfer's C build "
          f"{cpu_vnni.isa() or 'none'}, llama.cpp {'with' if extra else 'without'} its extra buffer types")
    print(f"load: minfer {minfer_load:.1f} s, llama.cpp {llama_load:.1f} s")
    for key, label in (("pp", f"pp{a.pp}"), ("tg", f"tg{a.tg}")):
        m, ll = med(ours, key), med(theirs, key)
        print(f"{label}: minfer {m:.2f} tok/s, llama.cpp {ll:.2f} tok/s, ratio {m / ll:.2f}x")
    if a.batch:
        single = med(ours, "tg")
        agg, toks = minfer_batched(engine, a.batch, a.tg)
        _, alone = minfer_batched(engine, 1, a.tg)
        print(f"batched decode x{a.batch}: {agg:.1f} tok/s aggregate = {agg / single:.2f}x single-stream; "
              f"sequence 0 equals its tokens alone: {toks[0] == alone[0]}")
    print(f"minfer peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB, "
          f"file {path.stat().st_size / 2**30:.2f} GiB")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
