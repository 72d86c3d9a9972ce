"""The server fuzzed from its own schema: schemathesis generates requests for every route and
method of /openapi.json (the request bodies are schema.py's models), schema-conforming ones and
schema-violating ones ("negative"), and sends them to a real `minfer serve` on 127.0.0.1 (cpu, a
tiny synthetic model, one thread, 8 slots, a 32-token context: a valid request ends within 32
tokens). At least 2,000 requests in all, WORKERS at a time (the server batches their
generations, as it would for real clients), each with a TIMEOUT_S deadline: 0 responses >= 500,
0 hangs, and every 4xx is OpenAI's error JSON. The summary line goes to the terminal past
pytest's capture, so CI's log shows it on a pass too.

Bounded in time: the request count is fixed (derandomized: the same cases every run), a hang
stops the sending (the rest would only wait their TIMEOUT_S each), and pytest-timeout holds the
whole test. The bounds are counts, never seconds: the machine that runs it may be slow."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import requests

from .conftest import start_server, stop_server

# generated requests per operation and generation mode: hypothesis stops early where the schema
# has few distinct cases (GET /health: one), so the three POST routes with a model behind them carry
# the count. Negative cases only where there is a body to break (a GET's lone string parameter has no
# invalid value). The cost is generating the cases (hypothesis in this process, ~95% of the test's CPU),
# not serving them: a chat body costs ~70 ms to draw here, a completion's or an embedding's ~20-28 ms
# (measured 2026-12-03, one core), so chat gets 500 cases and the other two 800 each: 2,165 requests
# in ~70 s of CPU, where 650 + 400 on each route made 3,217 in ~126 s.
EXAMPLES = {("POST", "positive"): 480, ("POST", "negative"): 320, ("GET", "positive"): 60}
FEWER = {"/v1/chat/completions": 300 / 480}  # share of EXAMPLES[POST, mode] for a costly body
MIN_REQUESTS = 2000
WORKERS = 8  # clients at once (the server's slots: -np 8)
TIMEOUT_S = 60.0  # a valid request runs at most 32 tokens (seconds on a loaded 2-core machine)


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory, tiny_gguf):
    # one thread: two threads' barriers on an oversubscribed 2-core machine cost ~0.5 s a token
    s = start_server(tmp_path_factory.mktemp("fuzz-serve"), "-np", str(WORKERS), "-c", str(32 * WORKERS), "-t", "1",
                     model=tiny_gguf("tiny-llama", "q8_0"))
    yield s
    stop_server(s)


def _is_openai_error(response) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    err = body.get("error") if isinstance(body, dict) else None
    return (isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}
            and isinstance(err["message"], str) and err["message"] != "")


class Judge:
    """Sends cases from WORKERS threads and counts what came back; `bad` holds what must not happen."""

    def __init__(self, url: str):
        self.url = url
        self.stats: Counter = Counter()
        self.bad: list[str] = []
        self.lock = threading.Lock()
        self.local = threading.local()
        self.slots = threading.BoundedSemaphore(2 * WORKERS)  # cases generated ahead of the senders

    def submit(self, pool: ThreadPoolExecutor, label: str, case) -> None:
        self.slots.acquire()
        fut = pool.submit(self.send, label, case)
        fut.add_done_callback(lambda f: self.slots.release())

    def send(self, label: str, case) -> None:
        if self.stats["hangs"]:  # the server is stuck: the test has failed, do not wait out every case
            return self.record("not_sent")
        session = getattr(self.local, "session", None)
        if session is None:
            session = self.local.session = requests.Session()
        try:
            r = case.call(base_url=self.url, session=session, timeout=TIMEOUT_S)
        except requests.Timeout:
            return self.record("hangs", f"{label}: no answer in {TIMEOUT_S} s: {case.body!r:.300}")
        except requests.RequestException as e:
            return self.record("client_errors", f"{label}: {type(e).__name__}: {e}: {case.body!r:.300}")
        status = f"{r.status_code // 100}xx"
        if r.status_code >= 500:
            self.record(status, f"{label} -> {r.status_code}: {r.text[:300]} for {case.body!r:.300}")
        elif 400 <= r.status_code < 500 and not _is_openai_error(r):
            self.record("4xx_not_openai", f"{label} -> {r.status_code} not OpenAI's error JSON: {r.text[:300]}")
            self.record(status)
        else:
            self.record(status)

    def record(self, what: str, problem: str | None = None) -> None:
        with self.lock:
            self.stats[what] += 1
            if what in ("hangs", "client_errors", "2xx", "4xx", "5xx", "3xx", "1xx"):
                self.stats["requests"] += 1
            if problem is not None:
                self.bad.append(problem)


def test_schema_fuzz_no_server_error(tiny_server, capsys):
    import schemathesis
    from schemathesis.generation.modes import GenerationMode

    schema = schemathesis.openapi.from_url(tiny_server.url + "/openapi.json")
    ops = [r.ok() for r in schema.get_all_operations()]
    assert {f"{o.method.upper()} {o.path}" for o in ops} >= {
        "GET /health", "GET /metrics", "GET /v1/models", "GET /v1/models/{name}", "POST /v1/chat/completions",
        "POST /v1/completions"}
    judge = Judge(tiny_server.url)
    t0, c0 = time.monotonic(), time.process_time()
    with ThreadPoolExecutor(WORKERS) as pool:
        for op in ops:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                if (op.method.upper(), mode.value) in EXAMPLES:
                    _fuzz(op, mode, pool, judge)
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    s = judge.stats
    line = (f"schemathesis: {s['requests']} requests over {len(ops)} operations in {wall:.0f} s "
            f"({cpu:.0f} s of this process's CPU): 2xx={s['2xx']} 4xx={s['4xx']} 5xx={s['5xx']} "
            f"hangs={s['hangs']} client_errors={s['client_errors']} 4xx_not_openai={s['4xx_not_openai']}")
    with capsys.disabled():
        print("\n" + line)
    assert not judge.bad, line + "\n" + "\n".join(judge.bad[:20])
    assert s["requests"] >= MIN_REQUESTS, line
    assert s["2xx"] > 200 and s["4xx"] > 200, line  # it reached both the handlers and the validation
    assert httpx.get(tiny_server.url + "/health", timeout=10).status_code == 200
    tiny_server.wait_idle(10.0)  # no slot held by a request that ended


def _fuzz(op, mode, pool: ThreadPoolExecutor, judge: Judge) -> None:
    """EXAMPLES[method, mode] generated requests to one operation, handed to the senders as they come."""
    from hypothesis import HealthCheck, Phase, given, settings

    label = f"{op.method.upper()} {op.path} ({mode.value})"

    count = round(EXAMPLES[op.method.upper(), mode.value] * FEWER.get(op.path, 1.0))

    @given(case=op.as_strategy(generation_mode=mode))
    @settings(max_examples=count, deadline=None, database=None,
              derandomize=True, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    def run(case):
        judge.submit(pool, label, case)

    from hypothesis.errors import Unsatisfiable

    try:
        run()
    except Unsatisfiable:
        # a body every value of which is valid (llama-server's /tokenize takes any object) has no
        # negative case to make; a positive run that cannot make one is a broken schema
        if mode.value != "negative":
            raise
        judge.stats["no_negative_case"] += 1
