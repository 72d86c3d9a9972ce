"""The chat page at / in real headless Chromium: a streamed answer with its tok/s, a second
turn that carries the history, and the stop button (the server frees the slot)."""

from __future__ import annotations

import json
import re
import time

import pytest
from playwright.sync_api import expect

from .conftest import HANG_GUARD

WAIT_MS = int(HANG_GUARD * 1000)  # a hang guard, not a speed threshold: each wait ends on what it waits for


@pytest.fixture
def page(chromium, server):
    page = chromium.new_page()
    problems, requests, bodies = [], [], []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
    page.on("request", lambda r: (requests.append(r.url), r.post_data and bodies.append(r.post_data)))
    page.goto(server.url + "/")
    page.wait_for_selector("body[data-loaded='1']", timeout=WAIT_MS)
    page.bodies = bodies
    yield page
    page.close()
    assert not problems, problems
    assert all(u.startswith(server.url + "/") for u in requests), requests  # nothing beyond our server


def _ask(page, text: str):
    page.fill("#input", text)
    page.press("#input", "Enter")


def test_chat_streams_and_shows_tps(page, model_id):
    assert page.text_content("#model") == model_id
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "16")
    _ask(page, "Name the capital of France.")  # (a decisive first token: test_openai_api.HELLO)
    page.wait_for_selector(".assistant .stats[data-status]", timeout=WAIT_MS)
    stats = page.locator(".assistant .stats").first
    assert stats.get_attribute("data-status") in ("stop", "length")
    assert float(stats.get_attribute("data-tps")) > 0
    assert re.search(r"\d+ tokens in [\d.]+ s · [\d.]+ tok/s", stats.text_content())
    answer = page.locator(".assistant .text").first.text_content()
    assert "Paris" in answer
    _ask(page, "And of Italy?")
    expect(page.locator(".assistant .stats[data-status]")).to_have_count(2, timeout=WAIT_MS)
    second = json.loads(page.bodies[-1])
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][1]["content"] == answer.strip() and second["stream"] is True  # (markdown adds a newline)


def test_stop_button(page, server):
    """Stop aborts the page's request mid-flight: the answer is marked stopped, the page is ready
    for the next question, and nothing reaches the server. The request is held in the browser (never
    answered) until the click, so the click never races the answer. That a client going away cancels
    its server sequence (a 499) is tests/server/test_load.py's (over HTTP). Clicking Stop while a real
    answer streamed was not deterministic: in full-suite runs (two xdist workers on two cores) the page
    received a whole 448-token answer in one burst at its end (first token at 11.95 s of 12.31 s) while
    the server's parent process received the engine's events steadily (instrumented 2026-12-03), so
    the stream was over before the click: an open finding, not what this test is for."""
    server.wait_idle()
    before = server.requests("/v1/chat/completions", 200)
    held = []
    page.route("**/v1/chat/completions", lambda route: held.append(route))  # (never continued: the fetch waits)
    _ask(page, "Write a very long story about a dragon.")
    page.wait_for_selector("body[data-busy='1']", timeout=WAIT_MS)
    t0 = time.monotonic()
    while not held:  # (the page's fetch has been issued and is waiting on the route)
        assert time.monotonic() - t0 < HANG_GUARD, "the page never sent its request"
        page.wait_for_timeout(20)
    page.click("#stop")
    page.wait_for_selector(".assistant .stats[data-status='stopped']", timeout=WAIT_MS)
    assert page.get_attribute("body", "data-busy") == "0" and not page.is_disabled("#send")
    assert json.loads(held[0].request.post_data)["stream"] is True
    assert server.requests("/v1/chat/completions", 200) == before  # (held in the browser: the server saw nothing)


ANSWER = "A **bold** claim, `code`, and a list:\n\n- one\n- two\n\n<img src=x onerror=\"document.title='pwned'\">"


def _sse_answer(text: str) -> str:
    chunks = [{"choices": [{"index": 0, "delta": {"content": text[i:i + 7]}, "finish_reason": None}]}
              for i in range(0, len(text), 7)]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def test_answers_render_as_markdown_and_html_stays_text(page):
    """The vendored renderer (no network): markdown becomes elements; raw HTML in an answer is
    shown as text, never run. The answer comes from a stubbed route, so its text is known."""
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=200, headers={"Content-Type": "text/event-stream"}, body=_sse_answer(ANSWER)))
    _ask(page, "hi")
    page.wait_for_selector(".assistant .stats[data-status='stop']", timeout=10_000)
    text = page.locator(".assistant .text").first
    assert text.locator("strong").text_content() == "bold"
    assert text.locator("code").text_content() == "code"
    assert text.locator("li").all_text_contents() == ["one", "two"]
    assert text.locator("img").count() == 0 and "<img src=x" in text.text_content()
    assert page.title() != "pwned"


def test_system_prompt_and_sampling_controls_reach_the_request(page):
    page.fill("#system", "Answer in French.")
    page.fill("#temperature", "0")
    page.fill("#top-k", "5")
    page.fill("#seed", "7")
    page.fill("#max-tokens", "3")
    _ask(page, "Hello")
    page.wait_for_selector(".assistant .stats[data-status]", timeout=30_000)
    body = json.loads(page.bodies[-1])
    assert body["messages"] == [{"role": "system", "content": "Answer in French."},
                                {"role": "user", "content": "Hello"}]
    assert (body["temperature"], body["top_k"], body["seed"], body["max_tokens"]) == (0, 5, 7, 3)
    assert {"top_p", "min_p", "repeat_penalty"} <= set(body)
