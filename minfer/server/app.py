"""The FastAPI app: OpenAI's /v1/chat/completions, /v1/completions and /v1/models, plus /health,
/metrics and the chat page at /.

A request is checked completely before anything is sent (body size, JSON, schema, model name,
sampling values, chat template, token ids, prompt + max_tokens against the context): every
client mistake is OpenAI's error JSON with a 4xx status before any SSE byte. Then it becomes a
Job for the serving loop (loop.py; its EngineHost runs it in a thread or a child process) and its
events come back on an asyncio queue: collected into one JSON answer, or streamed as server-sent
events. A client that goes away (a failed send, or
`is_disconnected` polled while no token arrives) cancels its job; the loop frees the slot.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hmac
import json
import struct
import time
from collections.abc import AsyncIterator, Callable
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.grammar import check_grammar
from ..engine.params import SamplingParams
from ..engine.pooling import default_pooling
from ..errors import MinferError
from . import schema
from . import tools as tool_calls
from .errors import APIError, error_body
from .keepalive import IdleClock
from .llama_routes import add_llama_routes
from .loop import EngineHost, Job, log
from .metrics import CONTENT_TYPE, Metrics
from .output import Output, merged_usage

MAX_BODY_BYTES = 4 << 20  # a request body beyond this is a 413
READ_TIMEOUT_S = 30.0  # a request's headers (http.py), and then its body, must each arrive within this; else a 408
DISCONNECT_POLL_S = 0.25  # how often a request with no new token checks that its client is still there
CSP = ("default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
       "img-src data:; base-uri 'none'; form-action 'none'")


class Disconnected(Exception):
    pass


class EventStream(StreamingResponse):
    """A StreamingResponse whose `on_close` runs however the response ends (finished, failed send,
    cancelled): the job is cancelled at once, not when the generator is garbage-collected."""

    def __init__(self, content, on_close: Callable[[], None], **kw):
        super().__init__(content, media_type="text/event-stream", **kw)
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()
            await self.body_iterator.aclose()


def create_app(engine: EngineHost, *, model_id: str, metrics: Metrics, api_key: str | None = None,
               max_body: int = MAX_BODY_BYTES, max_pending: int = 1024, read_timeout_s: float = READ_TIMEOUT_S,
               defaults: SamplingParams | None = None, model_path: str = "", pooling: str | None = None,
               clock: IdleClock | None = None) -> FastAPI:
    """`max_pending`: requests admitted at once (running + waiting); beyond it a 503. `read_timeout_s`:
    the time a request's body has to arrive once its headers have; beyond it a 408. `defaults`:
    the sampling settings a request's absent fields take (`minfer serve`'s flags). One model is
    served, so any `model` name a request gives means it (as llama-server does); `model_id` is
    the name /v1/models shows and answers carry. `clock`: told the count of requests in flight
    whenever it changes (a resident process's keep-alive, keepalive.py); /health then says `idle_s`."""
    defaults = defaults if defaults is not None else SamplingParams(max_tokens=None)
    @contextlib.asynccontextmanager
    async def lifespan(app):
        engine.attach(asyncio.get_running_loop())  # (an engine in another process: its pipe is read on this loop)
        yield
        await run_in_threadpool(engine.stop)  # uvicorn's shutdown (SIGINT/SIGTERM): end the loop cleanly

    app = FastAPI(title="minfer", docs_url=None, redoc_url=None, openapi_url="/openapi.json", lifespan=lifespan)
    app.openapi = lambda: _openapi(app)
    static = resources.files(__package__).joinpath("static")
    page = static.joinpath("index.html").read_bytes()
    vendor = {f.name: f.read_bytes() for f in static.joinpath("vendor").iterdir() if f.name.endswith(".js")}
    created = int(time.time())
    pending: set[Job] = set()
    key = api_key.encode() if api_key else None

    # ------------------------------------------------------------------ errors
    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        msg = f"no route {request.method} {request.url.path}" if e.status_code == 404 else str(e.detail)
        return JSONResponse(error_body(e.status_code, msg), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):  # the server's own fault, never the client's
        return JSONResponse(error_body(500, f"internal error: {type(e).__name__}"), status_code=500)

    def authorize(request: Request) -> None:
        if key is None:
            return
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip().encode() if auth[:7].lower() == "bearer " else b""
        if not hmac.compare_digest(given, key):
            raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                           code="invalid_api_key")

    piece: list[int] = []

    def max_piece(m) -> int:
        """The most characters one token can stand for (its piece's bytes), at least 1."""
        if not piece:
            tok = m.tokenizer
            piece.append(max(1, max(len(tok.token_to_piece(i, special=True)) for i in range(tok.n_vocab))))
        return piece[0]

    def ready_model():
        if engine.state == "loading":
            raise APIError(503, "the model is still loading; try again shortly", code="loading")
        if engine.state == "restarting":
            raise APIError(503, "the engine is restarting after a failure; try again shortly", code="restarting")
        if engine.state != "ok":
            raise APIError(503, f"the model is not available ({engine.state})")
        return engine.model

    # ------------------------------------------------------------------ plain routes
    @app.get("/", include_in_schema=False)
    async def index():
        return HTMLResponse(page, headers={"Content-Security-Policy": CSP, "Cache-Control": "no-store",
                                           "X-Content-Type-Options": "nosniff"})

    @app.get("/vendor/{name}", include_in_schema=False)
    async def vendored(name: str):  # the page's vendored scripts (static/vendor/README.md), nothing else
        if name not in vendor:
            raise APIError(404, f"no route GET /vendor/{name}")
        return Response(vendor[name], media_type="text/javascript",
                        headers={"Cache-Control": "max-age=86400", "X-Content-Type-Options": "nosniff"})

    @app.get("/health")
    async def health():
        state = engine.state
        body = {"status": state} if clock is None else {"status": state, "idle_s": round(clock.idle_seconds(), 3)}
        return JSONResponse(body, status_code=200 if state == "ok" else 503)

    @app.get("/metrics")
    async def metrics_route(request: Request):
        authorize(request)
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    def model_card() -> dict:
        card = {"id": model_id, "object": "model", "created": created, "owned_by": "minfer"}
        if engine.state == "ok":
            card["meta"] = {"n_ctx": engine.model.n_ctx, "n_slots": engine.model.n_slots,
                            "n_vocab": engine.model.n_vocab}
        return card

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str, request: Request):
        authorize(request)
        return model_card()  # any name: the one model served

    add_llama_routes(app, ready_model, authorize, lambda request: read_json(request, max_body), defaults=defaults,
                     model_path=model_path, slots=metrics.sequences)

    # ------------------------------------------------------------------ generation
    def check_room(n: int, param: str) -> None:
        """A 400 when the request alone needs more jobs than --max-pending admits (`param` asks for
        them: no retry could succeed); a 503 when n more jobs would pass it now."""
        if n > max_pending:
            raise APIError(400, f"{param} asks for {n} sequences; this server admits at most {max_pending} at once "
                           "(--max-pending)", param=param)
        if len(pending) + n > max_pending:
            raise APIError(503, f"the server is at its limit of {max_pending} requests in flight; retry later",
                           code="overloaded")

    def start(jobs: list[Job]) -> list[Job]:
        """Hand a request's jobs to the engine (they count as pending until `finish`)."""
        pending.update(jobs)
        if clock is not None:
            clock.set_in_flight(len(pending))
        for job in jobs:
            engine.submit(job)
        return jobs

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, "completion")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        """OpenAI's embeddings: each input's final hidden states pooled (`pooling`: the request's,
        else `minfer serve --pooling`, else the file's pooling type, else mean), L2-normalised."""
        endpoint = "/v1/embeddings"
        try:
            authorize(request)
            req = schema.parse(schema.EmbeddingRequest, await read_json(request, max_body, read_timeout_s))
            m = ready_model()
            items = schema.embedding_inputs(req)
            ids = await run_in_threadpool(_embedding_ids, m, items)
            how = req.pooling or pooling or default_pooling(m.reader.metadata)
            check_room(len(ids), "input")
        except APIError as e:
            metrics.request(endpoint, e.status)
            return JSONResponse(e.body(), status_code=e.status)
        events: asyncio.Queue = asyncio.Queue()
        jobs = start([Job(x, SamplingParams(max_tokens=0), None, asyncio.get_running_loop(), events, index=i,
                          pooling=how) for i, x in enumerate(ids)])
        vectors: dict[int, list[float]] = {}
        ended: set[int] = set()
        try:
            stream = Events(events, request)
            while len(ended) < len(jobs):
                i, ev = await stream.next()
                if ev[0] == "embedding":
                    vectors[i] = ev[1]
                    continue
                jobs[i].done = True
                if ev[0] == "done" and i in vectors:
                    ended.add(i)
                    continue
                finish(jobs, endpoint, 500)
                msg = ev[1] if ev[0] == "error" else f"the request ended early ({ev[1]})"
                return JSONResponse(error_body(500, msg), status_code=500)
        except Disconnected:
            finish(jobs, endpoint, 499)
            return Response(status_code=499)
        finally:
            finish(jobs, endpoint, None)
        n = sum(len(x) for x in ids)
        data = [{"object": "embedding", "index": i, "embedding": _encoded(vectors[i], req.encoding_format)}
                for i in range(len(jobs))]
        return JSONResponse({"object": "list", "data": data, "model": model_id,
                             "usage": {"prompt_tokens": n, "total_tokens": n}})

    async def generate(request: Request, kind: str):
        endpoint = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        try:
            authorize(request)
            body = await read_json(request, max_body, read_timeout_s)
            req = schema.parse(schema.ChatRequest if kind == "chat" else schema.CompletionRequest, body)
            m = ready_model()
            max_tokens = schema.max_tokens_of(req)
            params = schema.sampling_params(req, max_tokens, defaults)
            bad = [t for t, _ in params.logit_bias if t >= m.n_vocab]
            if bad:
                raise APIError(400, f"logit_bias token ids {bad[:5]} are outside the vocabulary [0, {m.n_vocab})",
                               param="logit_bias")
            grammar, where = schema.grammar_of(req)
            if grammar is not None:
                await run_in_threadpool(_check_grammar, m, grammar, where)
                params = dataclasses.replace(params, grammar=grammar)
            tools = tool_mode = None
            if kind == "chat":
                messages = schema.messages_of(req)
                tools, tool_mode, forced, messages = _tools_of(req, m, messages, grammar is not None)
                if forced is not None:
                    await run_in_threadpool(_check_grammar, m, forced, "tool_choice")
                    params = dataclasses.replace(params, grammar=forced)
                chars = sum(len(x["content"]) for x in messages)
                if chars > m.n_ctx * max_piece(m):  # surely over the context: refuse without tokenizing
                    raise APIError(400, f"the messages hold {chars} characters: more than the context of "
                                   f"{m.n_ctx} tokens can hold", param="messages", code="context_length_exceeded")
                ids = await run_in_threadpool(_tokens, m.chat_tokens, messages, True, tools)
            else:
                if isinstance(req.prompt, str) and len(req.prompt) > m.n_ctx * max_piece(m):
                    raise APIError(400, f"the prompt holds {len(req.prompt)} characters: more than the context of "
                                   f"{m.n_ctx} tokens can hold", param="prompt", code="context_length_exceeded")
                ids = await run_in_threadpool(_completion_ids, m, req.prompt, req.suffix)
            check_context(len(ids), max_tokens, m.n_ctx)
            log.debug("%s: %d prompt tokens, %s, n %d", endpoint, len(ids), params, req.n)
            check_room(req.n, "n")
        except APIError as e:
            metrics.request(endpoint, e.status)
            return JSONResponse(e.body(), status_code=e.status)
        events: asyncio.Queue = asyncio.Queue()
        jobs = start([Job(ids, _choice_params(params, i), schema.logprobs_n(req), asyncio.get_running_loop(), events,
                          index=i, reuse=req.cache_prompt) for i in range(req.n)])
        out = Output(kind, model_id, m.tokenizer, m.eog_ids, params.ignore_eos, req.n, tool_mode)
        if kind == "completion" and req.echo:
            out.echo = req.prompt if isinstance(req.prompt, str) else (
                req.prompt[0] if req.prompt and isinstance(req.prompt[0], str) else m.detokenize(ids))
        if req.stream:
            usage = req.stream_options is not None and req.stream_options.include_usage
            return EventStream(stream(jobs, request, out, usage, endpoint),
                               on_close=lambda: finish(jobs, endpoint, None),
                               headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            return await collect(jobs, request, out, endpoint)
        finally:
            finish(jobs, endpoint, None)

    def finish(jobs: list[Job], endpoint: str, status: int | None) -> None:
        """The request's end, once: cancel in the loop what has not finished; count it."""
        if jobs[0] in pending:
            pending.difference_update(jobs)
            if clock is not None:
                clock.set_in_flight(len(pending))
            for job in jobs:
                if not job.done:
                    engine.cancel(job)
                    status = status or 499
            metrics.request(endpoint, status or 200)

    async def collect(jobs: list[Job], request: Request, out: Output, endpoint: str):
        events = Events(jobs[0].events, request)
        reasons: dict[int, str] = {}
        usages: dict[int, dict] = {}
        try:
            while len(reasons) < len(jobs):
                i, ev = await events.next()
                if ev[0] == "delta":
                    out.add(i, ev[1], ev[2], ev[3])
                    continue
                jobs[i].done = True
                if ev[0] == "done" and ev[1] in ("stop", "length"):
                    out.end(i)
                    reasons[i], usages[i] = ev[1], ev[2]
                    continue
                finish(jobs, endpoint, 500)
                msg = ev[1] if ev[0] == "error" else f"the request ended early ({ev[1]})"
                return JSONResponse(error_body(500, msg), status_code=500)
            finish(jobs, endpoint, 200)
            return JSONResponse(out.whole([reasons[i] for i in range(len(jobs))],
                                          merged_usage([usages[i] for i in range(len(jobs))])))
        except Disconnected:
            finish(jobs, endpoint, 499)
            return Response(status_code=499)

    async def stream(jobs: list[Job], request: Request, out: Output, usage: bool,
                     endpoint: str) -> AsyncIterator[bytes]:
        usages: dict[int, dict] = {}
        try:
            for chunk in out.first_chunks(usage):
                yield sse(chunk)
            events = Events(jobs[0].events, request)
            while len(usages) < len(jobs):
                i, ev = events.merged(await events.next())
                if ev[0] == "delta":
                    for chunk in out.delta_chunks(i, ev[1], ev[2], ev[3], usage):
                        yield sse(chunk)
                    continue
                jobs[i].done = True
                if ev[0] == "done" and ev[1] in ("stop", "length"):
                    for chunk in out.final_chunks(i, ev[1], usage):
                        yield sse(chunk)
                    usages[i] = ev[2]
                    continue
                msg = ev[1] if ev[0] == "error" else f"the request ended early ({ev[1]})"
                yield sse(error_body(500, msg))
                finish(jobs, endpoint, 500)
                yield b"data: [DONE]\n\n"
                return
            if usage:
                yield sse(out.usage_chunk(merged_usage([usages[i] for i in range(len(jobs))])))
            finish(jobs, endpoint, 200)
            yield b"data: [DONE]\n\n"
        except Disconnected:
            finish(jobs, endpoint, 499)

    return app


# ---------------------------------------------------------------------- helpers
def _openapi(app: FastAPI) -> dict:
    """FastAPI's OpenAPI document plus what the handlers read by hand: the request bodies of the
    two POST routes (schema.py's models) and the error JSON of every 4xx. Clients and the schema
    fuzzer (tests/server/test_schemathesis.py) read it at /openapi.json."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    from fastapi.openapi.utils import get_openapi

    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    error = {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
    components["Error"] = error
    for path, model in (("/v1/chat/completions", schema.ChatRequest), ("/v1/completions", schema.CompletionRequest),
                        ("/v1/embeddings", schema.EmbeddingRequest)):
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
        doc["paths"][path]["post"]["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
    for methods in doc["paths"].values():
        for op in methods.values():
            op.setdefault("responses", {})["4XX"] = {"description": "OpenAI's error JSON", "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    app.openapi_schema = doc
    return doc


class Events:
    """A request's events, (choice index, event), with the client watched: Disconnected when it is
    gone (checked at least every DISCONNECT_POLL_S, whether or not tokens keep coming)."""

    def __init__(self, queue: asyncio.Queue, request: Request):
        self.queue, self.request = queue, request
        self.checked = time.monotonic()
        self.held: tuple | None = None  # an event taken while merging deltas, next in line

    def merged(self, item: tuple) -> tuple:
        """A delta with the deltas of the same choice queued right behind it (a stream that fell
        behind the engine catches up in one chunk instead of one per token); other events keep
        their order."""
        index, ev = item
        if ev[0] != "delta" or self.queue.empty():
            return item
        text, ids, lps = ev[1], list(ev[2]), None if ev[3] is None else list(ev[3])
        while not self.queue.empty():
            nxt = self.queue.get_nowait()
            if nxt[0] != index or nxt[1][0] != "delta":
                self.held = nxt
                break
            text += nxt[1][1]
            ids += nxt[1][2]
            if lps is not None:
                lps += nxt[1][3]
        return index, ("delta", text, ids, lps)

    async def next(self) -> tuple:
        if self.held is not None:
            ev, self.held = self.held, None
            return ev
        if not self.queue.empty() and time.monotonic() - self.checked < DISCONNECT_POLL_S:
            return self.queue.get_nowait()  # (the common case while tokens flow: no future, no timer)
        getter = asyncio.ensure_future(self.queue.get())
        try:
            while True:
                done, _ = await asyncio.wait({getter}, timeout=DISCONNECT_POLL_S)
                if time.monotonic() - self.checked >= DISCONNECT_POLL_S or not done:
                    self.checked = time.monotonic()
                    if await self.request.is_disconnected():
                        raise Disconnected
                if done:
                    return getter.result()
        finally:
            if not getter.done():
                getter.cancel()


async def read_json(request: Request, limit: int, timeout_s: float = READ_TIMEOUT_S) -> dict:
    """The body as a JSON object: a 413 past `limit` bytes (refused from its Content-Length before
    a byte is read, or as soon as the bytes read pass it), a 408 when it has not all arrived within
    `timeout_s` (a client trickling its body holds no connection for long), a 400 for bad JSON."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise APIError(413, f"the request body is over the limit of {limit} bytes", code="body_too_large")
    data = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                data += chunk
                if len(data) > limit:
                    raise APIError(413, f"the request body is over the limit of {limit} bytes", code="body_too_large")
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout_s:g} s ({len(data)} bytes came)",
                       code="request_timeout") from None
    try:
        body = json.loads(bytes(data))
    except (ValueError, RecursionError) as e:
        raise APIError(400, f"the body is not valid JSON: {str(e)[:200]}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the body must be a JSON object, got {type(body).__name__}", code="invalid_json")
    return body


