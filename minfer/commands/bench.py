"""`minfer bench`: llama-bench's table for minfer: prompt processing, generation, batched decode.

    minfer bench -m MODEL [-p 512] [-n 128] [-b 1,4,16,64] [-r 5] [--device cuda|cpu|vulkan] [--tp N] [--json]

- pp{p}: one prompt of p tokens (random ids) in one forward pass, from an empty cache; tok/s.
- tg{n}: one sequence generating n tokens greedily (prompt of 16), through the engine's loop
  (scheduler, greedy argmax, CUDA-graph replay on cuda): (n - 1) decode steps / their time.
  `--temperature T` samples instead (top-k 40, top-p 0.95, min-p 0.05, seeded), as `minfer run`.
- b{B}: llama-batched-bench's test: B sequences, 128 prompt + 128 generated tokens each, all
  decoding together; aggregate generated tok/s over the decode phase.
- b{B}e2e: the same runs, generated tok/s over the whole request (prompts queued at once, then
  prefill and decode): the engine's side of `bench/serve.py`'s aggregate at concurrency B.
Each test runs -r times (after one warm-up): mean ± sd. Decode rows also give the effective
bandwidth: bytes of weights one decode step reads (every matmul weight in its stored form, on
cpu in its packed int4 form, and one embedding row) x steps/s, and its share of the copy
bandwidth (read + write of a large buffer) measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from . import common


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="prompt / generation / batched-decode speed, llama-bench style",
                       description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_model_args(p)
    p.add_argument("-p", "--n-prompt", type=int, default=512, help="prompt tokens of the pp test (0: skip)")
    p.add_argument("-n", "--n-gen", type=int, default=128, help="generated tokens of the tg test (0: skip)")
    p.add_argument("-b", "--batch", default="", help="batched-decode sizes, e.g. 1,4,16,64 (default: none)")
    p.add_argument("-r", "--repetitions", type=int, default=5, help="runs per test (default 5)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sample the tg and batched tests at this temperature (default 0: greedy)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=bench)


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()


def copy_bandwidth(device: str, backend=None) -> float:
    """Bytes/s of a large device-to-device copy (read + write), best of 5 (a wgpu backend: a WGSL
    vec4 copy kernel on its adapter, device-timed: `Device.copy_bandwidth`; its buffer-to-buffer
    copy moves ~5x less on an H200 and is no bound on a kernel)."""
    import torch

    own = backend.copy_bandwidth() if backend is not None else None
    if own is not None:
        return own

    if device != "cuda" or not torch.cuda.is_available():
        n = 1 << 28  # 256 MB: far past any CPU cache
        a, b = torch.empty(n, dtype=torch.uint8), torch.empty(n, dtype=torch.uint8)
    else:
        n = 1 << 30
        a, b = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(n, dtype=torch.uint8, device="cuda")
    best = float("inf")
    for _ in range(5):
        _sync(device)
        t0 = time.perf_counter()
        b.copy_(a)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n / best


def decode_bytes(model) -> int:
    """Weight bytes one decode row reads: each matmul weight once, in its stored size (on cpu: in
    the packed form the backend multiplies by, `decode_weight_bytes`; an expert tensor: the k of its
    E experts a row runs, the roofline of a mixture of experts), plus one embedding row
    (norm weights and biases are negligible). Split over ranks (--tp): what one rank reads, its
    part of each tensor (GB/s and % copy bandwidth are then per GPU)."""
    from ..graph.ir import Op

    own = model.engine.backend.decode_weight_bytes()
    if own is not None:
        return own
    reader = model.engine.weights or model.reader
    seen, total = set(), 0
    for node in model.engine.graph.nodes:
        for role, w in node.weights.items():
            for t in w.tensors:
                if t.name in seen:
                    continue
                info = reader.tensors[t.name]
                if node.op == Op.MATMUL and role == "w":
                    seen.add(t.name)
                    total += info.nbytes
                elif node.op == Op.MOE_MATMUL and role == "w":  # the k experts a row runs, of E
                    seen.add(t.name)
                    total += info.nbytes * node.shape[1] // node.params["n_expert"]
                elif node.op == Op.GET_ROWS:
                    total += info.nbytes // info.torch_shape[0]
    return total


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    import statistics

    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def run_pp(m, n_prompt: int, reps: int) -> list[float]:
    from ..backends.base import Batch

    be, dev = m.engine.backend, m.config.device
    ids = [(7 * i + 11) % m.n_vocab for i in range(n_prompt)]
    out = []
    for r in range(reps + 1):
        _sync(dev)
        t0 = time.perf_counter()
        for off in range(0, n_prompt, m.config.prefill_chunk):
            chunk = ids[off:off + m.config.prefill_chunk]
            be.forward(Batch.single(chunk, off, slot=0))
        _sync(dev)
        if r:
            out.append(n_prompt / (time.perf_counter() - t0))
    return out


def _decode_phase(m, prompts: list[list[int]], n_gen: int, temperature: float = 0.0,
                  whole: list[float] | None = None) -> float:
    """Generated tok/s of the decode phase of these prompts (all prefilled first). `whole`: gets
    the generated tok/s from the moment the prompts were queued (prefill included)."""
    from ..engine.params import SamplingParams

    eng = m.engine
    params = SamplingParams(max_tokens=n_gen, temperature=temperature, seed=1, ignore_eos=True)
    _sync(m.config.device)
    queued = time.perf_counter()
    seqs = [eng.add(p, params, reuse_prefix=False) for p in prompts]
    while any(s.prefilling or s.status.value == "waiting" for s in seqs):
        eng.step()
    start = sum(len(s.generated) for s in seqs)
    _sync(m.config.device)
    t0 = time.perf_counter()
    eng.run(seqs)
    _sync(m.config.device)
    end = time.perf_counter()
    total = sum(len(s.generated) for s in seqs)
    if whole is not None:
        whole.append(total / (end - queued))
    return (total - start) / (end - t0)


def run_tg(m, n_gen: int, reps: int, temperature: float = 0.0) -> list[float]:
    prompt = [(5 * i + 3) % m.n_vocab for i in range(16)]
    return [_decode_phase(m, [prompt], n_gen, temperature) for r in range(reps + 1)][1:]


def run_batched(m, b: int, reps: int, temperature: float = 0.0) -> tuple[list[float], list[float]]:
    """(decode-phase tok/s, whole-request tok/s) of each repetition."""
    prompts = [[(13 * i + 7 * j + 1) % m.n_vocab for i in range(128)] for j in range(b)]
    whole: list[float] = []
    decode = [_decode_phase(m, prompts, 128, temperature, whole) for r in range(reps + 1)]
    return decode[1:], whole[1:]


def bench(a: argparse.Namespace) -> int:
    import statistics

    from ..errors import MinferError

    try:
        sizes = [int(x) for x in a.batch.split(",") if x.strip()] if a.batch else []
    except ValueError:
        raise MinferError(f"-b/--batch takes batch sizes separated by commas (e.g. 1,4,16), got {a.batch!r}") from None
    if a.repetitions < 1 or a.n_prompt < 0 or a.n_gen < 0 or any(b < 1 for b in sizes):
        raise MinferError("-r must be >= 1, -p and -n >= 0, and -b sizes >= 1")
    if not 0.0 <= a.temperature <= 100.0:
        raise MinferError(f"--temperature must be in 0..100, got {a.temperature}")
    n_ctx = max(a.n_prompt, 16 + a.n_gen, 256 if sizes else 0, 64)
    need = max(a.n_prompt, 16 + a.n_gen if a.n_gen else 0, 256 if sizes else 0)  # (the tests' contexts)
    if a.ctx and a.ctx < need:  # said before the model loads
        raise MinferError(f"-c/--ctx-size {a.ctx} is too small for these tests: -p {a.n_prompt} needs {a.n_prompt}, "
                          f"-n {a.n_gen} needs {16 + a.n_gen} (a 16-token prompt first)"
                          + (", batched decode 256 (128 + 128 a sequence)" if sizes else "")
                          + "; leave -c out to size it for them")
    config = common.engine_config(a, n_ctx=a.ctx or n_ctx, n_slots=max(sizes + [1]))
    if common.follower(a, config):
        return 0
    m = common.load_model(a, config)
    rows = []
    try:
        wbytes = decode_bytes(m)
        bw = copy_bandwidth(config.device, m.engine.backend)
        info = {"model": m.path.name, "size_gb": m.path.stat().st_size / 1e9, "backend": config.device,
                "tp": m.engine.graph.meta.get("tp_world", 1), "copy_gbs": bw / 1e9, "weight_bytes_per_token": wbytes}
        isa = getattr(m.engine.backend, "cpu_isa", None)  # the cpu backend's kernel path (MINFER_CPU_ISA)
        if isa is not None:
            info["cpu_isa"] = isa
            info["cpu_prompt_passes"] = passes = config.cpu_prompt_passes  # the C kernels' int8 passes on prompts
            if not a.json:
                how = "torch" if isa == "torch" else (f"C, {isa} build; int8 activations in {passes} pass"
                                                      f"{'es' if passes > 1 else ''} on prompts where the type has"
                                                      " a one-pass kernel, 2 on decode rows")
                print(f"cpu kernels: {how} (MINFER_CPU_ISA, MINFER_CPU_PROMPT_PASSES pick)", file=sys.stderr)

        def row(test: str, runs: list[float], steps_per_s: float | None = None) -> None:
            mean, sd = _mean_sd(runs)
            r = {"test": test, "tok_s": mean, "sd": sd, "runs": runs}
            if steps_per_s is not None:
                r["gbs"] = wbytes * steps_per_s / 1e9
                r["pct_copy_bw"] = 100 * wbytes * steps_per_s / bw
            rows.append(r)
            if not a.json:
                extra = f"{r['gbs']:9.1f} {r['pct_copy_bw']:6.1f}%" if "gbs" in r else ""
                print(f"{info['model'][:34]:34} {info['size_gb']:6.2f} GB {config.device:5} {test:>8} "
                      f"{mean:10.1f} ± {sd:7.1f} {extra}", flush=True)

        if not a.json:
            print(f"{'model':34} {'size':>9} {'dev':5} {'test':>8} {'tok/s':>10}   {'sd':>7} {'GB/s':>9} {'%copy':>7}")
        if a.n_prompt:
            row(f"pp{a.n_prompt}", run_pp(m, a.n_prompt, a.repetitions))
        if a.n_gen:
            runs = run_tg(m, a.n_gen, a.repetitions, a.temperature)
            row(f"tg{a.n_gen}", runs, statistics.mean(runs))
        for b in sizes:
            runs, whole = run_batched(m, b, a.repetitions, a.temperature)
            row(f"b{b}", runs, statistics.mean(runs) / b)
            row(f"b{b}e2e", whole)
        if not a.json:
            per = f" per rank (--tp {info['tp']})" if info["tp"] > 1 else ""
            print(f"copy bandwidth {bw / 1e9:.0f} GB/s; weights read per decode step {wbytes / 1e9:.3f} GB{per}",
                  file=sys.stderr)
        else:
            print(json.dumps({**info, "results": rows}, indent=1))
    finally:
        common.close_model(m, config)
    return 0
