#!/usr/bin/env python3
"""Seeded mutation fuzzer for minfer's GGUF reader (runs in CI through tests/gguf/test_fuzz.py).

Seeds (their headers re-encoded with writer.reencode_header, which maps every field):
  smollm2-trim  the SmolLM2 header with its three vocabulary arrays cut to 512 entries
  smollm2-full  the whole SmolLM2 header (49k tokens, 49k merges; slower, so fewer cases)
  tiny          a `minfer synth tiny-qwen2 q4_k` file (biases, untied output, K-quants)
The SmolLM2 seeds keep all 272 real tensor infos; their data section is a sparse hole of the real
size (the file's logical size is the real one, its disk use only the header), so mutated offsets
and shapes meet the true bounds. The tiny seed carries its real data.

Mutations, aimed at fields through the field map (a kind of field is drawn first, then a field):
truncate (at a field boundary, in the header, or in the data), bit flips, a numeric field set to
a special value (0, 1, -1, 2^31, 2^32, 2^62, 2^63, huge dims, off-by-one, ...), random bytes,
copying one field over another (duplicate keys/names, overlapping offsets), inserting/deleting
bytes, and stacks of 2-4 of these.

Each case runs in-process: write the mutant, GGUFReader(path), and for an accepted file touch
every tensor view (all bytes for the tiny seed). A GGUFError/MinferError is a typed rejection;
any other exception (or a view whose bounds disagree with the header) is a crash.

RSS rule: the peak RSS of the fuzzing loop (Linux VmHWM, restarted once the interpreter, the
imports and the seeds are loaded; ru_maxrss of the whole run where /proc is missing) minus the
resident size at that point must stay below 2x the largest input file's logical size.

Usage:  python scripts/fuzz_gguf.py [--cases N] [--seed S] [--only I] [--crash-dir DIR]
Prints one result line; exits 1 on a crash, a case over 1 s or RSS over the limit.
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

from minfer.default_model import default_model_path
from minfer.errors import MinferError
from minfer.gguf.reader import GGUFReader
from minfer.gguf.synth import synth
from minfer.gguf.writer import Field, reencode_header

CASE_LIMIT_S = 1.0
# values of the 2026 GGUF CVE classes (llama.cpp CVE-2026-27940: a size computation that wraps in
# 64 bits; Ollama CVE-2026-7482: offset + size past the file): ne0 of Q4_0 whose ne0 * 18 is 64
# mod 2^64, a dimension whose row stride times it wraps (2^42 + 1), an aligned offset that wraps
# with any size (2^64 - 32)
CVE_VALUES = (5124095576030431008, 2**42 + 1, 2**64 - 32)
NUMERIC_KINDS = ("version", "count", "length", "vtype", "n_dims", "dim", "ggml_type", "offset", "scalar")


@dataclass
class Seed:
    name: str
    header: bytes
    fields: list[Field]
    tail: bytes | None  # real data after the header, or None: a sparse hole of `size - len(header)`
    size: int
    weight: float
    by_kind: dict[str, list[Field]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for f in self.fields:
            if f.end > f.start:
                self.by_kind.setdefault(f.kind, []).append(f)

    def pick(self, rng: random.Random, kinds=None) -> Field:
        kinds = [k for k in (kinds or self.by_kind) if k in self.by_kind]
        return rng.choice(self.by_kind[rng.choice(kinds)])


@dataclass
class Mutant:
    head: bytearray
    size: int  # logical file size


def _seed_from(name: str, path: Path, max_array: int | None, weight: float, keep_data: bool) -> Seed:
    with GGUFReader(path) as r:
        hb = reencode_header(r, max_array=max_array)
        data_size = r.file_size - r.data_offset
        tail = path.read_bytes()[r.data_offset:] if keep_data else None
    head = hb.bytes()
    return Seed(name, head, hb.fields, tail, len(head) + data_size, weight)


def build_seeds(workdir: Path, smollm2: Path) -> list[Seed]:
    tiny = synth("tiny-qwen2", "q4_k", workdir / "tiny-seed.gguf", vocab=300, progress=False)
    return [
        _seed_from("smollm2-trim", smollm2, 512, 0.585, keep_data=False),
        _seed_from("smollm2-full", smollm2, None, 0.015, keep_data=False),
        _seed_from("tiny", tiny, None, 0.40, keep_data=True),
    ]


# ------------------------------------------------------------------------------ mutations
def _special(rng: random.Random, old: int, width: int) -> int:
    choices = [0, 1, 2, 7, 0xFF, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63,
               2**64 - 1, old + 1, old - 1, old * 2, old + 32, old ^ (1 << rng.randrange(width * 8)),
               rng.getrandbits(width * 8), *CVE_VALUES]
    return rng.choice(choices) % (1 << (width * 8))


def m_truncate(rng, seed: Seed, m: Mutant) -> str:
    u = rng.random()
    if u < 0.4:
        cut = seed.pick(rng).start
    elif u < 0.7:
        cut = rng.randrange(len(m.head))
    else:
        cut = rng.randrange(m.size)
    if cut < len(m.head):
        del m.head[cut:]
    m.size = cut
    return "truncate"


def m_bitflip(rng, seed: Seed, m: Mutant) -> str:
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.6:
            f = seed.pick(rng)
            pos = rng.randrange(f.start, f.end)
        else:
            pos = rng.randrange(len(m.head))
        if pos < len(m.head):
            m.head[pos] ^= 1 << rng.randrange(8)
    return "bitflip"


def m_special(rng, seed: Seed, m: Mutant) -> str:
    f = seed.pick(rng, NUMERIC_KINDS)
    width = f.end - f.start
    if width not in (1, 2, 4, 8) or f.end > len(m.head):
        return m_bitflip(rng, seed, m)
    old = int.from_bytes(m.head[f.start:f.end], "little")
    m.head[f.start:f.end] = _special(rng, old, width).to_bytes(width, "little")
    return "special"


def m_randbytes(rng, seed: Seed, m: Mutant) -> str:
    f = seed.pick(rng)
    start = f.start
    end = min(f.end, start + 16) if rng.random() < 0.8 else start + rng.randint(1, 64)
    end = min(end, len(m.head))
    m.head[start:end] = rng.randbytes(max(0, end - start))
    return "randbytes"


def m_copy(rng, seed: Seed, m: Mutant) -> str:
    kind = rng.choice(["string", "offset", "dim", "length", "vtype", "scalar"])
    if kind not in seed.by_kind:
        return m_bitflip(rng, seed, m)
    src, dst = rng.choice(seed.by_kind[kind]), rng.choice(seed.by_kind[kind])
    if src.end - src.start == dst.end - dst.start and max(src.end, dst.end) <= len(m.head):
        m.head[dst.start:dst.end] = m.head[src.start:src.end]
        return "copy"
    # a string field of another length: copy its length field and bytes together (shifts the rest)
    if kind == "string" and max(src.end, dst.end) <= len(m.head):
        m.head[dst.start - 8:dst.end] = m.head[src.start - 8:src.end]
        return "copy"
    return m_bitflip(rng, seed, m)


def m_shift(rng, seed: Seed, m: Mutant) -> str:
    pos = min(seed.pick(rng).start, len(m.head))
    n = rng.randint(1, 16)
    if rng.random() < 0.5:
        m.head[pos:pos] = rng.randbytes(n)
        m.size += n
    else:
        n = min(n, len(m.head) - pos)
        del m.head[pos:pos + n]
        m.size -= n
    return "shift"


OPS = [m_truncate, m_bitflip, m_special, m_special, m_randbytes, m_copy, m_shift]


def mutate(rng: random.Random, seed: Seed) -> tuple[Mutant, str]:
    m = Mutant(bytearray(seed.header), seed.size)
    if rng.random() < 0.2:
        names = [rng.choice(OPS[1:])(rng, seed, m) for _ in range(rng.randint(2, 4))]
        if rng.random() < 0.3:
            names.append(m_truncate(rng, seed, m))
        return m, "stack:" + "+".join(names)
    return m, rng.choice(OPS)(rng, seed, m)


def write_mutant(path: Path, seed: Seed, m: Mutant) -> None:
    with open(path, "wb") as f:
        f.write(m.head)
        if seed.tail is not None:
            f.write(seed.tail)
        f.truncate(max(m.size, 0))  # cuts a truncated file, or extends a sparse hole


# ------------------------------------------------------------------------------ one case
def check_accepted(r: GGUFReader, full: bool) -> None:
    """Every tensor view of an accepted file lies inside the file and has the header's size."""
    for name, t in r.tensors.items():
        v = r.tensor_bytes(name)
        if v.size != t.nbytes or not r.data_offset <= t.offset <= t.offset + t.nbytes <= r.file_size:
            raise AssertionError(f"tensor {name!r}: view of {v.size} bytes at {t.offset} breaks the bounds")
        if full:
            int(v.sum(dtype="uint64"))
        else:
            _ = (v[0], v[-1])


