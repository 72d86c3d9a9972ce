"""Where a cpu decode step's time goes, per step of the decode program and per thread count (issue 26:
decode >= llama.cpp at 4, 8 and 16 threads): q4_vnni.c's `prog_profile` records, from thread 0, the end
of each program step (after its barrier); the step's time outside `prog_run` (Python: the embedding
rows, positions, the logits' selection, the engine's sampling and bookkeeping) is the rest of a token.

    python3 bench/studies/cpu_step_profile.py MODEL.gguf [--threads 4,8,16] [--tokens 64] [--ahead BYTES]

`--ahead`: the C kernels rebuilt with q4_vnni.c's W_AHEAD (how far ahead the GEMM tiles prefetch their
codes; 0: none) for this run, to compare distances.

Prints per thread count: ms a token (engine step, prog_run, outside), then the program's steps summed
by kind (GEMMs by their n x k), with us a token and the GEMMs' GB/s of packed weight bytes.
`--prompt N`: instead, one N-token prompt chunk through the per-node plan, each node timed (the trace
recorder's hook), summed by op (matmuls by weight), with the matmuls' int8 TOP/s.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from minfer.api import load, sampling_params  # noqa: E402
from minfer.backends.cpu import native  # noqa: E402
from minfer.kernels.cpu import vnni  # noqa: E402

KINDS = {native.PS_NORM: "norm", native.PS_QUANT: "quant", native.PS_GEMM: "gemm", native.PS_ROPE: "rope",
         native.PS_KV: "kv write", native.PS_ATTN: "attention", native.PS_ADD: "add", native.PS_GLU: "glu",
         native.PS_GLU_Q: "glu+quant", native.PS_ROW: "row (add/norm/quant)", native.PS_SCALE: "scale",
         native.PS_PICK: "greedy pick"}


def gemm_bytes(st) -> float:
    """Packed weight bytes a GEMM step reads: the codes (bits a weight) and a float16 scale (+ zero) per 32, or
    for the K types' own scales (KM layout) a byte of scale and one of min per 32 and a float16 d and dmin per 256."""
    bits, km, w = st.a0 % vnni.KM_FLAG, st.a0 >= vnni.KM_FLAG, st.n * st.k
    scales = w / 32 * 2 + w / 256 * 4 if km else w / 32 * (4 if st.zz else 2)
    return w * bits / 8 + scales


def profile(path: str, threads: int, tokens: int) -> None:
    model = load(path, "cpu", n_slots=1, n_ctx=tokens + 64, threads=threads, progress=False)
    lib = vnni._library()
    runs = {"n": 0, "prog": 0.0, "steps": None}
    real_run = native.DecodeProgram._call  # (run's and pick's call: the greedy pick is the program's last step)

    def run(self, batch, n):
        if runs["steps"] is None or len(runs["steps"]) != n:
            runs.update(steps=[0.0] * n, buf=(ctypes.c_double * (n + 1))(), prog_obj=self)
        lib.prog_profile(runs["buf"])
        t = time.perf_counter()
        out = real_run(self, batch, n)
        runs["prog"] += time.perf_counter() - t
        lib.prog_profile(None)
        b = runs["buf"]
        for i in range(n):
            runs["steps"][i] += b[i + 1] - b[i]
        runs["n"] += 1
        return out

    native.DecodeProgram._call = run
    params = sampling_params(temperature=0, max_tokens=tokens, ignore_eos=True)
    model.generate("Once upon a time", params=params)  # warm-up
    runs.update(n=0, prog=0.0, steps=None)
    seq = model.submit("Once upon a time", params)
    model.run([seq])
    native.DecodeProgram._call = real_run
    st = seq.stats
    span = st.token_times[-1] - st.token_times[0]
    n = runs["n"]
    per_tok = span / (len(seq.generated) - 1) * 1e3
    prog = runs["prog"] / n * 1e3
    prog_obj = runs["prog_obj"]
    steps = prog_obj._array[:len(runs["steps"])]  # (the steps the calls ran: the pick where the engine picked)
    print(f"\n## {Path(path).name}, {threads} threads: {per_tok:.3f} ms a token ({1e3 / per_tok:.0f} tok/s), "
          f"prog_run {prog:.3f} ms, outside it {per_tok - prog:.3f} ms; {len(steps)} program steps")
    by_kind: dict[str, list] = defaultdict(lambda: [0, 0.0, 0.0])
    for i, s in enumerate(steps):
        kind = KINDS[s.op]
        key = f"gemm {s.n}x{s.k} ({s.a0 % vnni.KM_FLAG}-bit)" if s.op == native.PS_GEMM else kind
        e = by_kind[key]
        e[0] += 1
        e[1] += runs["steps"][i] / n * 1e6
        e[2] += gemm_bytes(s) if s.op == native.PS_GEMM else 0
    _table(("step", "us a token", "% of prog_run", "GB/s"), by_kind, 1.0, lambda nbytes, us: nbytes / us / 1e3)
    model.close()


