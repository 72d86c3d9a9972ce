"""llama-server's own endpoints, for the tools written against it: /tokenize, /detokenize,
/props and /slots (llama.cpp tools/server/README.md spells their shapes).

- POST /tokenize {content, add_special=false, parse_special=true, with_pieces=false} -> {tokens}
  (with_pieces: [{id, piece}], a piece as text, or as a list of byte values when not UTF-8)
- POST /detokenize {tokens} -> {content}
- GET /props -> default_generation_settings (the server's sampling defaults and n_ctx),
  total_slots, model_path, chat_template, build_info
- GET /slots -> one entry per slot: id, n_ctx, is_processing. The engine decides which slot
  runs which request; this side knows how many run, so the first that many slots show as busy.
Errors are OpenAI's error JSON, as on every route.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, ValidationError

from .. import __version__
from ..engine.params import SamplingParams
from ..errors import MinferError
from .errors import APIError

MAX_TOKENIZE_CHARS = 1 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TokenizeRequest(_Strict):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Strict):
    tokens: list[int]


def _parse(cls, body):
    try:
        return cls.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise APIError(400, f"{where or 'body'}: {err['msg']}", param=where or None) from None


def generation_settings(defaults: SamplingParams, n_ctx: int) -> dict:
    """llama-server's default_generation_settings: n_ctx and the sampling defaults, named as its
    `params` are (n_predict -1: until the end)."""
    p = dataclasses.asdict(defaults)
    return {"n_ctx": n_ctx, "params": {
        "n_predict": -1 if p["max_tokens"] is None else p["max_tokens"], "temperature": p["temperature"],
        "top_k": p["top_k"], "top_p": p["top_p"], "min_p": p["min_p"], "repeat_penalty": p["repeat_penalty"],
        "repeat_last_n": p["repeat_last_n"], "frequency_penalty": p["frequency_penalty"],
        "presence_penalty": p["presence_penalty"], "seed": -1 if p["seed"] is None else p["seed"],
        "stop": list(p["stop"]), "ignore_eos": p["ignore_eos"]}}


def add_llama_routes(app: FastAPI, ready_model: Callable, authorize: Callable, read_body: Callable, *,
                     defaults: SamplingParams, model_path: str, slots: Callable[[], tuple[int, int]]) -> None:
    """`ready_model()`: the model's front (tokenizer, sizes) or a 503; `authorize(request)`: the
    API key check; `await read_body(request)`: the JSON body (size limit, JSON errors as 4xx);
    `slots()`: (running, waiting) sequences."""
    body_of = read_body

    @app.post("/tokenize")
    async def tokenize(request: Request):
        authorize(request)
        req = _parse(TokenizeRequest, await body_of(request))
        m = ready_model()
        if len(req.content) > MAX_TOKENIZE_CHARS:
            raise APIError(400, f"content is longer than {MAX_TOKENIZE_CHARS} characters", param="content")
        ids = await run_in_threadpool(m.tokenize, req.content, req.add_special, req.parse_special)
        if not req.with_pieces:
            return {"tokens": ids}
        out = []
        for t in ids:
            b = m.tokenizer.token_to_piece(t, special=True)
            try:
                piece = b.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(b)
            out.append({"id": t, "piece": piece})
        return {"tokens": out}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        authorize(request)
        req = _parse(DetokenizeRequest, await body_of(request))
        m = ready_model()
        bad = [t for t in req.tokens if not 0 <= t < m.tokenizer.n_vocab]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary (0..{m.tokenizer.n_vocab - 1})",
                           param="tokens")
        try:
            return {"content": m.detokenize(req.tokens)}
        except MinferError as e:
            raise APIError(400, str(e), param="tokens") from None

    @app.get("/props")
    async def props(request: Request):
        authorize(request)
        m = ready_model()
        return {"default_generation_settings": generation_settings(defaults, m.n_ctx), "total_slots": m.n_slots,
                "model_path": model_path, "chat_template": m.tokenizer.chat_template or "",
                "build_info": f"minfer {__version__}", "modalities": {"vision": False, "audio": False}}

    @app.get("/slots")
    async def slots_route(request: Request):
        authorize(request)
        m = ready_model()
        running, _ = slots()
        return [{"id": i, "n_ctx": m.n_ctx, "is_processing": i < running} for i in range(m.n_slots)]
