"""What limits the Q4_0 GEMV: tile configs around the production one, and probes that run the
production tile and K loop without the math, splitting the time into weight loads, scale loads,
x loads and unpacking (bench/NOTES.md, 2026-11-30 run 2; results/gemv-study-2026-11-30-run2.txt).

    python bench/studies/gemv_study.py     # CUDA only, ~20 s on an H200

Device µs per call: CUDA-graph replays rotating over operand copies (minfer.contracts.judge);
% of the measured copy bandwidth for the GEMV's compulsory bytes (qs + scales + x + out).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout, no install needed

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from minfer.contracts.judge import copy_bandwidth, do_bench_us, graph_replay_us, rotation  # noqa: E402
from minfer.kernels.triton import gemv, q4_0  # noqa: E402

SHAPES = [(18944, 3584), (3584, 18944), (3584, 3584), (152064, 3584), (4864, 896), (896, 4864)]
G = gemv.GemvConfig
CONFIGS = {  # rR lL wW sS: R rows per lane, L lanes along rows (32 / L along K), W warps, S splits
    "production": None,
    "r4l16w4": G(lr=16),
    "r4l8w8": G(wk=8),
    "r4l8w2": G(wk=2),
    "r2l16w4": G(r=2, lr=16),
    "r4l8w4 s2": G(split=2),
    "r4l8w4 s3": G(split=3),
    "r4l8w4 s6": G(split=6),
}
PROBES = {"probe W": (False, False), "probe W+d": (True, False), "probe W+d+x": (True, True)}


@triton.jit
def _probe(x_ptr, qs_ptr, d_ptr, out_ptr, N, NKB, R: tl.constexpr, LR: tl.constexpr, LK: tl.constexpr,
           WK: tl.constexpr, LOAD_D: tl.constexpr, LOAD_X: tl.constexpr):
    """The GEMV's loads (same tile, same loop) with no math: XOR of the words (+ scales, + x)."""
    BLOCK_N: tl.constexpr = R * LR
    BLOCK_KB: tl.constexpr = LK * WK
    lk = tl.arange(0, LK)[:, None, None, None, None]
    lr = tl.arange(0, LR)[None, :, None, None, None]
    wk = tl.arange(0, WK)[None, None, :, None, None]
    r = tl.arange(0, R)[None, None, None, :, None]
    j = tl.arange(0, 4)[None, None, None, None, :]
    rows = tl.minimum(tl.program_id(0) * BLOCK_N + r * LR + lr, N - 1).to(tl.int64)
    kb = wk * LK + lk
    x_base = x_ptr + j + tl.zeros([1, LR, 1, R, 1], tl.int32)
    acc = tl.zeros([LK, LR, WK, R, 4], dtype=tl.int32)
    for kb0 in range(0, NKB, BLOCK_KB):
        kbs = tl.minimum(kb0 + kb, NKB - 1)
        acc ^= tl.load(qs_ptr + rows * (NKB * 4) + j + kbs * 4)
        if LOAD_D:
            acc ^= tl.load(d_ptr + rows * NKB + kbs).to(tl.int16, bitcast=True).to(tl.int32)
        if LOAD_X:
            xp = x_base + kbs * 32
            xs = tl.load(xp) + tl.load(xp + 4) + tl.load(xp + 8) + tl.load(xp + 12)
            xs += tl.load(xp + 16) + tl.load(xp + 20) + tl.load(xp + 24) + tl.load(xp + 28)
            acc ^= xs.to(tl.int32, bitcast=True)
    acc = tl.xor_sum(tl.xor_sum(acc, axis=4), axis=3)
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(tl.xor_sum(tl.xor_sum(acc, axis=2), axis=1), axis=0))


@triton.jit
def _linear(qs_ptr, out_ptr, CHUNK, TOTAL, BLOCK: tl.constexpr):
    """Each program reads its own CHUNK contiguous words (the qs of its rows) front to back."""
    start = tl.program_id(0).to(tl.int64) * CHUNK
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in range(0, CHUNK, BLOCK):
        at = start + i + offs
        acc ^= tl.load(qs_ptr + at, mask=(i + offs < CHUNK) & (at < TOTAL), other=0)
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(acc, axis=0))


def operands(n: int, k: int, copies: int) -> list[tuple]:
    """`copies` independent (x, packed W, out) sets with model-like Q4_0 scales (0.01)."""
    sets = []
    for _ in range(copies):
        raw = torch.randint(0, 256, (n * k // 32, 18), dtype=torch.uint8, device="cuda")
        raw[:, :2] = torch.tensor([0.01], dtype=torch.float16).view(torch.uint8).cuda()
        sets.append((torch.randn(k, device="cuda"), q4_0.repack_q4_0(raw.reshape(-1), n, k),
                     torch.empty(1, n, device="cuda")))
    return sets


def device_us(sets: list[tuple], call: Callable[[tuple], object]) -> float:
    """Graph-replayed µs per call, rotating over the operand sets."""
    queue = iter(range(10**9))
    return graph_replay_us(lambda: (lambda ops=sets[next(queue) % len(sets)]: call(ops)), len(sets))


def study(n: int, k: int, bandwidth: float) -> dict[str, float]:
    """Device µs of every config (and, for long rows, every probe) on an [n, k] weight."""
    nbytes = n * k * 9 // 16 + 4 * (n + k)
    sets = operands(n, k, rotation(nbytes))
    out = {}
    for name, cfg in CONFIGS.items():
        if cfg is None or cfg.split == 1 or n <= 4864:  # splits only where rows are few
            out[name] = device_us(
                sets, lambda ops, cfg=cfg: q4_0.q4_0_gemv(ops[0], ops[1], n, k, out=ops[2], config=cfg)
            )
    if n >= 4864:
        cfg = gemv.gemv_config(n, k)
        grid = (triton.cdiv(n, cfg.block_n),)
        sink = torch.empty(grid[0], dtype=torch.int32, device="cuda")
        for name, (load_d, load_x) in PROBES.items():
            out[name] = device_us(sets, lambda ops, d=load_d, x=load_x: _probe[grid](
                ops[0], ops[1].qs, ops[1].d, sink, n, k // 32, R=cfg.r, LR=cfg.lr, LK=32 // cfg.lr, WK=cfg.wk,
                LOAD_D=d, LOAD_X=x, num_warps=cfg.wk, maxnreg=cfg.maxnreg))
        chunk = cfg.block_n * k // 8
        words = n * k // 8
        linear = lambda ops: _linear[grid](ops[1].qs, sink, chunk, words, BLOCK=512)  # noqa: E731
        out["linear qs"] = device_us(sets, linear)
    for name, us in out.items():
        share = 100 * nbytes / (us * 1e-6) / bandwidth
        print(f"{n}x{k} {name:14} {us:8.2f} us {share:5.1f}%", flush=True)
    return out


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    bandwidth = copy_bandwidth("cuda", do_bench_us)
    print(f"# {torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e9:.0f} GB/s", flush=True)
    for n, k in SHAPES:
        study(n, k, bandwidth)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
