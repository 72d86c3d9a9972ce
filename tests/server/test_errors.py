"""Malformed requests: every one is OpenAI's error JSON with the right 4xx, before any SSE byte,
and none is ever a 5xx. The server keeps serving after all of them."""

from __future__ import annotations

import httpx
import pytest

CHAT, COMP = "/v1/chat/completions", "/v1/completions"
MSG = [{"role": "user", "content": "Hi"}]
LONG = "hello " * 600  # ~600 tokens: over the 512-token context


def chat(**kw):
    return {"messages": MSG, **kw}


# (name, method, path, body (dict -> JSON, bytes -> raw), expected status, words the message must hold)
CASES = [
    ("invalid json", "POST", CHAT, b"{not json", 400, "not valid JSON"),
    ("truncated json", "POST", CHAT, b'{"messages": [', 400, "not valid JSON"),
    ("not utf-8", "POST", CHAT, b'{"messages": "\xff\xfe"}', 400, "not valid JSON"),
    ("empty body", "POST", CHAT, b"", 400, "not valid JSON"),
    ("deeply nested", "POST", CHAT, b"[" * 100_000 + b"]" * 100_000, 400, "not valid JSON"),
    ("array body", "POST", CHAT, b"[1, 2]", 400, "JSON object"),
    ("messages missing", "POST", CHAT, {"model": "x"} | {}, 400, "messages"),
    ("messages not a list", "POST", CHAT, {"messages": "Hi"}, 400, "messages"),
    ("messages empty", "POST", CHAT, {"messages": []}, 400, "at least one"),
    ("unknown role", "POST", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "wizard"),
    ("role wrong type", "POST", CHAT, {"messages": [{"role": 7, "content": "x"}]}, 400, "role"),
    ("content wrong type", "POST", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "content"),
    ("image part", "POST", CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "only text"),
    ("content missing", "POST", CHAT, {"messages": [{"role": "user"}]}, 400, "content"),
    ("temperature string", "POST", CHAT, chat(temperature="0.5"), 400, "temperature"),
    ("temperature negative", "POST", CHAT, chat(temperature=-1), 400, "temperature"),
    ("temperature too high", "POST", CHAT, chat(temperature=5), 400, "temperature"),
    ("temperature NaN", "POST", CHAT, b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400,
     "temperature"),
    ("top_p zero", "POST", CHAT, chat(top_p=0), 400, "top_p"),
    ("top_p above 1", "POST", CHAT, chat(top_p=1.5), 400, "top_p"),
    ("top_k negative", "POST", CHAT, chat(top_k=-3), 400, "top_k"),
    ("top_k float", "POST", CHAT, chat(top_k=2.5), 400, "top_k"),
    ("min_p above 1", "POST", CHAT, chat(min_p=2), 400, "min_p"),
    ("frequency_penalty range", "POST", CHAT, chat(frequency_penalty=3), 400, "frequency_penalty"),
    ("presence_penalty string", "POST", CHAT, chat(presence_penalty="a"), 400, "presence_penalty"),
    ("repetition_penalty zero", "POST", CHAT, chat(repetition_penalty=0), 400, "repetition_penalty"),
    ("seed negative", "POST", CHAT, chat(seed=-1), 400, "seed"),
    ("seed huge", "POST", CHAT, chat(seed=2**70), 400, "seed"),
    ("max_tokens zero", "POST", CHAT, chat(max_tokens=0), 400, "max_tokens must be >= 1"),
    ("max_tokens negative", "POST", COMP, {"prompt": "x", "max_tokens": -5}, 400, "max_tokens must be >= 1"),
    ("max_completion_tokens zero", "POST", CHAT, chat(max_completion_tokens=0), 400, "max_completion_tokens"),
    ("max_tokens string", "POST", CHAT, chat(max_tokens="10"), 400, "max_tokens"),
    ("over the context", "POST", CHAT, chat(max_tokens=100_000), 400, "100000"),
    ("prompt over the context", "POST", COMP, {"prompt": LONG}, 400, "context holds 512"),
    ("huge prompt", "POST", COMP, {"prompt": "a" * (3 << 20)}, 400, "characters"),
    ("huge message", "POST", CHAT, {"messages": [{"role": "user", "content": "b" * (3 << 20)}]}, 400, "characters"),
    ("prompt + max_tokens", "POST", COMP, {"prompt": "hello " * 300, "max_tokens": 300}, 400, "over the context"),
    ("stop wrong type", "POST", CHAT, chat(stop=5), 400, "stop"),
    ("stop empty string", "POST", CHAT, chat(stop=[""]), 400, "stop"),
    ("too many stops", "POST", CHAT, chat(stop=[f"s{i}" for i in range(40)]), 400, "at most 16"),
    ("n too large", "POST", CHAT, chat(n=99), 400, "n must be in 1..16"),
    ("n zero", "POST", CHAT, chat(n=0), 400, "n must be in"),
    ("stream not bool", "POST", CHAT, chat(stream="yes"), 400, "stream"),
    ("stream_options without stream", "POST", CHAT, chat(stream=False, stream_options={"include_usage": True}), 400,
     "stream_options"),
    ("top_logprobs without logprobs", "POST", CHAT, chat(top_logprobs=2), 400, "logprobs"),
    ("top_logprobs too many", "POST", CHAT, chat(logprobs=True, top_logprobs=50), 400, "top_logprobs"),
    ("tool without function", "POST", CHAT, chat(tools=[{"type": "function"}]), 400, "tools[0]"),
    ("tool bad name", "POST", CHAT, chat(tools=[{"type": "function", "function": {"name": "a b"}}]), 400, "name"),
    ("tool_choice unknown function", "POST", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}],
                                                        tool_choice={"type": "function", "function": {"name": "g"}}),
     400, "'g'"),
    ("tool_choice without tools", "POST", CHAT, chat(tool_choice="required"), 400, "tool_choice needs tools"),
    ("tool_calls arguments not JSON", "POST", CHAT, {"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}, 400, "not JSON"),
    ("logit_bias key", "POST", CHAT, chat(logit_bias={"abc": 10}), 400, "logit_bias"),
    ("logit_bias range", "POST", CHAT, chat(logit_bias={"5": 1000}), 400, "logit_bias"),
    ("logit_bias id out of vocab", "POST", CHAT, chat(logit_bias={"99999999": 1}), 400, "outside the vocabulary"),
    ("unknown response_format", "POST", CHAT, chat(response_format={"type": "xml"}), 400, "response_format"),
    ("json_schema not a schema", "POST", CHAT, chat(json_schema={"type": 5}), 400, "json_schema"),
    ("completion prompt missing", "POST", COMP, {"max_tokens": 3}, 400, "prompt"),
    ("completion prompt number", "POST", COMP, {"prompt": 42}, 400, "prompt"),
    ("completion token id out of vocab", "POST", COMP, {"prompt": [1, 10**9]}, 400, "outside the vocabulary"),
    ("completion empty prompt ids", "POST", COMP, {"prompt": []}, 400, "empty"),
    ("completion several prompts", "POST", COMP, {"prompt": ["a", "b"]}, 400, "one prompt"),
    ("completion echo with logprobs", "POST", COMP, {"prompt": "a", "echo": True, "logprobs": 1}, 400, "echo"),
    ("suffix without fill-in-the-middle tokens", "POST", COMP, {"prompt": "a", "suffix": "b"}, 400,
     "no fill-in-the-middle tokens"),
    ("suffix with token ids", "POST", COMP, {"prompt": [1, 2], "suffix": "b"}, 400, "suffix"),
    ("tokenize without content", "POST", "/tokenize", {"tokens": "x"}, 400, "content"),
    ("detokenize id out of vocab", "POST", "/detokenize", {"tokens": [10**9]}, 400, "outside the vocabulary"),
    ("completion logprobs too many", "POST", COMP, {"prompt": "a", "logprobs": 99}, 400, "logprobs"),
    ("unknown route", "POST", "/v1/nothing", chat(), 404, "no route"),
    ("embeddings input missing", "POST", "/v1/embeddings", {"model": "m"}, 400, "input"),
    ("embeddings empty text", "POST", "/v1/embeddings", {"input": ["a", ""]}, 400, "input[1] is empty"),
    ("embeddings bad pooling", "POST", "/v1/embeddings", {"input": "a", "pooling": "max"}, 400, "pooling"),
    ("embeddings id out of vocab", "POST", "/v1/embeddings", {"input": [1, 10**9]}, 400, "outside the vocabulary"),
    ("wrong method", "GET", CHAT, None, 405, "Method Not Allowed"),
    ("body too large", "POST", CHAT, b'{"messages": "' + b"a" * (5 << 20) + b'"}', 413, "over the limit"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed(server, case):
    name, method, path, body, status, words = case
    kw = {"content": body} if isinstance(body, bytes) else ({"json": body} if body is not None else {})
    if isinstance(body, dict) and body.get("stream") is None:
        kw["json"] = {**body, "stream": True}  # streamed requests too: the error still comes before any SSE byte
    r = httpx.request(method, server.url + path, headers={"Content-Type": "application/json"}, timeout=30, **kw)
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert words in err["message"], err
    assert set(err) == {"message", "type", "param", "code"}


def test_matrix_size_and_server_still_serves(server):
    assert len(CASES) >= 30
    assert all(c[4] < 500 for c in CASES)
    r = httpx.post(server.url + CHAT, json=chat(temperature=0, max_tokens=4), timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    text = httpx.get(server.url + "/metrics").text
    assert 'status="5' not in text, [ln for ln in text.splitlines() if 'status="5' in ln]


def test_api_key(keyed_server):
    url = keyed_server.url
    body = chat(temperature=0, max_tokens=2)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit-key"},
                    {"Authorization": "Bearer sekrit-ke"}):
        r = httpx.post(url + CHAT, json=body, headers=headers, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (headers, r.text)
        assert httpx.get(url + "/v1/models", headers=headers).status_code == 401
        assert httpx.get(url + "/metrics", headers=headers).status_code == 401
    good = {"Authorization": "Bearer sekrit-key"}
    assert httpx.post(url + CHAT, json=body, headers=good, timeout=30).status_code == 200
    assert httpx.get(url + "/health").status_code == 200  # health and the page need no key
    assert httpx.get(url + "/").status_code == 200
    from openai import AuthenticationError, OpenAI

    with OpenAI(base_url=url + "/v1", api_key="nope", max_retries=0) as c:
        with pytest.raises(AuthenticationError):
            c.models.list()
    with OpenAI(base_url=url + "/v1", api_key="sekrit-key", max_retries=0) as c:
        assert len(c.models.list().data) == 1


def test_errors_are_json_for_clients(client, model_id):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=MSG, max_tokens=100_000)
    assert e.value.status_code == 400 and "512" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=model_id, input=[""])
    assert e.value.status_code == 400 and "input[0] is empty" in str(e.value)
