"""The chat page at / in real headless Chromium: a streamed answer with its tok/s, a second
turn that carries the history, and the stop button (the server frees the slot)."""

from __future__ import annotations

import json
import re

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
    _ask(page, "What is the capital of France?")
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
    assert second["messages"][1]["content"] == answer and second["stream"] is True


def test_stop_button(page, server):
    """Stop ends the stream and the server aborts its sequence (a 499 counted: cancelled, not finished)."""
    server.wait_idle()
    aborted = server.requests("/v1/chat/completions", 499)
    page.fill("#max-tokens", "400")
    _ask(page, "Write a very long story about a dragon.")
    expect(page.locator(".assistant .text").first).to_have_text(re.compile(r".{20}"), timeout=WAIT_MS)
    page.click("#stop")
    page.wait_for_selector(".assistant .stats[data-status='stopped']", timeout=WAIT_MS)
    assert page.get_attribute("body", "data-busy") == "0"
    server.wait_idle()
    assert server.requests("/v1/chat/completions", 499) == aborted + 1
