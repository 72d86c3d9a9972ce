"""The request schema (pydantic, strict types) and its mapping onto SamplingParams.

Types are strict: `"temperature": "0.5"` is a 400, not a coercion (an integer is a valid
number, and a number without a fraction, `7.0`, a valid integer, as JSON Schema has it). Fields
the server does not know are ignored, as OpenAI's own API ignores them; fields it knows but
cannot honour (echo with logprobs, best_of > 1) are a 400 that says so, never silently dropped.
`response_format` / `json_schema` / `grammar` become the request's Grammar (`grammar_of`);
`tools` and `tool_choice` are read by tools.py; `logit_bias` maps token ids to biases. `echo` puts the prompt's text
before the completion; `suffix` makes the completion a fill in the middle (llama.cpp's infill
prompt: the model's FIM tokens around prompt and suffix). The models' JSON schema
(/openapi.json) states the bounds the handlers check (`_doc`), so a client, or the schema
fuzzer, knows them.

Field mapping (docs/SERVER.md has the table): max_completion_tokens (or max_tokens) ->
max_tokens (absent: until an end token or the end of the context); temperature, top_p, top_k,
min_p, seed, stop, frequency_penalty, presence_penalty as named; repetition_penalty (also spelled
repeat_penalty) -> repeat_penalty; repeat_last_n (the window of all three penalties, prompt
included, default 64). An absent field takes the server's default: `minfer serve`'s sampling
flags, which default to SamplingParams' (llama.cpp's: temperature 0.8, top_k 40, top_p 0.95,
min_p 0.05; max_tokens: until the end); temperature 0 is greedy.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from ..api import ROLES
from ..engine.grammar import Grammar
from ..engine.logprobs import MAX_TOP_LOGPROBS
from ..engine.params import (
    MAX_LOGIT_BIAS,
    MAX_REQUEST_TEMPERATURE,
    MAX_STOP_CHARS,
    MAX_STOPS,
    RANGES,
    SamplingParams,
    check_request,
)
from ..errors import GrammarError, ParamError
from .errors import APIError
from .tools import MAX_TOOLS

MAX_MESSAGES = 2048
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
MAX_N = 16  # choices per request


def _integral(v):
    """JSON has one number type: 904.0 is the integer 904 (JSON Schema agrees); 904.5 stays a float
    for the strict check to refuse, and a string or a bool is never a number."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


Int = Annotated[int, BeforeValidator(_integral)]  # an integer field: 7 or 7.0, never "7", 7.5 or true


def _doc(default=None, **bounds):
    """A field whose JSON schema (/openapi.json) states what the handlers accept. Documentation
    only: pydantic checks the types, and the handlers below (and SamplingParams) check these
    bounds themselves, with a 400 that names the field and the value it got. A keyword applies to
    the JSON type it is made for (`minimum` to numbers, `maxItems` to arrays), so one field with
    several types, or null, carries them all."""
    return Field(default, json_schema_extra=bounds)


def _range(name: str, **override) -> dict:
    """SamplingParams' range of `name` (engine/params.py RANGES) as JSON-schema bounds."""
    lo, hi, lo_open = RANGES[name]
    out = {"exclusiveMinimum" if lo_open else "minimum": lo}
    if hi is not None:
        out["maximum"] = hi
    return out | override


STOP = {"minLength": 1, "maxLength": MAX_STOP_CHARS, "maxItems": MAX_STOPS,
        "items": {"minLength": 1, "maxLength": MAX_STOP_CHARS}}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data):
        """OpenAI's API reads an optional field sent as null as absent (`"n": null`, `"stream": null`,
        `"logprobs": null`, `"echo": null`: clients that serialize their unset options send them),
        so such a field takes its default; a required field stays null for the type check to refuse."""
        if isinstance(data, dict):
            fields = cls.model_fields
            data = {k: v for k, v in data.items()
                    if not (v is None and k in fields and not fields[k].is_required())}
        return data


class StreamOptions(_Strict):
    include_usage: bool = False


def _require(*names: str):
    """A model's JSON schema with `names` required and not null (the handler refuses them missing or null)."""
    def edit(js: dict) -> None:
        js["required"] = sorted(set(js.get("required", ())) | set(names))
        for n in names:
            prop = js["properties"][n]
            if "anyOf" in prop:
                prop["anyOf"] = [t for t in prop["anyOf"] if t.get("type") != "null"]
            prop.pop("default", None)
    return edit


