"""The server under load: concurrent requests equal their solo outputs, a flood of dropped
streams frees every slot, and a bounded soak of mixed requests."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from .conftest import HANG_GUARD, N_SLOTS

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
    """50 streams dropped after their first tokens (some still queued): each is cancelled (a 499 counted:
    it had not finished), every slot is freed, the dropped streams did not run to their end (their tokens
    counted), and a new request succeeds."""
    body = {"model": model_id, "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0.7, "stream": True,
            "ignore_eos": True}
    server.wait_idle()
    before, aborted = server.metric("minfer_generation_tokens_total"), server.requests("/v1/completions", 499)

    def drop(i: int) -> int:
        with httpx.Client(timeout=HANG_GUARD) as c, c.stream("POST", server.url + "/v1/completions", json=body) as r:
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
    r = httpx.post(server.url + "/v1/completions", json={"model": model_id, "prompt": "Hello", "max_tokens": 4},
                   timeout=HANG_GUARD)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    server.wait_idle()
    generated = server.metric("minfer_generation_tokens_total") - before
    assert server.requests("/v1/completions", 499) == aborted + 50
    # ignore_eos: a stream not stopped runs to its 400 tokens (how far each got before its abort is the
    # machine's speed against the disconnect poll: not checked)
    assert generated < 50 * 400, generated


def test_dropped_non_streaming_request_is_aborted(server, model_id):
    """A client that hangs up on a non-streaming request: its sequence is aborted (fewer tokens generated
    than asked, a 499 recorded), not run to the end. The connection closes once the sequence holds a
    slot, whatever the machine's speed."""
    body = json.dumps({"model": model_id, "prompt": "Once upon a time", "max_tokens": 480, "temperature": 0.7,
                       "ignore_eos": True}).encode()
    host, port = server.url.removeprefix("http://").split(":")
    server.wait_idle()
    tokens, aborted = server.metric("minfer_generation_tokens_total"), server.requests("/v1/completions", 499)
    with socket.create_connection((host, int(port)), timeout=HANG_GUARD) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: " + host.encode() + b"\r\nContent-Type: application/json"
                     b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        t0 = time.monotonic()
        while server.metric("minfer_active_sequences") == 0:  # running: the request holds a slot
            assert time.monotonic() - t0 < HANG_GUARD
            time.sleep(0.01)
    server.wait_idle()
    generated = server.metric("minfer_generation_tokens_total") - tokens
    assert generated < 480, f"{generated} tokens: the request ran to its end (no abort)"
    assert server.requests("/v1/completions", 499) == aborted + 1


def test_soak(server, client, model_id):
    """24 mixed requests from 6 threads (a count, not a time: a slow machine runs the same soak): all
    succeed, nothing leaks."""
    rng = random.Random(7)
    plan = [(rng.choice(PROMPTS), rng.choice(["chat", "comp"]), rng.random() < 0.5, rng.randint(1, 24),
             rng.choice([0.0, 0.7, 1.0])) for _ in range(24)]

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
    assert results == ["ok"] * len(plan)
    server.wait_idle()
    assert server.proc.poll() is None
