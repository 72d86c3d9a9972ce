"""Fixtures for the trace tests: a traced run of the real engine on a synthetic model (the headless
Chromium is in tests/conftest.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from minfer.commands.trace import run_demo

DEMO_STEPS = 10


@pytest.fixture(scope="session")
def demo_trace(tmp_path_factory):
    """(path, parsed JSON, shape) of a 10-step run of a synthetic tiny-llama (2 layers, Q4_1) on the
    cpu backend: 1 prefill step + 9 decode steps, recorded by the engine's TraceRecorder."""
    path = run_demo(tmp_path_factory.mktemp("trace") / "demo.json", new_tokens=DEMO_STEPS, seed=3)
    doc = json.loads(path.read_text())
    return path, doc, SimpleNamespace(layers=doc["model"]["n_layer"])
