"""Tool calls through the official `openai` client against real servers: two template families
(hermes, Qwen's `<tool_call>`; llama3, Llama 3.1's JSON with `<|python_tag|>`) on a tiny
synthetic model given each template (tests/server/templates/), and SmolLM2, whose template does
not render tools (they go in a system message). The random-weight model writes what a grammar
lets it: `grammar` forces the family's call format under tool_choice "auto" (what the parser must
read back), and "required" / a named function are enforced by the server itself."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from .conftest import HANG_GUARD, start_server, stop_server

TEMPLATES = Path(__file__).resolve().parent / "templates"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                           "unit": {"enum": ["C", "F"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time now", "parameters": {
             "type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
             "additionalProperties": False}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '{"name": "get_weather", "ARGS": {"city": "Paris", "unit": "C"}}'
FORCED = {  # family -> GBNF writing one call in the family's format, after some content for hermes
    "hermes": "Checking. <tool_call>\n" + CALL.replace("ARGS", "arguments") + "\n</tool_call>",
    "llama3": "<|python_tag|>" + CALL.replace("ARGS", "parameters"),
}


def _gbnf(text: str) -> str:
    return "root ::= " + json.dumps(text)


@pytest.fixture(scope="module", params=["hermes", "llama3"])
def family_server(request, tmp_path_factory, tiny_gguf):
    fam = request.param
    s = start_server(tmp_path_factory.mktemp(f"tools-{fam}"), "-np", "2", "-c", "3072", "--chat-template",
                     str(TEMPLATES / f"{fam}.jinja"), model=tiny_gguf("tiny-llama", "q8_0"))
    yield fam, s
    stop_server(s)


@pytest.fixture
def family_client(family_server):
    from openai import OpenAI

    fam, s = family_server
    with OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=HANG_GUARD) as c:
        yield fam, c


def _calls(msg) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or []]


def test_template_renders_tools(family_client):
    _, c = family_client
    plain = c.chat.completions.create(model="m", messages=ASK, max_tokens=1, temperature=0)
    tooled = c.chat.completions.create(model="m", messages=ASK, max_tokens=1, temperature=0, tools=TOOLS)
    assert tooled.usage.prompt_tokens > plain.usage.prompt_tokens + 20  # the tools' JSON is in the prompt


def test_auto_output_parsed_whole_and_streamed(family_client):
    fam, c = family_client
    kw = dict(model="m", messages=ASK, tools=TOOLS, temperature=0, max_tokens=120,
              extra_body={"grammar": _gbnf(FORCED[fam])})
    r = c.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert _calls(choice.message) == [("get_weather", {"city": "Paris", "unit": "C"})]
    assert (choice.message.content or "") == ("Checking. " if fam == "hermes" else "")
    chunks = list(c.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    deltas = [tc for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or []]
    assert content == (choice.message.content or "")
    assert [(d.index, d.function.name, json.loads(d.function.arguments)) for d in deltas] == [
        (0, "get_weather", {"city": "Paris", "unit": "C"})]
    assert deltas[0].id.startswith("call_") and deltas[0].type == "function"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == \
        ["tool_calls"]
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_named_choice_always_returns_that_call(family_client):
    _, c = family_client
    r = c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, n=3, temperature=1.0, seed=7,
                                  max_tokens=60, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert len(r.choices) == 3
    for choice in r.choices:
        (name, args), = _calls(choice.message)
        assert name == "get_weather" and choice.finish_reason == "tool_calls"
        jsonschema.validate(args, WEATHER)


def test_required_and_parallel(family_client):
    _, c = family_client
    r = c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required", temperature=1.0,
                                  seed=3, max_tokens=80, parallel_tool_calls=False, n=2)
    for choice in r.choices:
        calls = _calls(choice.message)
        assert len(calls) == 1 and calls[0][0] in ("get_weather", "get_time"), calls
    none = c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=8,
                                     temperature=0, extra_body={"grammar": _gbnf(FORCED["hermes"])[:40] + '"'})
    assert none.choices[0].message.tool_calls is None


def test_tool_results_accepted_back(family_client):
    _, c = family_client
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Paris", "unit": "C"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}]
    before = c.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=1, temperature=0)
    after = c.chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=1, temperature=0)
    assert after.usage.prompt_tokens > before.usage.prompt_tokens + 10


def test_smollm2_named_call_without_tool_template(client, model_id):
    """SmolLM2's template renders no tools: they are described in a system message, and the named
    call is enforced all the same."""
    r = client.chat.completions.create(model=model_id, messages=ASK, tools=TOOLS, temperature=0, max_tokens=60,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (name, args), = _calls(r.choices[0].message)
    assert name == "get_weather"
    jsonschema.validate(args, WEATHER)
