"""Benchmark: dequantize every tensor of the default SmolLM2 file to float32 with the torch reference.

Not a test. Usage:  python bench/studies/dequant_smollm2.py [MODEL.gguf] [--repeats N] [--threads T]

Each pass decodes all tensors (zero-copy mmap bytes -> new float32 tensors) and frees them.
The first pass also pays for page faults on the mapped file; the best pass is the steady state.
GB/s counts the float32 bytes written. The last line is the one result line.
"""

from __future__ import annotations

import argparse
import collections
import time

import torch

from minfer.default_model import default_model_path
from minfer.gguf.reader import GGUFReader
from minfer.quant.reference import dequantize


def one_pass(reader: GGUFReader) -> float:
    t0 = time.perf_counter()
    for name, info in reader.tensors.items():
        out = dequantize(reader.tensor_bytes(name), info.ggml_type, info.torch_shape)
        del out
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=None, help="GGUF file (default: SmolLM2-135M Q4_1)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    with GGUFReader(args.model or default_model_path()) as reader:
        n_tensors = len(reader.tensors)
        n_elems = sum(t.n_elems for t in reader.tensors.values())
        n_bytes = sum(t.nbytes for t in reader.tensors.values())
        by_type = collections.Counter(t.ggml_type.name for t in reader.tensors.values())
        times = [one_pass(reader) for _ in range(args.repeats)]

    best = min(times)
    types = ", ".join(f"{k} x{v}" for k, v in sorted(by_type.items()))
    print(f"types: {types}; passes (s): {', '.join(f'{t:.3f}' for t in times)}")
    print(
        f"dequant_smollm2: {n_tensors} tensors, {n_elems / 1e6:.1f} M elems, "
        f"{n_bytes / 1e6:.1f} MB in -> {4 * n_elems / 1e6:.1f} MB f32, best {best:.3f} s "
        f"(first {times[0]:.3f} s), {4 * n_elems / best / 1e9:.2f} GB/s out, threads={args.threads}"
    )


if __name__ == "__main__":
    main()
