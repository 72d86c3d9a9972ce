"""Decode tok/s with vs without a JSON schema: what structured outputs cost (docs/SERVER.md).

    python bench/structured.py -m MODEL.gguf --device cuda --batch 1,16 --tokens 256 --rounds 3

For each batch size B: B greedy requests of free text (ignore_eos) and B of the same prompts
under a JSON schema that cannot complete within --tokens (an array of at least 10,000 short
strings: every step is masked, none ends early), through the engine (no HTTP). The decode rate
is the aggregate of generated tokens after the first, over the span from the first request's
first token to the last one's last token (the prompts' prefill excluded). Prints one table row
per (B, mode), the best of --rounds after one warm-up round, and the cost in %.

On the H200 (synthetic 7B; llguidance travels as a wheel, pure Rust, abi3):
    (or bench/gpu_structured.sh: the wheel, the 7B, the cuda tests and this, in one device call)
    pip download --no-deps llguidance==1.9.1 -d .whl        # here, once
    python3 -m pip install -q --no-index --no-deps --target /tmp/pylib .whl/*.whl
    PYTHONPATH=.:/tmp/pylib python3 -m minfer.cli synth qwen2.5-7b q4_0 /tmp/q7.gguf
    PYTHONPATH=.:/tmp/pylib python3 bench/structured.py -m /tmp/q7.gguf --device cuda --batch 1,16
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minfer.api import load, sampling_params  # noqa: E402

SCHEMA = {"type": "array", "minItems": 10_000, "items": {"type": "string", "maxLength": 24}}
PROMPTS = ["List some words as a JSON array of strings:", "Write a JSON array of city names:",
           "Give a JSON list of colors:", "Here is a JSON array of animals:"]


def decode_rate(model, n: int, tokens: int, schema: dict | None) -> tuple[float, int]:
    """(aggregate decode tok/s, tokens generated) of n requests run together."""
    params = sampling_params(json_schema=schema, temperature=0, max_tokens=tokens, ignore_eos=schema is None)
    seqs = [model.submit(PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)), params) for i in range(n)]
    model.run(seqs)
    bad = [s.finish_reason for s in seqs if s.finish_reason != "length"]
    if bad:
        raise SystemExit(f"a request ended before max_tokens ({bad[0]}): the rate would not be comparable")
    first = min(s.stats.token_times[0] for s in seqs)
    last = max(s.stats.token_times[-1] for s in seqs)
    steps = sum(len(s.generated) - 1 for s in seqs)
    return steps / (last - first), sum(len(s.generated) for s in seqs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF file (default: SmolLM2)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", default="1,16", help="batch sizes, comma-separated")
    ap.add_argument("--tokens", type=int, default=256, help="tokens generated per request")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(x) for x in args.batch.split(",")]
    model = load(args.model, args.device, n_slots=max(sizes), n_ctx=args.tokens + 64, progress=False)
    print(f"{model.path.name} on {args.device}: {args.tokens} tokens per request, best of {args.rounds}")
    print("| B | free text tok/s | json_schema tok/s | cost |")
    print("|---:|---:|---:|---:|")
    for b in sizes:
        rates = {}
        for schema in (None, SCHEMA):
            decode_rate(model, b, min(args.tokens, 32), schema)  # warm-up (graphs, the matcher's lexer)
            rates[schema is None] = max(decode_rate(model, b, args.tokens, schema)[0] for _ in range(args.rounds))
        free, guided = rates[True], rates[False]
        print(f"| {b} | {free:,.0f} | {guided:,.0f} | {100 * (1 - guided / free):+.1f} % |", flush=True)
    model.close()


if __name__ == "__main__":
    main()
