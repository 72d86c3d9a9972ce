"""Tool calls: OpenAI's `tools` / `tool_choice` / `parallel_tool_calls`, rendered by the model's
own chat template, and the model's output parsed back into `tool_calls`.

The template family (`family`) decides the output format the parser reads:
  hermes   Qwen 2.5 / 3, Hermes, SmolLM3 ...: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one per call
  llama3   Llama 3.1 / 3.2 / 3.3: [<|python_tag|>]{"name": ..., "parameters": {...}} (several joined by ";")
  mistral  Mistral / Mixtral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
The parser reads the answer's text, where control tokens are not shown: Llama's <|python_tag|> and
Mistral's [TOOL_CALLS] are control tokens in their vocabularies, so a bare JSON call (llama3) or a
bare JSON array of calls at the start of the answer (mistral) is read as the call(s) too.
A template that does not render tools at all (SmolLM2's ChatML) gets them as a system message in
the hermes format, and its output is parsed as hermes.

`tool_choice` "auto" (the default with tools) lets the model choose; "none" renders no tools and
parses nothing; "required" and a named function are enforced with the structured-output
machinery, not hoped for: the output is constrained to JSON (`forced_grammar`) — for a named
function its arguments (matching the function's `parameters`), for "required" an array of
{"name", "arguments"} objects (one at most with parallel_tool_calls false) — and parsed as such.

`ToolStream` parses as the text streams: content before a call streams as it comes; a call is
held until it is complete, then handed out whole (OpenAI's tool-call delta with the id, the name
and the arguments in one piece, which the spec allows).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ..engine.grammar import Grammar
from .errors import APIError

FAMILIES = ("hermes", "llama3", "mistral")
MAX_TOOLS = 128


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict


def tools_of(raw: list | None) -> list[Tool]:
    """The request's `tools`, checked: each {"type": "function", "function": {"name", "description"?,
    "parameters"?}}; a 400 naming the entry otherwise."""
    if not raw:
        return []
    if len(raw) > MAX_TOOLS:
        raise APIError(400, f"at most {MAX_TOOLS} tools, got {len(raw)}", param="tools")
    out, seen = [], set()
    for i, t in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise APIError(400, f"{where} must be {{'type': 'function', 'function': {{...}}}}", param=where)
        f = t["function"]
        name, desc, params = f.get("name"), f.get("description", ""), f.get("parameters", {"type": "object"})
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name):
            raise APIError(400, f"{where}.function.name must be 1-64 letters, digits, _ . or -, got {name!r}",
                           param=where)
        if name in seen:
            raise APIError(400, f"{where}: a second tool named {name!r}", param=where)
        if not isinstance(desc, str) or not isinstance(params, dict):
            raise APIError(400, f"{where}.function: description must be a string and parameters an object",
                           param=where)
        seen.add(name)
        out.append(Tool(name, desc, params))
    return out


def choice_of(raw, tools: list[Tool]) -> str | Tool | None:
    """tool_choice as "auto", "required", None (no tools: "none" or none given) or the named Tool."""
    if not tools:
        if raw not in (None, "none", "auto"):
            raise APIError(400, "tool_choice needs tools", param="tool_choice")
        return None
    if raw is None or raw == "auto":
        return "auto"
    if raw == "none":
        return None
    if raw == "required":
        return "required"
    if isinstance(raw, dict) and raw.get("type") == "function" and isinstance(raw.get("function"), dict):
        name = raw["function"].get("name")
        for t in tools:
            if t.name == name:
                return t
        raise APIError(400, f"tool_choice names {name!r}, which is not one of the tools", param="tool_choice")
    raise APIError(400, "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'function': "
                   "{'name': ...}}", param="tool_choice")


def family(template: str | None) -> str | None:
    """The tool-call format a chat template teaches, or None when it does not render tools."""
    t = template or ""
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<tool_call>" in t:
        return "hermes"
    if "<|python_tag|>" in t or ("ipython" in t and "tools" in t):
        return "llama3"
    return None


def template_tools(tools: list[Tool]) -> list[dict]:
    """The tools as chat templates read them (OpenAI's shape)."""
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.parameters}} for t in tools]


def system_prompt(tools: list[Tool]) -> str:
    """The tools described for a template that does not render them (hermes format)."""
    listed = "\n".join(json.dumps(x, ensure_ascii=False) for x in template_tools(tools))
    return ("You may call one or more functions to assist with the user query.\n\n"
            f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n"
            "</tools>\n\nFor each function call, return a json object with function name and arguments within "
            '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
            "<args-json-object>}\n</tool_call>")


