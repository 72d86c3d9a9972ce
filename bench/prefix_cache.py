"""Benchmark: the prefix cache across requests, on vs off, through the HTTP server. Not a test.

    python bench/prefix_cache.py [-m MODEL] [--device cpu|cuda] [--concurrency 64]
                                 [--prefix-tokens 2000] [--own-tokens 100] [--gen-tokens 128] [--rounds 2]

The issue-28 workload: `--concurrency` streaming /v1/completions requests sent at once, each a
shared system prefix of `--prefix-tokens` random token ids (the same in every request, round and
mode) plus `--own-tokens` of its own, greedy, ignore_eos, exactly `--gen-tokens` generated. For
each mode it starts `minfer serve` (bench/serve.py's start_server: -np = the concurrency; the
cache off: --no-prefix-cache), sends one warm-up request holding the prefix (the state of a
server that has seen the system prompt before), then `--rounds` rounds of fresh own tokens.
Reports per mode TTFT p50 / p99 (request sent -> first text chunk, over every request of every
round), aggregate generated tok/s (median round), and the prefix-cache hit / miss tokens from
/metrics; then whether every request's greedy text is the same with the cache on and off
(exit status 1 if not).

On the H200 (the lead's run): a 7B Q4_0 synthetic model,
    python3 -m minfer.cli synth qwen2.5-7b q4_0 /tmp/models/qwen2.5-7b-q4_0.gguf
    python3 bench/prefix_cache.py -m /tmp/models/qwen2.5-7b-q4_0.gguf --device cuda
On cpu at small scale (the default model):
    python bench/prefix_cache.py --concurrency 4 --prefix-tokens 256 --own-tokens 16 --gen-tokens 8 -t 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import pct, start_server, streams  # noqa: E402  (bench/serve.py: its server and streams)


def round_(url: str, model: str, prompts: list[list[int]], gen: int) -> tuple[list[dict], float]:
    """Every prompt as one stream, all sent at once: the results and the round's wall time."""
    t0 = time.perf_counter()
    res = asyncio.run(streams(url, model, prompts, gen, t0))
    return res, max(r["end"] for r in res) - t0


def metric(url: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", httpx.get(url + "/metrics", timeout=30).text, re.M)
    return float(m.group(1)) if m else float("nan")


def mode(a, on: bool) -> dict:
    serve = argparse.Namespace(device=a.device, model=a.model, threads=a.threads, concurrency=[a.concurrency],
                               prompt_tokens=a.prefix_tokens + a.own_tokens, gen_tokens=a.gen_tokens,
                               serve_arg=list(a.serve_arg) + ([] if on else ["--no-prefix-cache"]))
    proc, url = start_server(serve)
    try:
        card = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]
        model, vocab = card["id"], card.get("meta", {}).get("n_vocab", 32000)
        rng = random.Random(a.seed)  # the same prompts in both modes
        prefix = [rng.randrange(vocab) for _ in range(a.prefix_tokens)]
        round_(url, model, [prefix + [rng.randrange(vocab) for _ in range(a.own_tokens)]], 4)
        hits0, miss0 = (metric(url, f"minfer_prefix_cache_{k}_tokens_total") for k in ("hit", "miss"))
        ttft, tps, texts = [], [], []
        for _ in range(a.rounds):
            prompts = [prefix + [rng.randrange(vocab) for _ in range(a.own_tokens)] for _ in range(a.concurrency)]
            res, wall = round_(url, model, prompts, a.gen_tokens)
            ttft += [r["ttft"] for r in res]
            tps.append(a.concurrency * a.gen_tokens / wall)
            texts += [r["text"] for r in res]
        hits, miss = (metric(url, f"minfer_prefix_cache_{k}_tokens_total") for k in ("hit", "miss"))
    finally:
        proc.terminate()
        proc.wait(60)
    return {"cache": "on" if on else "off", "model": model, "ttft_p50_ms": 1e3 * pct(ttft, 50),
            "ttft_p99_ms": 1e3 * pct(ttft, 99), "aggregate_tps": statistics.median(tps), "rounds_tps": tps,
            "hit_tokens": hits - hits0, "miss_tokens": miss - miss0, "texts": texts}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", default=None, help="GGUF file (default: the default model)")
    p.add_argument("--device", default="cpu")
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--prefix-tokens", type=int, default=2000)
    p.add_argument("--own-tokens", type=int, default=100)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="pass this argument on to minfer serve (repeatable), e.g. --serve-arg=--prefix-block=16")
    a = p.parse_args()
    rows = [mode(a, True), mode(a, False)]
    same = rows[0]["texts"] == rows[1]["texts"]
    differ = sum(x != y for x, y in zip(rows[0]["texts"], rows[1]["texts"], strict=True))
    if a.json:
        print(json.dumps({"device": a.device, "concurrency": a.concurrency, "prefix_tokens": a.prefix_tokens,
                          "own_tokens": a.own_tokens, "gen_tokens": a.gen_tokens, "rounds": a.rounds,
                          "date": time.strftime("%Y-%m-%d"), "greedy_identical": same,
                          "rows": [{k: v for k, v in r.items() if k != "texts"} for r in rows]}, indent=1))
    print(f"\n{rows[0]['model']} on {a.device}: {a.concurrency} concurrent requests, a shared {a.prefix_tokens}-token "
          f"prefix + {a.own_tokens} own tokens, {a.gen_tokens} generated, {a.rounds} rounds (HTTP, streaming)")
    print("| prefix cache | TTFT p50 ms | TTFT p99 ms | aggregate tok/s | hit tokens | miss tokens |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['cache']} | {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {r['aggregate_tps']:.1f} | "
              f"{r['hit_tokens']:.0f} | {r['miss_tokens']:.0f} |")
    on, off = rows
    print(f"on vs off: TTFT p50 {off['ttft_p50_ms'] / on['ttft_p50_ms']:.2f}x lower, aggregate tok/s "
          f"{on['aggregate_tps'] / off['aggregate_tps']:.2f}x; greedy outputs identical: {same}"
          + ("" if same else f" ({differ} of {len(on['texts'])} differ)"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