def _check_grammar(m, grammar, where: str) -> None:
    """A 400 naming the problem when the grammar does not compile against the model's tokenizer."""
    try:
        check_grammar(grammar, m.tokenizer)
    except MinferError as e:
        raise APIError(400, f"{where}: {e}", param=where, code="invalid_grammar") from None


def _embedding_ids(m, items: list) -> list[list[int]]:
    """Token ids of each embeddings input: a text tokenized as a prompt (BOS as the model adds it;
    special tokens not parsed), or token ids as given; a 400 naming the input."""
    out = []
    for i, x in enumerate(items):
        try:
            ids = m.tokenize(x) if isinstance(x, str) else list(x)
            m.check_tokens(ids)
        except MinferError as e:
            raise APIError(400, f"input[{i}]: {e}", param="input") from None
        out.append(ids)
    return out


def _encoded(vector: list[float], encoding: str):
    """The vector as OpenAI sends it: a list of floats, or base64 of its float32 bytes."""
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


def _choice_params(params: SamplingParams, i: int) -> SamplingParams:
    """Choice i's parameters: a seeded request's choices draw from seed, seed + 1, ... (different
    texts, each reproducible); unseeded ones each from a fresh seed."""
    if i == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=(params.seed + i) % 2**64)


def _tools_of(req, m, messages: list[dict], has_grammar: bool):
    """(tools for the template or None, the output's tool mode for Output or None, the grammar an
    enforced tool_choice needs or None, the messages) of a chat request."""
    tools = tool_calls.tools_of(req.tools)
    choice = tool_calls.choice_of(req.tool_choice, tools)
    if choice is None:
        return None, None, None, messages
    parallel = req.parallel_tool_calls is not False
    fam = tool_calls.family(m.tokenizer.chat_template)
    if fam is None:  # a template that does not render tools: they go in a system message (hermes format)
        prompt = tool_calls.system_prompt(tools)
        if messages and messages[0]["role"] == "system":
            messages = [{**messages[0], "content": messages[0]["content"] + "\n\n" + prompt}, *messages[1:]]
        else:
            messages = [{"role": "system", "content": prompt}, *messages]
    listed = tool_calls.template_tools(tools) if fam is not None else None
    if choice == "auto":
        return listed, (fam or "hermes", None), None, messages
    if has_grammar:
        raise APIError(400, "tool_choice 'required' or a named function cannot be combined with response_format, "
                       "json_schema or grammar", param="tool_choice")
    forced = tool_calls.forced_grammar(choice, tools, parallel)
    mode = ("required", None) if choice == "required" else ("named", choice.name)
    return listed, mode, forced, messages