@dataclass
class Stats:
    files: int = 0
    rejected: int = 0
    accepted: int = 0
    crashes: int = 0
    slow: int = 0
    full_loads: int = 0
    max_case_s: float = 0.0
    ops: dict[str, int] = field(default_factory=dict)


def run_case(i: int, base_seed: int, seeds: list[Seed], path: Path, st: Stats,
             crash_dir: Path | None) -> None:
    rng = random.Random(f"{base_seed}-{i}")
    seed = rng.choices(seeds, weights=[s.weight for s in seeds])[0]
    m, op = mutate(rng, seed)
    write_mutant(path, seed, m)
    st.files += 1
    kind = op.split(":")[0]
    st.ops[kind] = st.ops.get(kind, 0) + 1
    t0 = time.perf_counter()
    try:
        with GGUFReader(path) as r:
            full = seed.tail is not None
            check_accepted(r, full)
            st.full_loads += full
        st.accepted += 1
    except MinferError:
        st.rejected += 1
    except Exception:  # noqa: BLE001  (anything untyped is the bug this fuzzer hunts)
        st.crashes += 1
        print(f"CRASH case {i} seed {seed.name} op {op}:\n{traceback.format_exc()}", file=sys.stderr)
        if crash_dir is not None:
            crash_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, crash_dir / f"case-{base_seed}-{i}.gguf")
    dt = time.perf_counter() - t0
    st.max_case_s = max(st.max_case_s, dt)
    if dt > CASE_LIMIT_S:
        st.slow += 1
        print(f"SLOW case {i} seed {seed.name} op {op}: {dt:.2f} s", file=sys.stderr)