def _table(cols: tuple[str, ...], by: dict, scale: float, rate) -> None:
    """A markdown table of `by` (key -> [count, time, work]), the longest first: the time times `scale`,
    its share, and rate(work, time) where there is work."""
    total = max(sum(e[1] for e in by.values()), 1e-12)
    print(f"| {cols[0]} | count | {' | '.join(cols[1:])} |")
    print("|---|---:|---:|---:|---:|")
    for key, (cnt, t, work) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        r = f"{rate(work, t):.2f}" if work else ""
        print(f"| {key} | {cnt} | {t * scale:.1f} | {100 * t / total:.1f} | {r} |")


class _Nodes:
    """A recorder for Plan.run: each node's seconds, by node id."""

    def __init__(self):
        self.seconds: dict[int, float] = defaultdict(float)
        self.rows: dict[int, int] = {}

    def node(self, nid, out, seconds, kernel=None):
        self.seconds[nid] += seconds
        self.rows[nid] = out.shape[0] if out.dim() > 1 else 1


def profile_prompt(path: str, threads: int, n: int) -> None:
    model = load(path, "cpu", n_slots=1, n_ctx=n + 16, threads=threads, progress=False)
    be = model.engine.backend
    ids = [(7 * i + 11) % 1000 + 100 for i in range(n)]
    real_forward = be.forward
    rec = _Nodes()
    spent = []

    def forward(batch, recorder=None):
        t = time.perf_counter()
        out = real_forward(batch, rec if batch.kind != "decode" else recorder)
        spent.append(time.perf_counter() - t)
        return out

    be.forward = forward
    params = sampling_params(temperature=0, max_tokens=1)
    for _ in range(2):  # a warm-up, then the measured one
        rec.seconds.clear()
        rec.rows.clear()
        spent.clear()
        model.reset()
        model.engine.run([model.engine.add(ids, params)])
    be.forward = real_forward
    total = sum(rec.seconds.values())
    g = be.graph
    print(f"\n## {Path(path).name}, {threads} threads, a {n}-token prompt: {n / sum(spent):.0f} tok/s "
          f"({sum(spent) * 1e3:.1f} ms in forward, {total * 1e3:.1f} ms in nodes)")
    by: dict[str, list] = defaultdict(lambda: [0, 0.0, 0.0])
    for nid, sec in rec.seconds.items():
        node = g.nodes[nid]
        if node.op.name == "MATMUL":
            m = be.matrix(node.weights["w"], node.weights.get("b"))
            key, ops = f"matmul {m.n}x{m.k} {'+'.join(m.kernels)}", 2 * m.n * m.k * rec.rows[nid]
        else:
            key, ops = node.op.name.lower(), 0
        e = by[key]
        e[0] += 1
        e[1] += sec
        e[2] += ops
    _table(("node", "ms", "%", "TOP/s"), by, 1e3, lambda ops, sec: ops / sec / 1e12)
    model.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--threads", default="4,8,16")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--ahead", type=int, default=None, help="q4_vnni.c's W_AHEAD for this run")
    ap.add_argument("--prompt", type=int, default=0, help="profile a prompt of this many tokens instead")
    args = ap.parse_args()
    if args.ahead is not None:
        for isa, (need, flags) in vnni.ISAS.items():
            vnni.ISAS[isa] = (need, [*flags, f"-DW_AHEAD={args.ahead}"])
        print(f"W_AHEAD={args.ahead}")
    torch.set_num_threads(1)  # (the engine sets its own; nothing else here computes)
    for t in (int(x) for x in args.threads.split(",")):
        if args.prompt:
            profile_prompt(args.model, t, args.prompt)
        else:
            profile(args.model, t, args.tokens)


if __name__ == "__main__":
    main()
