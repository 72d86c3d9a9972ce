"""The engine loop in-process (tiny synthetic model, httpx's ASGI transport): a failure inside
the engine after a stream started is an error event then [DONE] and the loop goes on serving;
/health and requests say "loading" until the model is loaded."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import httpx

from minfer.server.app import create_app
from minfer.server.loop import EngineThread
from minfer.server.metrics import Metrics


def test_error_after_stream_started(tiny_gguf):
    from minfer.api import Model

    model = Model(tiny_gguf("tiny-llama", "f32"), n_ctx=128, n_slots=2, progress=False)
    real_step, calls = model.engine.step, {"n": 0}

    def step():
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("simulated backend failure")
        return real_step()

    model.engine.step = step
    loop = EngineThread(lambda: model, Metrics())
    app = create_app(loop, model_id="tiny", metrics=loop.metrics)
    loop.start()
    assert loop.ready.wait(30) and loop.state == "ok"

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            body = {"prompt": [1, 2, 3], "max_tokens": 20, "temperature": 0, "ignore_eos": True, "stream": True}
            failed = await c.post("/v1/completions", json=body)
            after = await c.post("/v1/completions", json={**body, "stream": False})
            return failed, after

    try:
        with ThreadPoolExecutor(1) as ex:  # its own thread: playwright's sync API may hold this one's loop
            failed, after = ex.submit(asyncio.run, go()).result(60)
    finally:
        loop.stop()
    assert failed.status_code == 200  # the stream had started
    events = [e[6:] for e in failed.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert "simulated backend failure" in err["message"] and err["type"] == "server_error"
    assert not any(json.loads(e).get("choices", [{}])[0].get("finish_reason") for e in events[:-2])
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 20
    assert loop.metrics.active._value.get() == 0


def test_health_says_loading_until_the_model_is_loaded(tiny_gguf):
    import threading

    from minfer.api import Model

    gate = threading.Event()

    def load():
        assert gate.wait(30)
        return Model(tiny_gguf("tiny-llama", "f32"), n_ctx=64, n_slots=1, progress=False)

    loop = EngineThread(load, Metrics())
    app = create_app(loop, model_id="tiny", metrics=loop.metrics)
    loop.start()

    async def get(c, path):
        return await c.get(path) if path != "chat" else await c.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            before = [await get(c, "/health"), await get(c, "chat")]
            gate.set()
            assert await asyncio.to_thread(loop.ready.wait, 30)
            after = [await get(c, "/health"), await get(c, "chat")]
            return before, after

    try:
        with ThreadPoolExecutor(1) as ex:
            before, after = ex.submit(asyncio.run, go()).result(60)
    finally:
        gate.set()
        loop.stop()
    assert before[0].status_code == 503 and before[0].json() == {"status": "loading"}
    assert before[1].status_code == 503 and before[1].json()["error"]["code"] == "loading"
    assert after[0].status_code == 200 and after[0].json() == {"status": "ok"}
    assert after[1].status_code == 200 and after[1].json()["usage"]["completion_tokens"] >= 1


def test_a_failing_loop_tells_its_requests_and_says_error(tiny_gguf):
    """A failure of the serving loop itself (not of a step: a bug around it) ends the request it
    holds with an error event, and the host says "error": /health and new requests a 503."""
    from minfer.api import Model

    model = Model(tiny_gguf("tiny-llama", "f32"), n_ctx=128, n_slots=2, progress=False)
    real_has_work, calls = model.engine.scheduler.has_work, {"n": 0, "steps": 0}
    real_step = model.engine.step

    def step():
        calls["steps"] += 1
        return real_step()

    def has_work():
        if calls["steps"] >= 2:  # a request is live and has run two steps
            raise RuntimeError("simulated loop bug")
        return real_has_work()

    model.engine.scheduler.has_work, model.engine.step = has_work, step
    loop = EngineThread(lambda: model, Metrics())
    app = create_app(loop, model_id="tiny", metrics=loop.metrics)
    loop.start()
    assert loop.ready.wait(30) and loop.state == "ok"

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            body = {"prompt": [1, 2, 3], "max_tokens": 20, "temperature": 0, "ignore_eos": True, "stream": True}
            failed = await c.post("/v1/completions", json=body)
            return failed, await c.get("/health"), await c.post("/v1/completions", json={**body, "stream": False})

    try:
        with ThreadPoolExecutor(1) as ex:
            failed, health, after = ex.submit(asyncio.run, go()).result(60)
    finally:
        loop.stop()
    events = [e[6:] for e in failed.text.split("\n\n") if e]
    assert failed.status_code == 200 and events[-1] == "[DONE]", events
    err = json.loads(events[-2])["error"]
    assert err["message"] == "the engine loop failed: RuntimeError: simulated loop bug", err
    assert loop.state == "error" and health.status_code == 503 and health.json() == {"status": "error"}
    assert after.status_code == 503, after.text


def test_an_embedding_the_backend_cannot_compute_fails_alone(tiny_gguf, monkeypatch):
    """A backend without embeddings (vulkan's: Backend.hidden not overridden) refuses an embedding
    request when it is queued, and only that request gets the error; a generation running beside
    it finishes (was: the embedding's step raised, and the loop failed every request in flight)."""
    from minfer.api import Model
    from minfer.backends.base import Backend
    from minfer.engine.params import SamplingParams
    from minfer.server.loop import ServingLoop

    model = Model(tiny_gguf("tiny-llama", "f32"), n_ctx=64, n_slots=2, progress=False)
    monkeypatch.setattr(type(model.engine.backend), "hidden", Backend.hidden)
    loop = ServingLoop(model.engine)
    try:
        loop.add("gen", [1, 2, 3], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True), None)
        loop.step()
        loop.add("emb", [4, 5, 6], SamplingParams(max_tokens=0), None, pooling="mean")
        for _ in range(40):
            if not loop.busy():
                break
            loop.step()
    finally:
        model.close()
    events = {}
    for key, ev in loop.out:
        events.setdefault(key, []).append(ev)
    assert [ev[1] for ev in events["emb"] if ev[0] == "error"] == [
        "the cpu backend does not compute embeddings (cpu and cuda do)"]
    assert not [ev for ev in events["gen"] if ev[0] == "error"], events["gen"]
    done = [ev for ev in events["gen"] if ev[0] == "done"]
    assert done and done[0][1] == "length" and done[0][2]["completion_tokens"] == 12


def test_a_request_larger_than_max_pending_is_a_400_not_a_retry_later(tiny_gguf):
    """`n` choices or embedding inputs beyond --max-pending can never be admitted: a 400 naming the
    field (was: 503 'overloaded ... retry later', forever; at the default 1024, an embeddings request
    of 1025..2048 inputs, which the schema allows)."""
    from minfer.api import Model

    model = Model(tiny_gguf("tiny-llama", "f32"), n_ctx=64, n_slots=2, progress=False)
    loop = EngineThread(lambda: model, Metrics())
    app = create_app(loop, model_id="tiny", metrics=loop.metrics, max_pending=2)
    loop.start()
    assert loop.ready.wait(30) and loop.state == "ok"

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            body = {"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0}
            return [await c.post("/v1/completions", json={**body, "n": 3}),
                    await c.post("/v1/embeddings", json={"input": ["a", "b", "c"]}),
                    await c.post("/v1/completions", json={**body, "n": 2})]

    try:
        with ThreadPoolExecutor(1) as ex:
            too_many_n, too_many_inputs, fits = ex.submit(asyncio.run, go()).result(60)
    finally:
        loop.stop()
    for r, param in ((too_many_n, "n"), (too_many_inputs, "input")):
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == param, r.text
        assert "admits at most 2 at once (--max-pending)" in err["message"], r.text
    assert fits.status_code == 200 and len(fits.json()["choices"]) == 2
