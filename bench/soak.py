"""Soak: the HTTP server under mixed, hostile streaming load for a long time. Not a test.

    python bench/soak.py [-m MODEL] [--device cpu|cuda] [--clients 64] [--minutes 10] [--threads N]
                         [--ctx 1024] [--warmup-window-s 60] [--warmup-tol-pct 1] [--json OUT.json]

Starts `minfer serve` (--parallel = --clients, a free port on 127.0.0.1; bench/serve.py's
start_server) and runs `--clients` concurrent client loops for `--minutes`. Each loop sends, one
after another, requests drawn at random:
- 55 % streaming chat or completion, random prompt length (4..ctx/4 tokens of text) and max_tokens
  (1..ctx/4), random stop strings, temperature 0 or 0.8;
- 15 % the same, cancelled: the client closes the stream after a random number of chunks;
- 10 % the same, not streamed;
- 10 % malformed (bad JSON, wrong types, over the context, token ids outside the vocabulary, a 5 MB
  body): a 4xx is expected (an unknown `model` name is not malformed: one model is served and any
  name means it, as llama-server does);
- 10 % a stream read slowly (a pause between chunks).
Every 5 s a sampler records: the RSS of the server and of its engine process (/proc), the tokens
the clients received so far and the 5xx count (/metrics). At the end, after the
clients stop: the slots in use (/metrics: minfer_active_sequences + minfer_queued_sequences must
be 0 once the server is idle: no slot leaked).

Warm-up, decided from the samples (`warmup_end`), not assumed: it ends at the first sample from
which, for --warmup-window-s, neither process's RSS rises more than --warmup-tol-pct above its
value there (the allocator's arenas, CUDA graphs of every batch size, the tokenizer's caches have
all grown to what this load needs). It must end within the first half of the run, so that at
least half is compared; otherwise the verdict is FAIL ("no steady state").

Reported (one table last): requests by outcome, 5xx, client errors (a connection refused / reset /
timeout), slots leaked, when warm-up ended, RSS of both processes then and at the end (growth %,
the acceptance: < 5 %), tok/s per minute after warm-up (flat: the last minute within 10 % of the
first). PASS needs all of them. bench/gpu_soak.sh runs it on the GPU machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import threading
import time
from collections import deque
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
RSS_KEYS = ("server_rss_mb", "engine_rss_mb")
MAX_RSS_GROWTH_PCT = 5.0  # after warm-up, either process (issue 29)
MAX_TOK_S_DRIFT_PCT = 10.0  # the last minute's tok/s against the first after warm-up

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
            if len(samples) % max(1, round(60 / every)) == 0:  # a line a minute: a run cut short says how far it got
                x = samples[-1]
                print(f"soak: {x['t']:.0f} s, {x['tokens']} tokens, server {x['server_rss_mb']:.0f} MB, engine "
                      f"{x['engine_rss_mb']:.0f} MB, 5xx {x['5xx']:.0f}, {dict(sorted(s.outcomes.items()))}",
                      flush=True)
            await asyncio.sleep(every)


def warmup_end(samples: list[dict], window_s: float, tol_pct: float, keys=RSS_KEYS) -> int | None:
    """Index of the first sample from which, for `window_s` seconds, no process's RSS (`keys`)
    rises more than `tol_pct` % above its value at that sample; only samples in the first half of
    the run qualify (the rest is what gets compared). None: RSS still growing, no steady state."""
    if not samples:
        return None
    half = samples[-1]["t"] / 2
    for i, x in enumerate(samples):
        if x["t"] > half:
            break
        if samples[-1]["t"] < x["t"] + window_s:  # (the run ends before the window does)
            break
        window = [y for y in samples[i:] if y["t"] <= x["t"] + window_s]
        if all(max(y[k] for y in window) <= x[k] * (1 + tol_pct / 100) for k in keys):
            return i
    return None


def tok_s_per_minute(samples: list[dict], start_t: float) -> list[float]:
    """Tokens the clients received per second, in whole minutes from `start_t`."""
    out = []
    t = start_t
    while True:
        xs = [x for x in samples if t <= x["t"] <= t + 60]
        if len(xs) < 2 or xs[-1]["t"] - xs[0]["t"] < 50:
            return out
        out.append((xs[-1]["tokens"] - xs[0]["tokens"]) / (xs[-1]["t"] - xs[0]["t"]))
        t += 60


MAX_REFUSED_PCT = 1.0  # valid requests (stream / whole) answered 4xx: a soak of refusals measures nothing


def verdict(samples: list[dict], end_rss: dict, n5xx: float, leaked: float, alive: bool, window_s: float,
            tol_pct: float, outcomes: dict[str, int] | None = None) -> dict:
    """The soak's numbers after warm-up and whether they pass (`ok`, with `why` when not).
    `outcomes`: the clients' counts by kind ("stream 2xx", "whole 4xx", ...)."""
    i = warmup_end(samples, window_s, tol_pct)
    why = []
    valid = {k: n for k, n in (outcomes or {}).items() if k.split()[0] in ("stream", "whole")}
    refused = sum(n for k, n in valid.items() if k.endswith("4xx"))
    if valid and refused * 100 > MAX_REFUSED_PCT * sum(valid.values()):
        why.append(f"{refused} of {sum(valid.values())} valid requests answered 4xx (limit {MAX_REFUSED_PCT:g} %)")
    if n5xx:
        why.append(f"{n5xx:.0f} responses >= 500")
    if leaked:
        why.append(f"{leaked:.0f} slots held after the clients stopped")
    if not alive:
        why.append("the server exited")
    if i is None:
        why.append(f"no steady state: RSS rose more than {tol_pct:g} % in every {window_s:g} s window of the "
                   "first half")
        return {"ok": False, "why": why, "warmup_end_s": None}
    w0 = samples[i]
    growth = {k: (end_rss[k] - w0[k]) / w0[k] * 100 if w0[k] else 0.0 for k in RSS_KEYS}
    for k, g in growth.items():
        if g >= MAX_RSS_GROWTH_PCT:
            why.append(f"{k} grew {g:+.1f} % after warm-up (limit {MAX_RSS_GROWTH_PCT:g} %)")
    per_min = tok_s_per_minute(samples, w0["t"])
    drift = (per_min[-1] / per_min[0] - 1) * 100 if len(per_min) >= 2 and per_min[0] else None
    if drift is None:
        why.append("fewer than two whole minutes after warm-up: tok/s not compared")
    elif abs(drift) > MAX_TOK_S_DRIFT_PCT:
        why.append(f"tok/s drifted {drift:+.0f} % from the first minute after warm-up to the last")
    return {"ok": not why, "why": why, "warmup_end_s": w0["t"], "rss_after_warmup_mb": {k: w0[k] for k in RSS_KEYS},
            "rss_growth_pct": growth, "tok_s_per_minute": per_min, "tok_s_drift_pct": drift}


