"""Structured outputs through the official `openai` client against the real server (SmolLM2 on
cpu): response_format json_schema on 20 schemas (nested objects, enums, arrays, required, ...)
whose outputs parse and validate with `jsonschema`, json_object, llama-server's `grammar` (GBNF),
and the 400s for a schema or grammar that does not compile."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest


def _obj(props: dict, required: list | None = None) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


NAME = {"type": "string", "maxLength": 12}
SMALL = {"type": "integer", "minimum": 0, "maximum": 9999}
COORD = {"type": "number", "minimum": -99, "maximum": 99}
SCHEMAS = [
    ("a person", _obj({"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}})),
    ("a color", _obj({"color": {"enum": ["red", "green", "blue"]}})),
    ("a yes or no", _obj({"answer": {"type": "boolean"}})),
    ("a city", _obj({"city": NAME, "country": NAME, "population": SMALL})),
    ("three tags", _obj({"tags": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 3}})),
    ("a point", _obj({"x": COORD, "y": COORD})),
    ("a nested address", _obj({"name": NAME, "address": _obj({"street": NAME, "zip": {"type": "string",
                                                                                      "pattern": "^[0-9]{5}$"}})})),
    ("an order", _obj({"id": SMALL, "items": {"type": "array", "maxItems": 3, "items": _obj(
        {"sku": NAME, "qty": {"type": "integer", "minimum": 1, "maximum": 9}})}})),
    ("a mood", _obj({"mood": {"enum": ["happy", "sad", "calm"]}, "level": {"enum": [1, 2, 3]}})),
    ("an optional note", _obj({"title": NAME, "note": NAME}, required=["title"])),
    ("a constant", _obj({"kind": {"const": "fruit"}, "name": NAME})),
    ("a nullable", _obj({"value": {"type": ["integer", "null"], "minimum": 0, "maximum": 999}})),
    ("a matrix", _obj({"rows": {"type": "array", "maxItems": 2, "items": {
        "type": "array", "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}})),
    ("a book", _obj({"title": NAME, "author": _obj({"first": NAME, "last": NAME}), "year": {
        "type": "integer", "minimum": 1500, "maximum": 2030}})),
    ("a choice", _obj({"pick": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"enum": ["none"]}]}})),
    ("a list of numbers", {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                           "minItems": 2, "maxItems": 4}),
    ("an enum alone", {"enum": ["north", "south", "east", "west"]}),
    ("a user with roles", _obj({"user": NAME, "roles": {"type": "array", "minItems": 1, "maxItems": 2,
                                                         "items": {"enum": ["admin", "dev", "guest"]}}})),
    ("a deep nesting", _obj({"a": _obj({"b": _obj({"c": {"type": "integer", "minimum": 0, "maximum": 9}})})})),
    ("a weather report", _obj({"city": NAME, "unit": {"enum": ["C", "F"]}, "temp": {
        "type": "integer", "minimum": -50, "maximum": 50}, "sunny": {"type": "boolean"}})),
]


def test_twenty_schemas_parse_and_validate(client, model_id):
    assert len(SCHEMAS) == 20

    def ask(item):
        name, schema = item
        return client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": f"Give me {name} as JSON."}], temperature=0,
            max_tokens=200, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, SCHEMAS))
    for (name, schema), r in zip(SCHEMAS, answers, strict=True):
        text = r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop", (name, text)
        jsonschema.validate(json.loads(text), schema)


def test_json_object_and_stream(client, model_id):
    # (a prompt the default model ends within max_tokens on either prompt precision, cpu_prompt_passes 1 or 2:
    # on "Describe Paris as JSON." one of them nests {"music": {"music": ... past any limit)
    kw = dict(model=model_id, messages=[{"role": "user", "content": "Name the capital of France, as JSON."}],
              temperature=0, max_tokens=120, response_format={"type": "json_object"})
    r = client.chat.completions.create(**kw)
    whole = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(whole), dict), whole
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    assert chunks[-1].usage.completion_tokens > 0


def test_gbnf_grammar_field(server, model_id):
    """llama-server's `grammar` on both endpoints: the output is one of the grammar's strings."""
    gbnf = 'root ::= ("yes" | "no") " because " [a-z ]{1,20} "."'
    for path, body in (("/v1/completions", {"prompt": "Is the sky blue?"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Is the sky blue?"}]})):
        r = httpx.post(server.url + path, json={**body, "grammar": gbnf, "temperature": 0, "max_tokens": 40},
                       timeout=120).json()
        choice = r["choices"][0]
        text = choice["text"] if "text" in choice else choice["message"]["content"]
        assert choice["finish_reason"] == "stop"
        head, _, rest = text.partition(" because ")
        assert head in ("yes", "no") and rest.endswith(".") and set(rest[:-1]) <= set("abcdefghijklmnopqrstuvwxyz ")


@pytest.mark.parametrize("body,words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "frobnicate"}}}}, "frobnicate"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {
        "a": {"$ref": "#/nowhere"}}}}}}, "nowhere"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "json_schema"),
    ({"grammar": 'root ::= "a" missing-rule'}, "missing-rule"),
    ({"grammar": "start: <|no_such_token|>"}, "no_such_token"),
    ({"grammar": 'root ::= "a"', "json_schema": {"type": "object"}}, "not 2"),
])
def test_bad_grammar_is_400(server, body, words):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and words in err["message"], err
