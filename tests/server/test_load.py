"""The server under load: concurrent requests equal their solo outputs, a flood of dropped
streams frees every slot, and a bounded soak of mixed requests."""

from __future__ import annotations

import json
import random
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import httpx

from .conftest import N_SLOTS

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "1, 2, 3, 4,",
           "The three primary colors are", "In 1969, Neil Armstrong", "Water boils at", "Here is a list of fruits:",
           "The best way to learn", "My favourite book is", "import numpy as np", "Dear Sir or Madam,",
           "The weather today is", "A haiku about the sea:", "Step 1: preheat the oven", "Q: What is 2 + 2? A:"]


def test_16_concurrent_greedy_equal_solo(server, client, model_id):
    def one(p: str) -> str:
        r = client.completions.create(model=model_id, prompt=p, temperature=0, max_tokens=24,
                                      extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 24
        return r.choices[0].text

    solo = [one(p) for p in PROMPTS]
    peak = {"queued": 0.0}
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak["queued"] = max(peak["queued"], server.metric("minfer_queued_sequences"))
            time.sleep(0.05)

    w = threading.Thread(target=watch)
    w.start()
    try:
        with ThreadPoolExecutor(len(PROMPTS)) as ex:
            together = list(ex.map(one, PROMPTS))
    finally:
        stop.set()
        w.join()
    assert together == solo
    assert len(PROMPTS) > N_SLOTS and peak["queued"] > 0  # some really waited for a slot
    server.wait_idle()


def test_cancellation_flood(server, model_id):
    """50 streams dropped after their first tokens (some still queued): every slot is freed, a new
    request succeeds, and the dropped streams' generations were cut short (counted in tokens)."""
    body = {"model": model_id, "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0.7, "stream": True}
    before = server.metric("minfer_generation_tokens_total")

    def drop(i: int) -> int:
        with httpx.Client(timeout=300) as c, c.stream("POST", server.url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            got = 0
            for line in r.iter_lines():
                if line.startswith("data: "):
                    got += 1
                    if got >= 2 + i % 3:
                        return got  # leaving the block closes the connection mid-stream
        raise AssertionError("the stream ended before it was dropped")

    with ThreadPoolExecutor(25) as ex:
        assert all(n >= 2 for n in ex.map(drop, range(50)))
    server.wait_idle()
    r = httpx.post(server.url + "/v1/completions", json={"model": model_id, "prompt": "Hello", "max_tokens": 4},
                   timeout=300)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    generated = server.metric("minfer_generation_tokens_total") - before - 4
    assert generated < 50 * 400 / 4  # the dropped streams did not run to their 400 tokens
    text = httpx.get(server.url + "/metrics").text
    assert 'status="499"' in text


def _dropped(server) -> float:
    """Requests counted with status 499 (the client went away), over every endpoint."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(r'^minfer_requests_total{[^}]*status="499"[^}]*} (\S+)$', text, re.M))


def test_dropped_non_streaming_request_is_aborted(server, model_id):
    """A client that gives up on a 400-token answer while it is generating: the server notices (it
    polls the connection every DISCONNECT_POLL_S) and aborts the generation, which ends well short
    of its 400 tokens (counted when the sequence ends) and is counted as a 499."""
    body = {"model": model_id, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True,
            "temperature": 0.7}
    server.wait_idle()
    before, dropped = server.metric("minfer_generation_tokens_total"), _dropped(server)
    u = urlparse(server.url)
    data = json.dumps(body).encode()
    with socket.create_connection((u.hostname, u.port), timeout=60) as s:  # (an answer comes only at the end)
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        deadline = time.monotonic() + 60
        while server.metric("minfer_active_sequences") < 1:  # it holds a slot: drop it
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.02)
    server.wait_idle()
    generated = server.metric("minfer_generation_tokens_total") - before
    assert generated < 400, generated
    assert _dropped(server) == dropped + 1


def test_soak(server, client, model_id):
    """36 mixed requests from 6 threads (chat or completion, streamed or not, 1..24 tokens): every
    one succeeds, nothing leaks. A count, not a time budget: on a loaded machine it takes longer."""
    rng = random.Random(7)
    plan = [(rng.choice(PROMPTS), rng.choice(["chat", "comp"]), rng.random() < 0.5, rng.randint(1, 24),
             rng.choice([0.0, 0.7, 1.0])) for _ in range(36)]

    def run(item) -> str:
        prompt, kind, stream, n, temp = item
        if kind == "chat":
            kw = dict(model=model_id, messages=[{"role": "user", "content": prompt}], max_tokens=n, temperature=temp)
            if stream:
                chunks = list(client.chat.completions.create(stream=True, **kw))
                assert sum(1 for c in chunks if c.choices and c.choices[0].finish_reason) == 1
            else:
                assert client.chat.completions.create(**kw).choices[0].finish_reason in ("stop", "length")
        else:
            kw = dict(model=model_id, prompt=prompt, max_tokens=n, temperature=temp)
            if stream:
                assert list(client.completions.create(stream=True, **kw))[-1].choices[0].finish_reason
            else:
                assert client.completions.create(**kw).usage.completion_tokens <= n
        return "ok"

    with ThreadPoolExecutor(6) as ex:
        results = list(ex.map(run, plan))
    assert results == ["ok"] * len(plan), results
    server.wait_idle()
    assert server.proc.poll() is None
