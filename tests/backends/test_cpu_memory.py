"""The cpu backend refuses, before packing anything, a model or KV cache the machine's available
memory cannot hold, with a typed error that says how much is needed and how much there is; and
packing releases the file's pages (resident memory stays ~ the packed model)."""

from __future__ import annotations

import pytest

from minfer.backends.cpu import backend as cpu
from minfer.config import EngineConfig
from minfer.engine.engine import Engine
from minfer.errors import InsufficientMemoryError
from minfer.gguf.reader import GGUFReader


def test_a_model_that_does_not_fit_is_refused_up_front(tiny_gguf, monkeypatch):
    path = tiny_gguf("tiny-llama", "q4_0")
    packed = []
    monkeypatch.setattr(cpu, "available_memory", lambda: 1 << 20)  # 1 MiB "available"
    monkeypatch.setattr(cpu.Matrix, "__init__", lambda *a, **k: packed.append(1))  # nothing may be packed
    with pytest.raises(InsufficientMemoryError) as e:
        Engine.load(GGUFReader(path), EngineConfig(n_slots=1, n_ctx=64), progress=False)
    assert not packed
    assert e.value.have == 1 << 20 and e.value.need > e.value.have
    assert "needs" in str(e.value) and "GiB" in str(e.value) and "available" in str(e.value)


def test_a_kv_cache_that_does_not_fit_is_refused(tiny_gguf, monkeypatch):
    eng = Engine.load(GGUFReader(tiny_gguf("tiny-llama", "q4_0")), EngineConfig(n_slots=1, n_ctx=64),
                      progress=False)
    monkeypatch.setattr(cpu, "available_memory", lambda: 64 << 20)
    with pytest.raises(InsufficientMemoryError, match=r"KV cache of 4 x 100000 tokens"):
        eng.backend.allocate(4, 100_000)


def test_prepared_weights_are_what_the_check_counts(tiny_gguf):
    path = tiny_gguf("tiny-qwen2", "q4_k")
    reader = GGUFReader(path)
    eng = Engine.load(reader, EngineConfig(n_slots=1, n_ctx=64), progress=False)
    be = eng.backend
    assert sum(m.nbytes for m in be._matrices.values()) == be.weight_bytes(eng.graph, reader)
