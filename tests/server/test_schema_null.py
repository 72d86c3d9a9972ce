"""OpenAI's API reads an optional field sent as null as absent: the request schema must accept
`"n": null`, `"stream": null`, `"logprobs": null`, `"echo": null` (clients that serialize their
unset options send them) and give those fields their defaults; a required field sent as null is
still a 400. Pure schema checks: no server, no model."""

from __future__ import annotations

import pytest

from minfer.server.errors import APIError
from minfer.server.schema import ChatRequest, CompletionRequest, EmbeddingRequest, parse

MSG = [{"role": "user", "content": "Hi"}]
NULLS = ("n", "stream", "logprobs", "ignore_eos", "cache_prompt", "stream_options", "top_logprobs",
         "temperature", "seed", "stop", "max_tokens")


def test_chat_null_optionals_take_their_defaults():
    req = parse(ChatRequest, {"messages": MSG} | dict.fromkeys(NULLS))
    default = parse(ChatRequest, {"messages": MSG})
    assert req == default
    assert (req.n, req.stream, req.logprobs, req.ignore_eos, req.cache_prompt) == (1, False, False, False, True)


def test_completion_null_optionals_take_their_defaults():
    req = parse(CompletionRequest, {"prompt": "x", "echo": None, "n": None, "stream": None, "logprobs": None})
    assert (req.echo, req.n, req.stream, req.logprobs) == (False, 1, False, None)


def test_embedding_null_encoding_format_is_float():
    assert parse(EmbeddingRequest, {"input": "x", "encoding_format": None}).encoding_format == "float"


@pytest.mark.parametrize("cls,body,field", [
    (ChatRequest, {"messages": None}, "messages"),
    (CompletionRequest, {"prompt": None}, "prompt"),
    (ChatRequest, {"messages": [{"role": None, "content": "x"}]}, "role"),
])
def test_required_null_is_still_a_400(cls, body, field):
    with pytest.raises(APIError) as e:
        parse(cls, body)
    assert e.value.status == 400 and field in str(e.value.param)