def drain(pipe, keep: deque, copy_to: str | None = None) -> None:
    """Reads the server's stderr for the whole run (a pipe nobody reads stalls its writer once full),
    keeping the last lines and, with `copy_to`, all of it in that file (to see why a server died)."""
    f = open(copy_to, "w") if copy_to else None  # noqa: SIM115 (open for the thread's whole life)
    for line in pipe:
        keep.append(line.rstrip())
        if f:
            f.write(line)
            f.flush()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--ctx", type=int, default=1024, help="context per slot (prompts and max_tokens drawn within it)")
    ap.add_argument("--warmup-window-s", type=float, default=60.0,
                    help="warm-up ends once RSS stays flat for this long (see warmup_end)")
    ap.add_argument("--warmup-tol-pct", type=float, default=1.0, help="'flat': rising less than this %%")
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--server-log", default=None, help="write the server's whole stderr to this file")
    a = ap.parse_args()
    srv = argparse.Namespace(device=a.device, concurrency=[a.clients], prompt_tokens=a.ctx - 8, gen_tokens=0,
                             model=a.model, threads=a.threads, serve_arg=[])
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from serve import start_server

    proc, url = start_server(srv)
    log: deque = deque(maxlen=50)
    threading.Thread(target=drain, args=(proc.stderr, log, a.server_log), daemon=True).start()
    samples: list[dict] = []
    try:
        s = Soak(a, url)
        s.stop_at = time.monotonic() + a.minutes * 60

        async def run() -> None:
            await asyncio.gather(sampler(s, proc.pid, samples, a.sample_s),
                                 *(s.client_loop(i) for i in range(a.clients)))

        asyncio.run(run())
        time.sleep(2.0)  # the last cancellations reach the engine
        alive = proc.poll() is None
        try:
            text = httpx.get(url + "/metrics", timeout=30).text
        except httpx.HTTPError:  # a dead or wedged server: the verdict says so (alive False), nothing is hidden
            text, alive = "", False
        leaked = metric(text, "minfer_active_sequences") + metric(text, "minfer_queued_sequences")
        n5xx = five_xx(text)
        end_server, end_engine = rss_mb(proc.pid), rss_mb(engine_pid(proc.pid) or 0)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except Exception:  # noqa: BLE001
            proc.kill()
    end_rss = {"server_rss_mb": end_server, "engine_rss_mb": end_engine}
    v = verdict(samples, end_rss, n5xx, leaked, alive, a.warmup_window_s, a.warmup_tol_pct, s.outcomes)
    result = {"clients": a.clients, "minutes": a.minutes, "device": a.device, "outcomes": s.outcomes,
              "5xx": n5xx, "slots_leaked": leaked, "server_alive": alive, "errors": s.errors,
              "rss_end_mb": end_rss, **v, "server_log_tail": list(log), "samples": samples}
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    total = sum(s.outcomes.values())
    print(f"soak: {a.clients} clients x {a.minutes:g} min on {a.device}: {total} requests")
    for k, val in sorted(s.outcomes.items()):
        print(f"  {k:22s} {val}")
    for e in s.errors[:5]:
        print(f"  client error: {e}")
    if not alive:
        print("  server's last words:", *list(log)[-10:], sep="\n    ")
    if v["warmup_end_s"] is not None:
        w0, g = v["rss_after_warmup_mb"], v["rss_growth_pct"]
        drift = "n/a" if v["tok_s_drift_pct"] is None else f"{v['tok_s_drift_pct']:+.0f} %"
        print("| 5xx | slots leaked | warm-up ended | server RSS MB (warm -> end) | engine RSS MB (warm -> end) "
              "| tok/s per minute after warm-up |")
        print(f"| {n5xx:.0f} | {leaked:.0f} | {v['warmup_end_s']:.0f} s "
              f"| {w0['server_rss_mb']:.0f} -> {end_server:.0f} ({g['server_rss_mb']:+.1f} %) "
              f"| {w0['engine_rss_mb']:.0f} -> {end_engine:.0f} ({g['engine_rss_mb']:+.1f} %) "
              f"| {', '.join(f'{x:.0f}' for x in v['tok_s_per_minute'])} (last vs first {drift}) |")
    print("soak:", "PASS" if v["ok"] else "FAIL: " + "; ".join(v["why"]),
          f"(0 5xx, no slot leaked, RSS growth < {MAX_RSS_GROWTH_PCT:g} % and tok/s within "
          f"{MAX_TOK_S_DRIFT_PCT:g} % after warm-up)")
    return 0 if v["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