def _reset_peak_rss() -> bool:
    """Restart the kernel's peak-RSS count (VmHWM) from now. ru_maxrss cannot be used alone: it
    carries over fork + exec, so a child of a big process (pytest with models loaded) would start
    at its parent's size."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    """Peak resident bytes since _reset_peak_rss (Linux VmHWM), else the process's ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _current_rss() -> int:
    """Resident bytes now (Linux /proc); the peak so far where /proc is missing."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()
    except OSError:
        return _peak_rss()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", type=int, default=None, help="run only this case number (to reproduce a crash)")
    ap.add_argument("--smollm2", type=Path, default=None, help="SmolLM2 GGUF (default: the installed model)")
    ap.add_argument("--crash-dir", type=Path, default=None, help="save crashing mutants here")
    args = ap.parse_args(argv)

    shm = Path("/dev/shm")  # a RAM file system spares the disk ~1 GB of mutant writes
    workdir = Path(tempfile.mkdtemp(prefix="fuzz_gguf_", dir=shm if shm.is_dir() else None))
    try:
        seeds = build_seeds(workdir, args.smollm2 or default_model_path())
        baseline = _current_rss()
        _reset_peak_rss()
        largest = max(s.size for s in seeds)
        st = Stats()
        path = workdir / "mutant.gguf"
        cases = [args.only] if args.only is not None else range(args.cases)
        t0 = time.perf_counter()
        for i in cases:
            run_case(i, args.seed, seeds, path, st, args.crash_dir)
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    growth = _peak_rss() - baseline
    limit = 2 * largest
    ops = ",".join(f"{k}={v}" for k, v in sorted(st.ops.items()))
    print(f"fuzz_gguf: files={st.files} rejected={st.rejected} accepted={st.accepted} crashes={st.crashes} "
          f"over_1s={st.slow} max_case_ms={st.max_case_s * 1e3:.0f} full_loads={st.full_loads} "
          f"rss_growth_mb={growth / 1e6:.1f} rss_limit_mb={limit / 1e6:.1f} "
          f"(rule: peak RSS - baseline after imports+seeds < 2x largest input {largest / 1e6:.1f} MB) "
          f"seed={args.seed} wall_s={wall:.1f} ops[{ops}]")
    return 1 if st.crashes or st.slow or growth >= limit else 0


if __name__ == "__main__":
    sys.exit(main())
