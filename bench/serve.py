"""Benchmark: the HTTP server under concurrent streaming clients. Not a test.

    python bench/serve.py [-m MODEL] [--device cpu|cuda] [--threads 2] [--concurrency 1,4,8,16,64]
                          [--prompt-tokens 128] [--gen-tokens 128] [--url http://HOST:PORT] [--json]

Starts `minfer serve` itself (--parallel = the largest concurrency, context = prompt + gen + 8,
a free port on 127.0.0.1) unless --url names a running server. At each concurrency C it sends
C streaming /v1/completions requests at once (random token-id prompts of exactly
--prompt-tokens, greedy, ignore_eos, exactly --gen-tokens generated), `--rounds` times, and
reports:
- aggregate generated tok/s: every request's completion tokens / wall time of the round
  (first request sent -> last [DONE]); the median round;
- TTFT per request (request sent -> first text chunk) and inter-token latency (time between
  successive text chunks: one per generated token while the stream keeps up; a stream that
  fell behind gets the tokens queued for it in one chunk), p50 and p99 over every request of
  every round.
The clients run in `--client-procs` processes (default: one per 8 streams, at most 8), started
before the first round and released together at each round's start, so the measuring side is
not the bottleneck (one Python process parsing 64 streams of SSE is). One warm-up request
first. Needs only httpx (and minfer for the server it starts). Prints a short table last (and a
JSON document before it with --json).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import multiprocessing
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def start_server(a) -> tuple[subprocess.Popen, str]:
    argv = [sys.executable, "-m", "minfer.cli", "serve", "--port", "0", "--device", a.device,
            # -c is the total context, split over the -np slots (llama-server's meaning)
            "-np", str(max(a.concurrency)), "-c", str((a.prompt_tokens + a.gen_tokens + 8) * max(a.concurrency))]
    if a.model:
        argv += ["-m", a.model]
    if a.threads:
        argv += ["-t", str(a.threads)]
    argv += a.serve_arg
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, text=True)
    line = proc.stderr.readline()
    m = re.search(r"on (http://\S+) ", line)
    if not m:
        proc.kill()
        raise SystemExit(f"minfer serve did not start: {line}{proc.stderr.read()}")
    url = m.group(1)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"minfer serve exited: {proc.stderr.read()}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("minfer serve did not become ready in 600 s")


async def one(client: httpx.AsyncClient, url: str, model: str, prompt: list[int], gen: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": gen, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    times, tokens, text = [], 0, []
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                raise RuntimeError(ev["error"]["message"])
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            if ev["choices"] and ev["choices"][0]["text"]:
                times.append(time.perf_counter())
                text.append(ev["choices"][0]["text"])
    end = time.perf_counter()
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return {"ttft": times[0] - t0 if times else float("nan"), "itl": gaps, "tokens": tokens, "seconds": end - t0,
            "text": "".join(text)}


async def streams(url: str, model: str, prompts: list[list[int]], gen: int, start_at: float) -> list[dict]:
    """Every prompt as one stream, all sent at `start_at` (time.perf_counter, shared by the
    processes of this machine)."""
    limits = httpx.Limits(max_connections=len(prompts) + 4, max_keepalive_connections=len(prompts) + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600), limits=limits) as client:
        await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
        res = await asyncio.gather(*(one(client, url, model, p, gen) for p in prompts))
    end = time.perf_counter()
    return [dict(r, end=end) for r in res]


def client_proc(url: str, model: str, prompts: list[list[int]], gen: int, start_at: float) -> list[dict]:
    return asyncio.run(streams(url, model, prompts, gen, start_at))


def level(url: str, model: str, c: int, a, vocab: int, rng: random.Random) -> dict:
    procs = max(1, min(c, a.client_procs or min(8, -(-c // 8))))
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(procs, mp_context=ctx) as pool:
        list(pool.map(time.sleep, [0.0] * procs))  # every client process started before the first round
        rounds, ttft, itl = [], [], []
        for _ in range(a.rounds):
            prompts = [[rng.randrange(vocab) for _ in range(a.prompt_tokens)] for _ in range(c)]
            t0 = time.perf_counter() + 0.1
            parts = [prompts[i::procs] for i in range(procs)]
            res = [r for part in pool.map(client_proc, [url] * procs, [model] * procs, parts, [a.gen_tokens] * procs,
                                          [t0] * procs) for r in part]
            wall = max(r["end"] for r in res) - t0
            rounds.append(sum(r["tokens"] for r in res) / wall)
            ttft += [r["ttft"] for r in res]
            itl += [x for r in res for x in r["itl"]]
    return {"concurrency": c, "aggregate_tps": statistics.median(rounds), "rounds_tps": rounds,
            "ttft_p50_ms": 1e3 * pct(ttft, 50), "ttft_p99_ms": 1e3 * pct(ttft, 99),
            "itl_p50_ms": 1e3 * pct(itl, 50), "itl_p99_ms": 1e3 * pct(itl, 99)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", default=None, help="GGUF file (default: the default model)")
    p.add_argument("--device", default="cpu")
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("--concurrency", default="1,4,8,16,64")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2, help="rounds per concurrency (default 2)")
    p.add_argument("--url", default=None, help="a running server instead of starting one")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--client-procs", type=int, default=0,
                   help="client processes (default: one per 8 streams, at most 8)")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="pass this argument on to minfer serve (repeatable), e.g. --serve-arg=--no-engine-process")
    a = p.parse_args()
    a.concurrency = [int(x) for x in a.concurrency.split(",") if x]
    proc, url = (None, a.url.rstrip("/")) if a.url else start_server(a)
    try:
        card = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]
        model, vocab = card["id"], card.get("meta", {}).get("n_vocab", 32000)
        rng = random.Random(a.seed)
        level(url, model, 1, argparse.Namespace(**{**vars(a), "rounds": 1}), vocab, rng)  # warm-up
        rows = [level(url, model, c, a, vocab, rng) for c in a.concurrency]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    base = rows[0]["aggregate_tps"] if rows and rows[0]["concurrency"] == 1 else None
    for r in rows:
        r["vs_single"] = r["aggregate_tps"] / base if base else None
    if a.json:
        print(json.dumps({"model": model, "device": a.device, "prompt_tokens": a.prompt_tokens,
                          "gen_tokens": a.gen_tokens, "rounds": a.rounds, "date": time.strftime("%Y-%m-%d"),
                          "rows": rows}, indent=1))
    print(f"\n{model} on {a.device}, {a.prompt_tokens} prompt + {a.gen_tokens} generated tokens per request, "
          f"median of {a.rounds} rounds, through HTTP (streaming /v1/completions)")
    print("| concurrency | aggregate tok/s | vs 1 | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        vs = f"{r['vs_single']:.2f}x" if r["vs_single"] else "-"
        print(f"| {r['concurrency']} | {r['aggregate_tps']:.1f} | {vs} | {r['ttft_p50_ms']:.0f} | "
              f"{r['ttft_p99_ms']:.0f} | {r['itl_p50_ms']:.1f} | {r['itl_p99_ms']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