def _tokens(fn, *args) -> list[int]:
    try:
        return fn(*args)
    except MinferError as e:
        raise APIError(400, str(e), param="messages") from None


def _completion_ids(m, prompt, suffix: str | None = None) -> list[int]:
    """Token ids of a completion prompt: a string (special tokens parsed, as llama.cpp does),
    a list of token ids, or a list holding one string; with a suffix, the fill-in-the-middle
    prompt around both (Prompting.infill_ids)."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) != 1:
            raise APIError(400, f"one prompt per request (got a list of {len(prompt)})", param="prompt")
        prompt = prompt[0]
    if suffix is not None:
        try:
            ids = m.infill_ids(prompt, suffix)
            m.check_tokens(ids)
        except MinferError as e:
            raise APIError(400, f"suffix: {e}", param="suffix") from None
        return ids
    try:
        ids = m.prompt_ids(prompt) if isinstance(prompt, str) else list(prompt)
        m.check_tokens(ids)
    except MinferError as e:
        raise APIError(400, f"prompt: {e}", param="prompt") from None
    return ids


def check_context(n_prompt: int, max_tokens: int | None, n_ctx: int) -> None:
    if max_tokens is None:
        if n_prompt >= n_ctx:
            raise APIError(400, f"the prompt has {n_prompt} tokens and the context holds {n_ctx}: no room to "
                           "generate (shorten the prompt)", param="messages", code="context_length_exceeded")
    elif n_prompt + max_tokens > n_ctx:
        raise APIError(400, f"the prompt has {n_prompt} tokens and max_tokens asks for {max_tokens}: "
                       f"{n_prompt + max_tokens} in all, over the context of {n_ctx} tokens",
                       param="max_tokens", code="context_length_exceeded")


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"
