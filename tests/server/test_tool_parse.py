"""The tool-call parser of each template family (server/tools.py ToolStream), whole and streamed
in pieces cut at every character: content streams as it comes, calls come out whole."""

from __future__ import annotations

import json

import pytest

from minfer.server.tools import ToolStream, family

WEATHER = {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}
TIME = {"name": "get_time", "arguments": {"tz": "UTC"}}

CASES = [  # (mode, output text, content, calls)
    ("hermes", 'Let me look. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
               "</tool_call>", "Let me look. ", [WEATHER]),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>\n'
               '<tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}</tool_call>', "\n", [WEATHER, TIME]),
    ("hermes", 'unterminated <tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}', "unterminated ", [TIME]),
    ("hermes", "no call, only <tool text> and a < sign", "no call, only <tool text> and a < sign", []),
    ("hermes", "<tool_call>not json</tool_call> after", "<tool_call>not json</tool_call> after", []),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}', "", [WEATHER]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}; '
               '{"name": "get_time", "parameters": {"tz": "UTC"}}', "", [WEATHER, TIME]),
    ("llama3", "The weather is fine {not a call}", "The weather is fine {not a call}", []),
    ("llama3", '{"a": 1}', '{"a": 1}', []),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
                '{"name": "get_time", "arguments": {"tz": "UTC"}}]', "", [WEATHER, TIME]),
    ("mistral", 'Sure. [TOOL_CALLS] [{"name": "get_time", "arguments": {"tz": "UTC"}}]', "Sure. ", [TIME]),
    ("mistral", "[TOOL_CALLS] broken", "[TOOL_CALLS] broken", []),
    ("mistral", '[{"name": "get_time", "arguments": {"tz": "UTC"}}]', "", [TIME]),  # the control token not shown
    ("mistral", "[1, 2] is a list", "[1, 2] is a list", []),
    ("mistral", "Plain [TOOL] text", "Plain [TOOL] text", []),
    ("required", '[{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]', "", [WEATHER]),
]


def _run(mode: str, pieces: list[str]) -> tuple[str, list[dict]]:
    ts = ToolStream(mode)
    content, calls = [], []
    for p in pieces:
        c, k = ts.feed(p)
        content.append(c)
        calls += k
    c, k = ts.finish()
    return "".join(content) + c, calls + k


def _plain(calls: list[dict]) -> list[dict]:
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == len(calls)
    return [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])} for c in calls]


@pytest.mark.parametrize("mode,text,content,calls", CASES)
def test_whole_and_cut_anywhere(mode, text, content, calls):
    assert (lambda r: (r[0], _plain(r[1])))(_run(mode, [text])) == (content, calls)
    for cut in range(1, len(text)):
        got, got_calls = _run(mode, [text[:cut], text[cut:]])
        assert (got, _plain(got_calls)) == (content, calls), cut
    got, got_calls = _run(mode, list(text))  # one character at a time
    assert (got, _plain(got_calls)) == (content, calls)


def test_content_streams_before_the_call():
    ts = ToolStream("hermes")
    assert ts.feed("Hello there <tool") == ("Hello there ", [])  # what may begin a call is held, no more
    assert ts.feed('_call>{"name": "get_time", "arguments": {}}') == ("", [])
    content, calls = ts.feed("</tool_call> bye")
    assert content == " bye" and _plain(calls) == [{"name": "get_time", "arguments": {}}]


def test_named_mode_and_families():
    ts = ToolStream("named", "get_time")
    assert ts.feed('{"tz": "UTC"}') == ("", [])
    assert _plain(ts.finish()[1]) == [TIME]
    assert family("... <tool_call> ...") == "hermes" and family("[TOOL_CALLS]") == "mistral"
    assert family("<|python_tag|>") == "llama3" and family("{{ messages }}") is None
