"""KV-cache slots: acquire/release bookkeeping and the buffer layout the backends index."""

from __future__ import annotations

import pytest

from minfer.engine.kv_cache import KVCache
from minfer.errors import MinferError


def test_slots_are_handed_out_once_and_come_back():
    c = KVCache(n_layer=2, n_slots=2, n_ctx=8, n_head_kv=1, head_dim=4)
    a, b = c.acquire(), c.acquire()
    assert {a, b} == {0, 1}
    with pytest.raises(MinferError, match="all 2"):
        c.acquire()
    c.release(a)
    assert c.acquire() == a
    with pytest.raises(MinferError, match="not in use"):
        c.release(7)


def test_layout_is_layer_slot_head_position_dim():
    c = KVCache(n_layer=3, n_slots=2, n_ctx=5, n_head_kv=2, head_dim=4)
    assert c.k.shape == c.v.shape == (3, 2, 2, 5, 4)
    c.k[1, 0, 1, 2] = 7.0  # layer 1, slot 0, head 1, position 2
    assert c.k[:, 0][1, 1, 2].tolist() == [7.0] * 4


def test_bad_sizes():
    with pytest.raises(MinferError):
        KVCache(n_layer=1, n_slots=0, n_ctx=8, n_head_kv=1, head_dim=4)
