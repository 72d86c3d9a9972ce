"""Fixtures of the GGUF tests: tiny synthetic models, written once per session."""

from __future__ import annotations

import pytest

from minfer.gguf.synth import synth


@pytest.fixture(scope="session")
def tiny_file(tmp_path_factory):
    """tiny_file(preset, quant, seed=0) -> path of a synth file, made on first use."""
    root = tmp_path_factory.mktemp("synth")
    made = {}

    def get(preset: str, quant: str, seed: int = 0):
        key = (preset, quant, seed)
        if key not in made:
            out = root / f"{preset}-{quant}-{seed}.gguf"
            made[key] = synth(preset, quant, out, seed=seed, progress=False)
        return made[key]

    return get
