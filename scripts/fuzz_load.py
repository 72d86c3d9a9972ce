#!/usr/bin/env python3
"""Whole-load mutation fuzzer: hostile GGUF files past the reader (runs in CI through
tests/gguf/test_fuzz_load.py).

Seeds: three `minfer synth` files with their real data (tiny-llama Q4_0, tiny-qwen2 Q4_K and the
mixture of experts tiny-qwen3moe Q4_0, small vocabularies), mutated by scripts/fuzz_gguf.py's
field-aware mutator with the metadata values (scalars: the hyperparameters, the tokenizer's counts
and strings) drawn most often. Every case is taken as far as it goes in-process: the reader, the
tokenizer, the graph, the cpu backend's load and allocation, the chat template, one prompt and two
greedy decode steps. Plus fixed cases: the 32 KB mutant's block_count = 2,591,894,889 and
context_length 2^34 (typed rejections), context_length 2^24 (loads; allocations follow the context
asked for), and the 2026 GGUF CVE classes written into the tiny-llama file's tensor table
(`CVE_CASES`: llama.cpp CVE-2026-27940's size computations that wrap in 64 bits, Ollama
CVE-2026-7482's offset + size past the file's end, and a shape the file holds that is not the
model's; `MOE_CASES`, in the tiny-qwen3moe file's: a router or expert tensor whose shape disagrees
with the expert metadata, an expert tensor past the end). The mutator draws the same values
(fuzz_gguf.CVE_VALUES). `--device vulkan` loads every case on the vulkan backend (lavapipe in
CI) and counts its dispatches: its shaders run without bounds checks, so a load-time rejection
(GGUFError, MetadataError, ModelError) after any dispatch is a failure.

Outcomes: a MinferError anywhere is a typed rejection; any other exception is an untyped failure;
a case over 2 s is slow. The loop runs under an address-space cap (RLIMIT_AS: the size after
imports and seeds + 3 GiB), so a runaway allocation fails as a MemoryError (untyped) instead of
taking the machine down. A crash of the process itself shows as a missing result line.

Usage:  python scripts/fuzz_load.py [--cases N] [--seed S] [--only I] [--device cpu|vulkan]
Prints one result line; exits 1 on any untyped failure, slow case or failed fixed case.
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_gguf as fz  # noqa: E402 (the reader fuzzer's mutator and seeds)

from minfer.api import load  # noqa: E402
from minfer.errors import MinferError  # noqa: E402
from minfer.gguf.reader import ValueType  # noqa: E402
from minfer.gguf.synth import synth  # noqa: E402
from minfer.gguf.writer import rewrite_gguf  # noqa: E402

CASE_LIMIT_S = 2.0
AS_HEADROOM = 3 << 30
N_CTX = 32


@dataclass
class Stats:
    cases: int = 0
    rejected: int = 0
    loaded: int = 0
    generated: int = 0
    untyped: int = 0
    slow: int = 0
    max_case_s: float = 0.0
    dispatched_then_rejected: int = 0  # vulkan: load-time rejections that came after a dispatch
    stages: dict[str, int] = field(default_factory=dict)  # how far the typed rejections got


LOAD_ERRORS = ("GGUFError", "MetadataError", "ModelError")  # what the file and its hyperparameters earn
DEVICE = "cpu"
DISPATCHES = [0]  # vulkan: kernel launches so far (Device.dispatch and replays), counted by _count_dispatches


def _count_dispatches() -> None:
    """The vulkan backend's shaders run without bounds checks: a hostile file must be refused
    before the first dispatch. Count them, so a load-time rejection that came after one fails."""
    from minfer.kernels.wgpu import device as wgpu_device

    for name in ("dispatch", "replay"):
        orig = getattr(wgpu_device.Device, name)

        def counted(self, *a, _orig=orig, **kw):
            DISPATCHES[0] += 1
            return _orig(self, *a, **kw)

        setattr(wgpu_device.Device, name, counted)


def run_model(path: Path, st: Stats) -> None:
    """Load, render a chat, decode two tokens."""
    with load(path, DEVICE, n_ctx=N_CTX, n_slots=1, progress=False) as m:
        st.loaded += 1
        ids = m.chat_tokens([{"role": "user", "content": "hi"}])
        if len(ids) < N_CTX - 2:
            m.generate(m.detokenize(ids[:8]) or "hi", max_tokens=2, temperature=0, ignore_eos=True)
            st.generated += 1


def run_case(path: Path, label: str, st: Stats) -> tuple[str, float]:
    st.cases += 1
    t0 = time.perf_counter()
    outcome = "ok"
    dispatched = DISPATCHES[0]
    try:
        run_model(path, st)
    except MinferError as e:
        st.rejected += 1
        kind = type(e).__name__
        st.stages[kind] = st.stages.get(kind, 0) + 1
        outcome = f"rejected: {kind}: {e}"
        if kind in LOAD_ERRORS and DISPATCHES[0] != dispatched:
            st.dispatched_then_rejected += 1
            print(f"DISPATCHED {label}: {DISPATCHES[0] - dispatched} dispatches before {kind}: {e}", file=sys.stderr)
    except Exception:  # noqa: BLE001 (anything untyped, MemoryError included, is what this fuzzer hunts)
        st.untyped += 1
        outcome = "untyped"
        print(f"UNTYPED {label}:\n{traceback.format_exc()}", file=sys.stderr)
    dt = time.perf_counter() - t0
    st.max_case_s = max(st.max_case_s, dt)
    if dt > CASE_LIMIT_S:
        st.slow += 1
        print(f"SLOW {label}: {dt:.2f} s", file=sys.stderr)
    return outcome, dt


# (what, the header field of the tiny-llama seed, its new value (a callable of the old), the outcome)
CVE_CASES = [
    ("CVE-2026-27940 Q4_0 ne0 * 18 wraps to 64", "blk.0.attn_q.weight.ne[0]", lambda old: 5124095576030431008,
     "rejected: GGUFError"),
    ("CVE-2026-27940 row stride * ne1 wraps", "token_embd.weight.ne[1]", lambda old: 2**42 + 1,
     "rejected: GGUFError"),
    ("CVE-2026-27940 element count past int64", "blk.1.ffn_down.weight.ne[1]", lambda old: 2**63 - 1,
     "rejected: GGUFError"),
    ("CVE-2026-7482 size past the end of the file", "blk.1.ffn_down.weight.ne[1]", lambda old: old * 64,
     "rejected: GGUFError"),
    ("CVE-2026-7482 offset + size wraps", "output_norm.weight.offset", lambda old: 2**64 - 32,
     "rejected: GGUFError"),
    ("a shape the file holds, not the model's", "blk.0.ffn_gate.weight.ne[1]", lambda old: old // 2,
     "rejected: ModelError"),
]


# the same, written into the mixture-of-experts seed (tiny-qwen3moe): a router or expert tensor whose shape
# disagrees with the metadata, an expert tensor past the file's end
MOE_CASES = [
    ("a router of fewer experts than expert_count", "blk.0.ffn_gate_inp.weight.ne[1]", lambda old: old // 2,
     "rejected: MetadataError"),
    ("an expert tensor of other experts than layer 0's", "blk.1.ffn_up_exps.weight.ne[2]", lambda old: old // 2,
     "rejected: ModelError"),
    ("an expert tensor past the file's end", "blk.1.ffn_down_exps.weight.ne[2]", lambda old: old << 20,
     "rejected: GGUFError"),
]


def cve_cases(workdir: Path, seed, st: Stats, cases=CVE_CASES) -> list[str]:
    """The 2026 CVE classes (or `cases`), each written into a header field of the seed: the outcome
    each must have, within 1 s, and (vulkan) before any dispatch."""
    failures = []
    fields = {f.label: f for f in seed.fields}
    for what, label, value, want in cases:
        f = fields[label]
        m = fz.Mutant(bytearray(seed.header), seed.size)
        width = f.end - f.start
        old = int.from_bytes(m.head[f.start:f.end], "little")
        m.head[f.start:f.end] = (value(old) % (1 << 8 * width)).to_bytes(width, "little")
        path = workdir / "cve.gguf"
        fz.write_mutant(path, seed, m)
        before = st.dispatched_then_rejected
        outcome, dt = run_case(path, f"cve {what}", st)
        ok = outcome.startswith(want) and dt < 1.0 and st.dispatched_then_rejected == before
        print(f"fixed {what} ({label}): {outcome[:100]} ({dt * 1e3:.0f} ms){'' if ok else '  <-- FAILED'}")
        if not ok:
            failures.append(what)
    return failures


def fixed_cases(workdir: Path, llama: Path, st: Stats) -> list[str]:
    """The review's mutants: the outcome each must have."""
    failures = []
    cases = [("llama.block_count", ValueType.UINT32, 2_591_894_889, "rejected: MetadataError"),
             ("llama.context_length", ValueType.UINT64, 2**34, "rejected: MetadataError"),
             ("llama.context_length", ValueType.UINT32, 2**24, "ok")]
    for key, vt, value, want in cases:
        path = rewrite_gguf(llama, workdir / "fixed.gguf", meta={key: (vt, value)})
        outcome, dt = run_case(path, f"fixed {key}={value}", st)
        limit = 1.0 if want.startswith("rejected") else CASE_LIMIT_S  # a typed rejection within 1 s
        ok = outcome.startswith(want) and dt < limit
        print(f"fixed {key}={value}: {outcome[:100]} ({dt * 1e3:.0f} ms){'' if ok else '  <-- FAILED'}")
        if not ok:
            failures.append(key)
    return failures


