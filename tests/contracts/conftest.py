"""Kernel-contract tests run the Triton kernels in the interpreter on CPU tensors, unless
MINFER_TEST_DEVICE=cuda. TRITON_INTERPRET must be set before any kernel module is imported
(triton.jit picks interpreter or compiler when a kernel is decorated), so it is set here, at
conftest import, before the test modules of this directory are collected."""

from __future__ import annotations

import os

import pytest

from minfer.config import env

DEVICE = env("MINFER_TEST_DEVICE", "cpu")
if DEVICE != "cuda":
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if DEVICE == "cuda" else "cpu"


@pytest.fixture(scope="session")
def registry():
    from minfer.contracts.registry import load_registry

    return load_registry()
