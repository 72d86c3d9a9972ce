"""Instructions per weight of each GEMV variant's K loop, from its sm_90 SASS (no GPU needed).

    python bench/studies/gemv_sass.py [SUBSTRING ...]  # variants of tests/kernels/triton/sm90_compile.py matching

Compiles the GEMV variants the sm_90 compile check lists (Q4_0 / Q4_1 / Q4_K and the planes types),
finds the K loop (the longest backward branch) in `cuobjdump -sass`, and prints its instruction
count divided by the weights one thread handles per iteration (R rows x 32), with the most
frequent opcodes. At ~4 warp-instructions per SM-clock issue, 132 SMs and 1.98 GHz, an H200 issues
~3.35e13 thread-instructions/s: instructions per weight bound the weights/s a GEMV can reach.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "kernels" / "triton"))

ISSUE_RATE = 132 * 4 * 32 * 1.98e9  # thread-instructions / s on an H200
BYTES = {"mode 0": 0.5625, "mode 1": 0.625, "mode 2": 0.5625, "Q8_0": 1.0625, "Q5_0": 0.6875, "Q5_1": 0.75,
         "Q5_K": 0.6875, "Q6_K": 0.8203, "Q3_K": 0.4297, "Q2_K": 0.3281}


def loop_stats(fn, sig, consts, opts) -> tuple[int, dict[str, int]]:
    import sm90_compile as m
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = triton.compile(ASTSource(fn, sig, consts, m.aligned(fn, sig)), target=GPUTarget(*m.TARGET), options=opts)
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    marks = [(re.match(r"\s+/\*([0-9a-f]{4})\*/", line), line) for line in sass.splitlines()]
    lines = [(int(a.group(1), 16), line) for a, line in marks if a]
    loops = []
    for addr, line in lines:
        target = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", line) or re.search(r"BRA.*0x([0-9a-f]+)", line)
        if target and int(target.group(1), 16) < addr:
            loops.append((int(target.group(1), 16), addr))
    if not loops:
        return 0, {}
    lo, hi = max(loops, key=lambda x: x[1] - x[0])
    ops: dict[str, int] = {}
    body = [line for addr, line in lines if lo <= addr <= hi]
    for line in body:
        op = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
        if op:
            ops[op.group(1)] = ops.get(op.group(1), 0) + 1
    return len(body), ops


def main(argv: list[str]) -> int:
    import sm90_compile as m

    want = argv or ["gemv"]
    for name, fn, sig, consts, opts in m.variants():
        if "gemv" not in name or not any(w in name for w in want):
            continue
        n, ops = loop_stats(fn, sig, consts, opts)
        per = n / (consts["R"] * 32) if n else float("nan")
        key = next((k for k in BYTES if k in name), None)
        ceiling = ISSUE_RATE / per * BYTES[key] / 1e12 if key and n else float("nan")
        top = ", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:8])
        print(f"{name:64} {per:5.2f} instr/weight  issue ceiling {ceiling:4.1f} TB/s  [{top}]", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