def _value_mutation(rng: random.Random, seed, m, kind: str) -> str:
    """One field of `kind` set to a special value (numbers) or a same-length run of random bytes
    (strings: vocabulary entries, the chat template, names), leaving the file's structure intact."""
    f = rng.choice(seed.by_kind[kind])
    width = f.end - f.start
    if kind == "string":
        n = min(width, rng.randint(1, 8))
        at = f.start + rng.randrange(width - n + 1)
        m.head[at:at + n] = rng.randbytes(n)
    elif width in (1, 2, 4, 8):
        old = int.from_bytes(m.head[f.start:f.end], "little")
        m.head[f.start:f.end] = fz._special(rng, old, width).to_bytes(width, "little")
    return f"value:{kind}"


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", type=int, default=None, help="run only this case number (to reproduce it)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "vulkan"],
                    help="the backend the mutants load on (vulkan: lavapipe in CI; dispatches counted)")
    args = ap.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "vulkan":
        _count_dispatches()

    shm = Path("/dev/shm")
    workdir = Path(tempfile.mkdtemp(prefix="fuzz_load_", dir=shm if shm.is_dir() else None))
    try:
        llama = synth("tiny-llama", "q4_0", workdir / "llama.gguf", vocab=300, progress=False)
        qwen2 = synth("tiny-qwen2", "q4_k", workdir / "qwen2.gguf", vocab=300, progress=False)
        moe = synth("tiny-qwen3moe", "q4_0", workdir / "qwen3moe.gguf", vocab=300, progress=False)
        seeds = [fz._seed_from("tiny-llama", llama, None, 0.5, keep_data=True),
                 fz._seed_from("tiny-qwen2", qwen2, None, 0.5, keep_data=True),
                 fz._seed_from("tiny-qwen3moe", moe, None, 0.5, keep_data=True)]
        run_case(llama, "warm-up", Stats())  # imports and first compilations outside the cap and the clock
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        vm = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
        cap = vm + AS_HEADROOM
        resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
        st = Stats()
        failed_fixed = (fixed_cases(workdir, llama, st) + cve_cases(workdir, seeds[0], st)
                        + cve_cases(workdir, seeds[2], st, MOE_CASES))
        path = workdir / "mutant.gguf"
        t0 = time.perf_counter()
        for i in [args.only] if args.only is not None else range(args.cases):
            rng = random.Random(f"load-{args.seed}-{i}")
            seed = rng.choice(seeds)
            u = rng.random()
            if u < 0.7:  # what the reader accepts and the loader must judge: values, dims, types
                m = fz.Mutant(bytearray(seed.header), seed.size)
                op = _value_mutation(rng, seed, m, "scalar" if u < 0.45 else rng.choice(["dim", "ggml_type",
                                                                                          "string"]))
            else:
                m, op = fz.mutate(rng, seed)
            fz.write_mutant(path, seed, m)
            run_case(path, f"case {i} seed {seed.name} op {op}", st)
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    stages = ",".join(f"{k}={v}" for k, v in sorted(st.stages.items()))
    print(f"fuzz_load: cases={st.cases} rejected={st.rejected} loaded={st.loaded} generated={st.generated} "
          f"untyped={st.untyped} crashes=0 over_2s={st.slow} max_case_ms={st.max_case_s * 1e3:.0f} "
          f"fixed_failed={len(failed_fixed)} dispatches={DISPATCHES[0]} "
          f"dispatched_then_rejected={st.dispatched_then_rejected} "
          f"peak_rss_mb={_peak_rss_mb():.0f} as_cap_gb={cap / 2**30:.1f} "
          f"seed={args.seed} device={DEVICE} wall_s={wall:.1f} rejections[{stages}]")
    return 1 if st.untyped or st.slow or failed_fixed or st.dispatched_then_rejected else 0


if __name__ == "__main__":
    sys.exit(main())
