"""The KV cache a backend owns: sizes, and that a step writes exactly the positions its batch names."""

from __future__ import annotations

import pytest
import torch

from minfer.backends.base import Batch
from minfer.backends.kv_cache import KVCache, kv_bytes
from minfer.config import EngineConfig
from minfer.engine.engine import Engine
from minfer.errors import MinferError
from minfer.gguf.reader import GGUFReader


def test_layout_and_size():
    c = KVCache(n_layer=3, n_slots=2, n_ctx=5, n_head_kv=2, head_dim=4)
    assert c.k.shape == c.v.shape == (3, 2, 2, 5, 4)
    assert c.nbytes == kv_bytes(3, 2, 5, 2, 4, 4) == 2 * 3 * 2 * 5 * 2 * 4 * 4
    with pytest.raises(MinferError, match="must be >= 1"):
        KVCache(n_layer=1, n_slots=0, n_ctx=8, n_head_kv=1, head_dim=4)


@pytest.fixture(scope="module")
def engine(tiny_gguf):
    return Engine.load(GGUFReader(tiny_gguf()), EngineConfig(n_slots=3, n_ctx=16), progress=False)


def test_a_step_writes_only_its_slots_and_positions(engine):
    cache = engine.backend.cache
    cache.k.fill_(float("nan"))
    cache.v.fill_(float("nan"))
    engine.backend.forward(Batch.build([(1, 0, [5, 6, 7, 8]), (2, 0, [9, 10])], [3, 5]))
    engine.backend.forward(Batch.build([(2, 2, [11])], [0], n_decode=1))
    written = ~torch.isnan(cache.k).any(-1)  # [layer, slot, head, position]
    want = torch.zeros_like(written)
    want[:, 1, :, 0:4] = True
    want[:, 2, :, 0:3] = True
    assert torch.equal(written, want)
    assert torch.equal(~torch.isnan(cache.v).any(-1), want)


def test_slots_are_independent(engine):
    """A sequence's logits do not change when another slot is overwritten."""
    a, b = [3, 14, 15, 92, 65], [27, 18, 28]
    first = engine.backend.forward(Batch.single(a, 0, slot=0))
    nxt = engine.backend.forward(Batch.build([(0, len(a), [35])], [0], n_decode=1))
    engine.backend.forward(Batch.single(a, 0, slot=0))
    engine.backend.forward(Batch.single(b * 4, 0, slot=1))  # another sequence fills slot 1
    again = engine.backend.forward(Batch.build([(0, len(a), [35])], [0], n_decode=1))
    assert torch.equal(nxt, again) and first.shape == (1, engine.n_vocab)


def test_positions_past_the_context_are_refused(engine):
    from minfer.errors import ContextOverflowError

    with pytest.raises(ContextOverflowError, match="do not fit the context of 16"):
        engine.backend.forward(Batch.single(list(range(1, 5)), 14, slot=0))
    with pytest.raises(MinferError, match="slot 3 outside"):
        engine.backend.forward(Batch.single([1], 0, slot=3))
