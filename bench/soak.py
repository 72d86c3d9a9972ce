"""Soak: the HTTP server under mixed, hostile streaming load for a long time. Not a test.

    python bench/soak.py [-m MODEL] [--device cpu|cuda] [--clients 64] [--minutes 10] [--threads N]
                         [--ctx 1024] [--warmup-frac 0.2] [--json OUT.json]

Starts `minfer serve` (--parallel = --clients, a free port on 127.0.0.1; bench/serve.py's
start_server) and runs `--clients` concurrent client loops for `--minutes`. Each loop sends, one
after another, requests drawn at random:
- 55 % streaming chat or completion, random prompt length (4..ctx/4 tokens of text) and max_tokens
  (1..ctx/4), random stop strings, temperature 0 or 0.8;
- 15 % the same, cancelled: the client closes the stream after a random number of chunks;
- 10 % the same, not streamed;
- 10 % malformed (bad JSON, wrong types, unknown model, over the context, a 5 MB body): a 4xx is
  expected;
- 10 % a stream read slowly (a pause between chunks).
Every 5 s a sampler records: the RSS of the server and of its engine process (/proc), the tokens
the clients received so far and the 5xx count (/metrics). At the end, after the
clients stop: the slots in use (/metrics: minfer_active_sequences + minfer_queued_sequences must
be 0 once the server is idle: no slot leaked).

Reported (one table last): requests by outcome, 5xx, client errors (a connection refused / reset /
timeout), slots leaked, RSS of both processes at the end of warm-up and at the end (growth %,
the acceptance: < 5 %), tok/s per minute (flat: the last minute within 10 % of the first after
warm-up). bench/gpu_soak.sh runs it on the GPU machine.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import start_server  # noqa: E402

WORDS = ("the cat sat on a mat while it rained over old hills and quiet rivers ran toward the grey sea "
         "under stars").split()


def rss_mb(pid: int) -> float:
    try:
        m = re.search(r"^VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M)
        return int(m.group(1)) / 1024 if m else 0.0
    except OSError:
        return 0.0


def children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(p.name))
            except (OSError, ValueError, IndexError):
                pass
    return out


def engine_pid(server_pid: int) -> int | None:
    for c in children(server_pid):
        try:
            if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes():
                return c
        except OSError:
            pass
    return None


def metric(text: str, name: str) -> float:
    total = 0.0
    for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M):
        total += float(m.group(1))
    return total


def five_xx(text: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(r'^minfer_requests_total{[^}]*status="5\d\d"[^}]*} (\S+)$',
                                                      text, re.M))


class Soak:
    def __init__(self, a, url: str):
        self.a, self.url = a, url
        self.outcomes: dict[str, int] = {}
        self.errors: list[str] = []
        self.stop_at = 0.0
        self.tokens = 0  # text chunks received by the clients (one per token while a stream keeps up)

    def count(self, what: str) -> None:
        self.outcomes[what] = self.outcomes.get(what, 0) + 1

    def text(self, rng: random.Random) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, max(5, self.a.ctx // 4))))

    def body(self, rng: random.Random, stream: bool) -> tuple[str, dict]:
        n = rng.randint(1, max(2, self.a.ctx // 4))
        common = {"max_tokens": n, "stream": stream, "temperature": rng.choice([0, 0.8]), "seed": rng.randint(0, 99)}
        if rng.random() < 0.3:
            common["stop"] = [rng.choice(WORDS)]
        if rng.random() < 0.5:
            return "/v1/chat/completions", {"messages": [{"role": "user", "content": self.text(rng)}], **common}
        return "/v1/completions", {"prompt": self.text(rng), **common}

    def malformed(self, rng: random.Random) -> tuple[str, dict | bytes]:
        return rng.choice([
            ("/v1/chat/completions", b"{not json"),
            ("/v1/chat/completions", {"messages": "hi"}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
            ("/v1/completions", {"prompt": "x", "model": "gpt-9"}),
            ("/v1/completions", {"prompt": "word " * (self.a.ctx * 2)}),
            ("/v1/completions", {"prompt": [1, 10**9]}),
            ("/v1/chat/completions", b'{"messages": "' + b"a" * (5 << 20) + b'"}'),
        ])

    async def one(self, client: httpx.AsyncClient, rng: random.Random) -> None:
        u = rng.random()
        try:
            if u < 0.10:
                path, body = self.malformed(rng)
                kw = {"content": body} if isinstance(body, bytes) else {"json": body}
                r = await client.post(self.url + path, headers={"Content-Type": "application/json"}, **kw)
                self.count(f"malformed {r.status_code // 100}xx")
                return
            if u < 0.20:
                path, body = self.body(rng, stream=False)
                r = await client.post(self.url + path, json=body)
                self.count(f"whole {r.status_code // 100}xx")
                if r.status_code == 200:
                    self.tokens += r.json()["usage"]["completion_tokens"]
                return
            path, body = self.body(rng, stream=True)
            cancel_after = rng.randint(1, 8) if u < 0.35 else None
            slow = u >= 0.90
            async with client.stream("POST", self.url + path, json=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    self.count(f"stream {r.status_code // 100}xx")
                    return
                chunks = 0
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    chunks += 1
                    self.tokens += 1
                    if '"error"' in line:
                        self.count("stream error event")
                    if cancel_after is not None and chunks >= cancel_after:
                        self.count("cancelled")
                        return
                    if slow:
                        await asyncio.sleep(0.05)
                self.count("stream 2xx")
        except (httpx.HTTPError, OSError) as e:
            self.count("client error")
            if len(self.errors) < 20:
                self.errors.append(f"{type(e).__name__}: {e}")

    async def client_loop(self, i: int) -> None:
        rng = random.Random(i)
        async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as client:
            while time.monotonic() < self.stop_at:
                await self.one(client, rng)


async def sampler(s: Soak, server_pid: int, samples: list, every: float) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        t0 = time.monotonic()
        while time.monotonic() < s.stop_at:
            try:
                text = (await client.get(s.url + "/metrics")).text
            except httpx.HTTPError:
                text = ""
            eng = engine_pid(server_pid)
            samples.append({"t": time.monotonic() - t0, "server_rss_mb": rss_mb(server_pid),
                            "engine_rss_mb": rss_mb(eng) if eng else 0.0,
                            "tokens": s.tokens, "5xx": five_xx(text)})
            await asyncio.sleep(every)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--ctx", type=int, default=1024, help="context per slot (prompts and max_tokens drawn within it)")
    ap.add_argument("--warmup-frac", type=float, default=0.2, help="the share of the run before RSS is compared")
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    srv = argparse.Namespace(device=a.device, concurrency=[a.clients], prompt_tokens=a.ctx - 8, gen_tokens=0,
                             model=a.model, threads=a.threads, serve_arg=[])
    proc, url = start_server(srv)
    samples: list[dict] = []
    try:
        s = Soak(a, url)
        s.stop_at = time.monotonic() + a.minutes * 60

        async def run() -> None:
            await asyncio.gather(sampler(s, proc.pid, samples, a.sample_s),
                                 *(s.client_loop(i) for i in range(a.clients)))

        asyncio.run(run())
        time.sleep(2.0)  # the last cancellations reach the engine
        text = httpx.get(url + "/metrics", timeout=30).text
        leaked = metric(text, "minfer_active_sequences") + metric(text, "minfer_queued_sequences")
        n5xx = five_xx(text)
        alive = proc.poll() is None
        end_server, end_engine = rss_mb(proc.pid), rss_mb(engine_pid(proc.pid) or 0)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except Exception:  # noqa: BLE001
            proc.kill()
    warm = [x for x in samples if x["t"] >= a.warmup_frac * a.minutes * 60] or samples
    w0 = warm[0]
    growth = {k: (end - w0[k]) / w0[k] * 100 if w0[k] else 0.0
              for k, end in (("server_rss_mb", end_server), ("engine_rss_mb", end_engine))}
    per_min = []
    for m in range(int(a.minutes) or 1):
        xs = [x for x in samples if m * 60 <= x["t"] < (m + 1) * 60]
        if len(xs) >= 2:
            per_min.append((xs[-1]["tokens"] - xs[0]["tokens"]) / (xs[-1]["t"] - xs[0]["t"]))
    result = {"clients": a.clients, "minutes": a.minutes, "device": a.device, "outcomes": s.outcomes,
              "5xx": n5xx, "slots_leaked": leaked, "server_alive": alive, "errors": s.errors,
              "rss_after_warmup_mb": {"server": w0["server_rss_mb"], "engine": w0["engine_rss_mb"]},
              "rss_end_mb": {"server": end_server, "engine": end_engine}, "rss_growth_pct": growth,
              "tok_s_per_minute": per_min, "samples": samples}
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    total = sum(s.outcomes.values())
    print(f"soak: {a.clients} clients x {a.minutes:g} min on {a.device}: {total} requests")
    for k, v in sorted(s.outcomes.items()):
        print(f"  {k:22s} {v}")
    for e in s.errors[:5]:
        print(f"  client error: {e}")
    flat = (per_min[-1] / statistics.mean(per_min[:1]) - 1) * 100 if len(per_min) >= 2 and per_min[0] else 0.0
    print("| 5xx | slots leaked | server RSS MB (warm -> end) | engine RSS MB (warm -> end) | tok/s per minute |")
    print(f"| {n5xx:.0f} | {leaked:.0f} | {w0['server_rss_mb']:.0f} -> {end_server:.0f} "
          f"({growth['server_rss_mb']:+.1f} %) "
          f"| {w0['engine_rss_mb']:.0f} -> {end_engine:.0f} ({growth['engine_rss_mb']:+.1f} %) "
          f"| {', '.join(f'{x:.0f}' for x in per_min)} (last vs first {flat:+.0f} %) |")
    ok = n5xx == 0 and leaked == 0 and alive and max(growth.values()) < 5.0
    print("soak:", "PASS" if ok else "FAIL", "(0 5xx, no slot leaked, RSS growth < 5 % after warm-up)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
