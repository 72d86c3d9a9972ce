"""A failure inside the engine after a stream started: an error event, then [DONE]; the loop
goes on serving. In-process (a tiny synthetic model, httpx's ASGI transport), with the engine's
step made to fail once."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import httpx

from minfer.server.app import create_app
from minfer.server.loop import EngineLoop
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
    loop = EngineLoop(lambda: model, Metrics())
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
