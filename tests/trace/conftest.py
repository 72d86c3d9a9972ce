"""Fixtures for the trace tests: a synthetic traced run (the headless Chromium is in tests/conftest.py)."""

from __future__ import annotations

import json

import pytest

from minfer.trace.demo import DemoShape, run_demo

DEMO_SHAPE = DemoShape(layers=3, dim=48, heads=4, kv_heads=2, ffn=96, vocab=300)
DEMO_STEPS = 10


@pytest.fixture(scope="session")
def demo_trace(tmp_path_factory):
    """(path, parsed JSON, DemoShape) of a 10-step synthetic run: 1 prefill of 12 tokens + 9 decodes."""
    path = run_demo(tmp_path_factory.mktemp("trace") / "demo.json", shape=DEMO_SHAPE, prompt_len=12,
                    new_tokens=DEMO_STEPS, seed=3)
    return path, json.loads(path.read_text()), DEMO_SHAPE
