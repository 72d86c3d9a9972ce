"""The server fuzzed from its own schema: schemathesis generates requests for every route and
method of /openapi.json (the request bodies are schema.py's models) and sends them to a real
`minfer serve` on 127.0.0.1 (cpu, a tiny synthetic model, 32-token context: a valid request
ends within 32 tokens). At least 2,000 requests in all, each with a 15 s timeout: 0 responses
>= 500, 0 hangs, and every 4xx is OpenAI's error JSON. The summary line is printed (pytest -s or
the captured output of a failure)."""

from __future__ import annotations

import time
from collections import Counter

import httpx
import pytest

from .conftest import start_server, stop_server

# generated requests per operation: hypothesis stops early where the schema has few distinct cases
# (GET /health: one), so the two POST routes carry the count (>= 2,000 in all)
EXAMPLES = {"POST": 1000, "GET": 150}
TIMEOUT_S = 60.0  # a valid request runs at most 32 tokens (seconds on a loaded 2-core machine)


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory, tiny_gguf):
    s = start_server(tmp_path_factory.mktemp("fuzz-serve"), "-np", "4", "-c", "32",
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


def test_schema_fuzz_no_server_error(tiny_server):
    import schemathesis

    schema = schemathesis.openapi.from_url(tiny_server.url + "/openapi.json")
    stats: Counter = Counter()
    bad: list[str] = []
    ops = [r.ok() for r in schema.get_all_operations()]
    assert {f"{o.method.upper()} {o.path}" for o in ops} >= {
        "GET /health", "GET /metrics", "GET /v1/models", "GET /v1/models/{name}", "POST /v1/chat/completions",
        "POST /v1/completions"}
    t0 = time.monotonic()
    for op in ops:
        _fuzz(op, tiny_server.url, stats, bad)
    wall = time.monotonic() - t0
    line = (f"schemathesis: {stats['requests']} requests over {len(ops)} operations in {wall:.0f} s: "
            f"2xx={stats['2xx']} 4xx={stats['4xx']} 5xx={stats['5xx']} hangs={stats['hangs']} "
            f"4xx_not_openai={stats['4xx_not_openai']}")
    print(line)
    assert not bad, line + "\n" + "\n".join(bad[:20])
    assert stats["requests"] >= 2000 and stats["5xx"] == 0 and stats["hangs"] == 0, line
    assert stats["2xx"] > 100 and stats["4xx"] > 100, line  # it reached both the handlers and the validation
    assert httpx.get(tiny_server.url + "/health", timeout=10).status_code == 200


def _fuzz(op, url: str, stats: Counter, bad: list[str]) -> None:
    """EXAMPLES[method] generated requests to one operation, each judged as it returns."""
    from hypothesis import HealthCheck, Phase, given, settings

    @given(case=op.as_strategy())
    @settings(max_examples=EXAMPLES[op.method.upper()], deadline=None, database=None, derandomize=True,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    def run(case):
        stats["requests"] += 1
        label = f"{op.method.upper()} {op.path}"
        try:
            r = case.call(base_url=url, timeout=TIMEOUT_S)
        except httpx.TimeoutException:  # (requests' too, under its own name)
            stats["hangs"] += 1
            bad.append(f"{label}: no answer in {TIMEOUT_S} s: {case.body!r:.300}")
            return
        except Exception as e:  # noqa: BLE001 (requests raises its own types)
            if "timed out" in str(e).lower():
                stats["hangs"] += 1
                bad.append(f"{label}: no answer in {TIMEOUT_S} s: {case.body!r:.300}")
                return
            raise
        stats[f"{r.status_code // 100}xx"] += 1
        if r.status_code >= 500:
            bad.append(f"{label} -> {r.status_code}: {r.text[:300]} for {case.body!r:.300}")
        elif 400 <= r.status_code < 500 and not _is_openai_error(r):
            stats["4xx_not_openai"] += 1
            bad.append(f"{label} -> {r.status_code} not OpenAI's error JSON: {r.text[:300]}")


    run()
