"""The prefix cache across requests, with the official `openai` client against real servers: a
shared system prompt hits the cache (usage and /metrics), outputs equal those of a server
started with --no-prefix-cache, a changed token misses from its block on, a small server
evicts the least recently used prefix, and concurrent requests reuse it while others run."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from .conftest import HANG_GUARD, start_server, stop_server

BLOCK = 32  # EngineConfig.prefix_block's default
SYSTEM = ("You are the ship's navigator. Answer in one short sentence, name the star you steer by, and never "
          "mention the weather. ") * 9  # ~250 tokens: several blocks
QUESTIONS = ["Where are we going?", "How far is the port?", "Which star is brightest?", "Can we sail tonight?",
             "Who keeps the log?", "What is our heading?"]


def _client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=HANG_GUARD)


@pytest.fixture(scope="module")
def off_server(tmp_path_factory, smollm2_path):
    s = start_server(tmp_path_factory.mktemp("serve-nocache"), "--no-prefix-cache", model=smollm2_path)
    yield s
    stop_server(s)


def _ask(client, question: str, system: str = SYSTEM):
    r = client.chat.completions.create(model="m", temperature=0, max_tokens=12,
                                       messages=[{"role": "system", "content": system},
                                                 {"role": "user", "content": question}])
    return r.choices[0].message.content, r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens


def test_a_shared_system_prompt_hits_and_decodes_as_without_the_cache(server, off_server):
    with _client(server) as on, _client(off_server) as off:
        first = _ask(on, QUESTIONS[0])
        hits = server.metric("minfer_prefix_cache_hit_tokens_total")
        misses = server.metric("minfer_prefix_cache_miss_tokens_total")
        with ThreadPoolExecutor(4) as pool:  # concurrent: the cached blocks are copied into each slot
            cached = list(pool.map(lambda q: _ask(on, q), QUESTIONS[1:]))
        plain = [_ask(off, q) for q in QUESTIONS]
    n_system = first[1] - 20  # (the question and the template's tail are fewer than 20 tokens)
    for _, n_prompt, hit in cached:
        assert n_system // BLOCK * BLOCK - BLOCK <= hit < n_prompt and hit % BLOCK == 0
    assert server.metric("minfer_prefix_cache_hit_tokens_total") - hits == sum(h for _, _, h in cached)
    assert server.metric("minfer_prefix_cache_miss_tokens_total") - misses == sum(n - h for _, n, h in cached)
    assert all(h == 0 for _, _, h in plain)
    assert [first[0]] + [c[0] for c in cached] == [p[0] for p in plain]


def test_a_changed_token_misses_from_its_block_on(server):
    with _client(server) as c:
        _, _, _ = _ask(c, QUESTIONS[0])
        _, _, whole = _ask(c, QUESTIONS[1])
        half = len(SYSTEM) // 2
        _, _, part = _ask(c, QUESTIONS[1], SYSTEM[:half] + "X" + SYSTEM[half + 1:])
    assert whole > 0 and BLOCK <= part < whole and part % BLOCK == 0


def test_the_least_recently_used_prefix_is_evicted_under_slot_pressure(tmp_path, smollm2_path):
    s = start_server(tmp_path, "-np", "2", model=smollm2_path)
    try:
        systems = [f"{word} " + SYSTEM for word in ("Alpha.", "Bravo.", "Charlie.")]
        with _client(s) as c:
            for system in systems:  # the third takes the first one's slot
                assert _ask(c, QUESTIONS[0], system)[2] == 0
            third, first = _ask(c, QUESTIONS[1], systems[2]), _ask(c, QUESTIONS[1], systems[0])
        assert third[2] > 0 and first[2] == 0
    finally:
        stop_server(s)