class ContentPart(_Strict):
    model_config = ConfigDict(json_schema_extra=_require("text"))
    type: str = _doc(..., enum=["text"])
    text: str | None = None


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Strict):
    id: str | None = None
    type: str = _doc("function", enum=["function"])
    function: FunctionCall


class Message(_Strict):
    role: str = _doc(..., enum=list(ROLES))
    content: str | list[ContentPart] | None = None  # (null only for an assistant message with tool_calls)
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls, sent back in the conversation
    tool_call_id: str | None = None  # a tool message: the call it answers


class _Common(_Strict):
    model: str | None = None
    max_tokens: Int | None = _doc(minimum=1)
    temperature: float | None = _doc(**_range("temperature", maximum=MAX_REQUEST_TEMPERATURE))
    top_p: float | None = _doc(**_range("top_p"))
    top_k: Int | None = _doc(**_range("top_k"))
    min_p: float | None = _doc(**_range("min_p"))
    seed: Int | None = _doc(**_range("seed"))
    stop: str | list[str] | None = _doc(**STOP)
    frequency_penalty: float | None = _doc(**_range("frequency_penalty"))
    presence_penalty: float | None = _doc(**_range("presence_penalty"))
    repetition_penalty: float | None = _doc(**_range("repeat_penalty"))
    repeat_penalty: float | None = _doc(**_range("repeat_penalty"))
    repeat_last_n: Int | None = _doc(**_range("repeat_last_n"))
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None  # only with stream=true (a 400 otherwise)
    n: Int = _doc(1, minimum=1, maximum=MAX_N)
    logit_bias: dict[str, float] | None = _doc(maxProperties=MAX_LOGIT_BIAS)
    user: str | None = None
    grammar: str | None = None  # llama-server's: GBNF (or llguidance's Lark) the output must match
    json_schema: dict | None = None  # llama-server's: a JSON schema the output must match
    cache_prompt: bool = True  # llama-server's: false runs the whole prompt (no slot's cached prefix reused)


class ChatRequest(_Common):
    messages: list[Message] = _doc(..., minItems=1, maxItems=MAX_MESSAGES)
    max_completion_tokens: Int | None = _doc(minimum=1)
    logprobs: bool = False
    top_logprobs: Int | None = _doc(minimum=0, maximum=MAX_TOP_LOGPROBS)  # only with logprobs=true
    tools: list | None = _doc(maxItems=MAX_TOOLS)  # [{"type": "function", "function": {name, description, parameters}}]
    tool_choice: str | dict | None = None  # "none" | "auto" | "required" | {"type": "function", "function": {"name"}}
    parallel_tool_calls: bool | None = None
    response_format: dict | None = _doc(properties={"type": {"enum": list(RESPONSE_FORMATS)}})