def forced_grammar(choice: str | Tool, tools: list[Tool], parallel: bool) -> Grammar:
    """The JSON an enforced tool_choice constrains the output to."""
    if isinstance(choice, Tool):
        return Grammar.json_schema(choice.parameters or {"type": "object"})
    item = {"anyOf": [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters or
                                                       {"type": "object"}},
                       "required": ["name", "arguments"], "additionalProperties": False} for t in tools]}
    schema = {"type": "array", "items": item, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return Grammar.json_schema(schema)


def _call(name, arguments) -> dict | None:
    """One OpenAI tool call, or None when `name` / `arguments` are not a call's."""
    if not isinstance(name, str) or not name:
        return None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def _from_obj(obj) -> dict | None:
    if not isinstance(obj, dict):
        return None
    return _call(obj.get("name"), obj.get("arguments", obj.get("parameters")))


def _json_values(text: str) -> list | None:
    """The JSON values `text` holds one after another (separated by whitespace or ';'), or None."""
    dec, i, out = json.JSONDecoder(), 0, []
    while True:
        while i < len(text) and text[i] in " \t\r\n;":
            i += 1
        if i == len(text):
            return out
        try:
            value, i = dec.raw_decode(text, i)
        except ValueError:
            return None
        out.append(value)


OPEN = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]"}
CLOSE = "</tool_call>"


class ToolStream:
    """One choice's output read as content and tool calls (`feed` as text comes, `finish` at the
    end). `mode`: a family (auto), "named" (the output is the named tool's arguments) or
    "required" (a JSON array of {"name", "arguments"})."""

    def __init__(self, mode: str, named: str | None = None):
        self.mode, self.named = mode, named
        self.held = ""  # text not handed out yet (a call, or what may begin one)
        self.inside = False  # within a call (hermes: after <tool_call>; mistral: after [TOOL_CALLS])
        self.calls: list[dict] = []
        self.started = False  # content has been handed out (llama3: its output is not a call then)
        self.bare = False  # mistral: the answer opened with "[" (a call list without its control token)

    def feed(self, text: str) -> tuple[str, list[dict]]:
        """(content to hand out now, calls completed now)."""
        self.held += text
        if self.mode in ("named", "required"):
            return "", []
        if self.mode == "llama3":
            if self.started:
                out, self.held = self.held, ""
                return out, []
            head = self.held.lstrip()
            tag = "<|python_tag|>"
            if not head or head.startswith(("{", tag)) or tag.startswith(head):
                return "", []  # (may be a call: held to the end)
            self.started = True
            out, self.held = self.held, ""
            return out, []
        if self.mode == "mistral" and not self.started and not self.inside:
            head = self.held.lstrip()
            opener = OPEN["mistral"]
            if self.bare or not head or (head[0] == "[" and not opener.startswith(head[:len(opener)])
                                         and not head.startswith(opener)):
                self.bare = self.bare or bool(head)
                return "", []  # (a bare list of calls, or nothing yet: held to the end)
            self.started = not opener.startswith(head[:len(opener)]) and not head.startswith(opener)
        return self._scan()

    def _scan(self) -> tuple[str, list[dict]]:
        out, calls = [], []
        while True:
            if not self.inside:
                opener = OPEN[self.mode]
                at = self.held.find(opener)
                if at < 0:  # hold back only what may begin the opener
                    keep = max((n for n in range(min(len(opener) - 1, len(self.held)), 0, -1)
                                if self.held.endswith(opener[:n])), default=0)
                    out.append(self.held[:len(self.held) - keep])
                    self.held = self.held[len(self.held) - keep:]
                    break
                out.append(self.held[:at])
                self.held = self.held[at + len(opener):]
                self.inside = True
            if self.mode == "mistral":  # everything after [TOOL_CALLS] is the calls: parsed at the end
                break
            end = self.held.find(CLOSE)
            if end < 0:
                break
            call = _from_obj(_single(self.held[:end]))
            if call is None:  # not a call after all: it is content
                out.append(OPEN["hermes"] + self.held[:end + len(CLOSE)])
            else:
                calls.append(call)
            self.held = self.held[end + len(CLOSE):]
            self.inside = False
        self.calls += calls
        return "".join(out), calls

    def finish(self) -> tuple[str, list[dict]]:
        """(the content left, the calls completed at the end)."""
        text, self.held = self.held, ""
        calls: list[dict] | None = None
        if self.mode == "named":
            call = _call(self.named, text.strip() or "{}")
            calls = [call] if call is not None else None
        elif self.mode == "required":
            values = _json_values(text)
            items = values[0] if values and len(values) == 1 and isinstance(values[0], list) else None
            calls = [c for c in map(_from_obj, items)] if items is not None else None
            if calls is not None and None in calls:
                calls = None
        elif self.mode == "llama3":
            body = text.strip().removeprefix("<|python_tag|>")
            values = _json_values(body) if not self.started and body else None
            calls = [_from_obj(v) for v in values] if values else None
            if calls is not None and None in calls:
                calls = None
        elif self.mode == "mistral" and (self.inside or self.bare):
            values = _json_values(text)
            items = values[0] if values and len(values) == 1 else None
            items = [items] if isinstance(items, dict) else items
            calls = [_from_obj(v) for v in items] if isinstance(items, list) else None
            if calls is not None and None in calls:
                calls = None
            if calls is None and self.inside:
                text = OPEN["mistral"] + text
        elif self.mode == "hermes" and self.inside:  # an unterminated last call
            call = _from_obj(_single(text))
            calls = [call] if call is not None else None
            if calls is None:
                text = OPEN["hermes"] + text
        if calls is None:
            return text, []
        self.calls += calls
        return "", calls


def _single(text: str):
    values = _json_values(text.strip())
    return values[0] if values and len(values) == 1 else None
