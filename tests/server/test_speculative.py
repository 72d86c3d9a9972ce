"""`minfer serve --spec ngram`: speculative decoding on the server (engine/draft.py). The same greedy
request gives the same text as the server without drafts, and llama-server's `timings` say how many
drafts were proposed and kept (draft_n, draft_n_accepted)."""

from __future__ import annotations

import json

import httpx
import pytest

from .conftest import start_server, stop_server

COPY = ("Repeat this text exactly, word for word:\n\nAlice went to the market on Saturday to buy apples, pears and "
        "oranges for the party. She met Bob, who was carrying a large basket of fresh bread from the bakery.")


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory, smollm2_path):
    s = start_server(tmp_path_factory.mktemp("serve-spec"), "--spec", "ngram", "-np", "2", model=smollm2_path)
    yield s
    stop_server(s)


def _stream(url: str) -> tuple[str, dict]:
    body = {"messages": [{"role": "user", "content": COPY}], "max_tokens": 48, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    text, last = "", {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                for c in chunk.get("choices") or []:
                    text += c["delta"].get("content") or ""
                last = chunk
    return text, last


def test_the_server_with_drafts_streams_the_same_text_and_counts_the_drafts(spec_server, server):
    want, plain = _stream(server.url)
    got, usage = _stream(spec_server.url)
    assert got == want and "Alice went to the market" in got
    t = usage["timings"]
    assert "draft_n" not in plain["timings"]
    assert t["draft_n"] > 0 and t["draft_n_accepted"] >= 0.8 * t["draft_n"], t  # (a copy: 31 of 32 kept cpu-side)