class CompletionRequest(_Common):
    prompt: str | list[Int] | list[str]
    logprobs: Int | None = _doc(minimum=0, maximum=MAX_TOP_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: Int | None = _doc(minimum=1, maximum=1)


MAX_INPUTS = 2048  # texts per embeddings request (OpenAI's limit)


class EmbeddingRequest(_Strict):
    model_config = ConfigDict(json_schema_extra=_require("input"))
    input: str | list[str] | list[Int] | list[list[Int]] = _doc(..., minLength=1, minItems=1, maxItems=MAX_INPUTS)
    model: str | None = None
    encoding_format: str = _doc("float", enum=["float", "base64"])
    pooling: str | None = _doc(enum=["mean", "cls", "last"])  # extension: overrides the server's
    user: str | None = None


def embedding_inputs(req: EmbeddingRequest) -> list[str | list[int]]:
    """The request's texts (or token-id lists), each non-empty; a 400 naming the first bad one."""
    raw = req.input
    items = [raw] if isinstance(raw, str) or (raw and isinstance(raw[0], int)) else list(raw)
    if not items or len(items) > MAX_INPUTS:
        raise APIError(400, f"input must hold 1..{MAX_INPUTS} texts, got {len(items)}", param="input")
    for i, x in enumerate(items):
        if not x:
            raise APIError(400, f"input[{i}] is empty", param="input")
    if req.encoding_format not in ("float", "base64"):
        raise APIError(400, f"encoding_format must be float or base64, got {req.encoding_format!r}",
                       param="encoding_format")
    if req.pooling is not None and req.pooling not in ("mean", "cls", "last"):
        raise APIError(400, f"pooling must be mean, cls or last, got {req.pooling!r}", param="pooling")
    return items


def parse(cls: type[_Common], body: dict) -> _Common:
    """The request model, or a 400 naming the first bad field."""
    try:
        req = cls.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        loc = _where(err["loc"])
        raise APIError(400, f"{loc or 'body'}: {err['msg']}", param=loc or None) from None
    if isinstance(req, _Common):
        _unsupported(req)
    return req


def _unsupported(req: _Common) -> None:
    if not 1 <= req.n <= MAX_N:
        raise APIError(400, f"n must be in 1..{MAX_N}, got {req.n}", param="n")
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options is only allowed with stream=true", param="stream_options")
    if isinstance(req, ChatRequest):
        if req.top_logprobs is not None:
            if not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
                raise APIError(400, f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {req.top_logprobs}",
                               param="top_logprobs")
            if not req.logprobs:
                raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
    else:
        if req.echo and req.logprobs is not None:
            raise APIError(400, "echo with logprobs is not supported (the prompt's logprobs are not computed)",
                           param="echo")
        if req.suffix is not None and not isinstance(req.prompt, str):
            raise APIError(400, "suffix (fill in the middle) needs the prompt as a string", param="suffix")
        if req.best_of not in (None, 1):
            raise APIError(400, f"best_of must be 1, got {req.best_of}", param="best_of")
        if req.logprobs is not None and not 0 <= req.logprobs <= MAX_TOP_LOGPROBS:
            raise APIError(400, f"logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {req.logprobs}", param="logprobs")


def messages_of(req: ChatRequest) -> list[dict]:
    """The messages as the chat template sees them: {"role", "content"} with string content; an
    assistant's `tool_calls` with their arguments as objects (what templates expect), a tool
    message's `tool_call_id` (and `name`)."""
    if not req.messages:
        raise APIError(400, "messages must hold at least one message", param="messages")
    if len(req.messages) > MAX_MESSAGES:
        raise APIError(400, f"at most {MAX_MESSAGES} messages, got {len(req.messages)}", param="messages")
    out = []
    for i, m in enumerate(req.messages):
        if m.role not in ROLES:
            raise APIError(400, f"messages[{i}].role {m.role!r} is not one of {', '.join(ROLES)}",
                           param=f"messages[{i}].role")
        content = m.content
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if part.type != "text" or part.text is None:
                    raise APIError(400, f"messages[{i}].content[{j}]: only text parts are supported "
                                   f"(got type {part.type!r})", param=f"messages[{i}].content")
                texts.append(part.text)
            content = "".join(texts)
        if content is None and not (m.role == "assistant" and m.tool_calls):
            raise APIError(400, f"messages[{i}].content is missing", param=f"messages[{i}].content")
        msg = {"role": "system" if m.role == "developer" else m.role, "content": content or ""}
        if m.tool_calls:
            if m.role != "assistant":
                raise APIError(400, f"messages[{i}]: only assistant messages carry tool_calls",
                               param=f"messages[{i}].tool_calls")
            msg["tool_calls"] = [{"id": c.id or f"call_{i}_{j}", "type": "function", "function": {
                "name": c.function.name, "arguments": _arguments(c.function.arguments,
                                                                 f"messages[{i}].tool_calls[{j}]")}}
                for j, c in enumerate(m.tool_calls)]
        if m.role == "tool":
            msg["tool_call_id"] = m.tool_call_id or ""
            if m.name is not None:
                msg["name"] = m.name
        out.append(msg)
    return out


def _arguments(text: str, where: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        raise APIError(400, f"{where}.function.arguments is not JSON", param=where) from None
    if not isinstance(value, dict):
        raise APIError(400, f"{where}.function.arguments must be a JSON object", param=where)
    return value


def grammar_of(req: _Common) -> tuple[Grammar | None, str | None]:
    """The grammar the output must match and the field that gave it: `response_format` (chat:
    json_object, or json_schema with its `json_schema.schema`), llama-server's `json_schema` or
    `grammar` (GBNF); (None, None) when none. A 400 when several are given or one is malformed
    (whether it compiles is checked against the model's tokenizer: app.py)."""
    found: list[tuple[Grammar, str]] = []
    try:
        rf = req.response_format if isinstance(req, ChatRequest) else None
        if rf is not None:
            kind = rf.get("type", "text")
            if kind not in RESPONSE_FORMATS:
                raise APIError(400, f"response_format.type must be one of {', '.join(RESPONSE_FORMATS)}, got "
                               f"{kind!r}", param="response_format")
            if kind == "json_object":
                found.append((Grammar.json_object(), "response_format"))
            elif kind == "json_schema":
                spec = rf.get("json_schema")
                if not isinstance(spec, dict):
                    raise APIError(400, "response_format.json_schema must be an object with a 'schema'",
                                   param="response_format")
                found.append((Grammar.json_schema(spec.get("schema", {})), "response_format"))
        if req.json_schema is not None:
            found.append((Grammar.json_schema(req.json_schema), "json_schema"))
        if req.grammar is not None:
            found.append((Grammar.gbnf(req.grammar), "grammar"))
    except GrammarError as e:
        raise APIError(400, f"{e}", param="response_format") from None
    if len(found) > 1:
        raise APIError(400, f"give one of response_format, json_schema and grammar, not {len(found)}",
                       param=found[1][1])
    return found[0] if found else (None, None)


def max_tokens_of(req: _Common) -> int | None:
    mt = req.max_completion_tokens if isinstance(req, ChatRequest) and req.max_completion_tokens is not None \
        else req.max_tokens
    name = "max_completion_tokens" if isinstance(req, ChatRequest) and req.max_completion_tokens is not None \
        else "max_tokens"
    if mt is not None and mt < 1:
        raise APIError(400, f"{name} must be >= 1, got {mt}", param=name)
    return mt


def logprobs_n(req: _Common) -> int | None:
    """Top alternatives per token to report, or None when logprobs are not asked for."""
    if isinstance(req, ChatRequest):
        return (req.top_logprobs or 0) if req.logprobs else None
    return req.logprobs


def sampling_params(req: _Common, max_tokens: int | None, defaults: SamplingParams | None = None) -> SamplingParams:
    """The request as SamplingParams (absent fields: `defaults`, the server's; else SamplingParams'
    own, with max_tokens None); a 400 names the field."""
    if req.repetition_penalty is not None and req.repeat_penalty is not None \
            and req.repetition_penalty != req.repeat_penalty:
        raise APIError(400, "repetition_penalty and repeat_penalty disagree (they are the same setting)",
                       param="repetition_penalty")
    given = dict(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p, seed=req.seed,
                 frequency_penalty=req.frequency_penalty, presence_penalty=req.presence_penalty,
                 repeat_penalty=req.repetition_penalty if req.repetition_penalty is not None else req.repeat_penalty,
                 repeat_last_n=req.repeat_last_n)
    names = {"repeat_penalty": "repetition_penalty"}
    base = defaults if defaults is not None else SamplingParams(max_tokens=None)
    given.update(max_tokens=max_tokens, stop=tuple([req.stop] if isinstance(req.stop, str) else req.stop or ()),
                 ignore_eos=req.ignore_eos or None, logit_bias=_logit_bias(req.logit_bias) or None)
    if not given["stop"]:
        del given["stop"]
    try:
        return check_request(dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None}))
    except ParamError as e:
        raise APIError(400, f"{names.get(e.param, e.param)} {e.reason}", param=names.get(e.param, e.param)) from None


def _logit_bias(raw: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias ({"token id": bias in -100..100}) as (id, bias) pairs; a 400 for a key
    that is not a token id (the vocabulary's bound is the engine's check)."""
    out = []
    for k, v in (raw or {}).items():
        if not k.isdigit():
            raise APIError(400, f"logit_bias keys are token ids, got {k!r}", param="logit_bias")
        out.append((int(k), v))
    return tuple(out)


_FIELDS = {f for cls in (ChatRequest, CompletionRequest, Message, ContentPart, StreamOptions, ToolCall, FunctionCall,
                         EmbeddingRequest) for f in cls.model_fields}


def _where(loc: tuple) -> str:
    """A validation error's location as a client spells it ("messages[0].role"), without
    pydantic's union-member tags ("str", "list[int]")."""
    out = ""
    for x in loc:
        if isinstance(x, int):
            out += f"[{x}]"
        elif x in _FIELDS:
            out += f".{x}" if out else x
    return out
