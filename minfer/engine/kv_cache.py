"""The KV cache: per-layer key/value buffers owned by slots.

`k` and `v` are each one tensor [n_layer, n_slots, n_head_kv, n_ctx, head_dim]: k[layer] is a
layer's buffer, k[:, slot] a sequence's keys in every layer (one view serves a whole step), and
within a head the keys are contiguous rows, the layout attention kernels read.

The cache knows nothing about sequences: the engine acquires a slot per sequence, the Attention
node writes a step's keys/values at their positions, and each step's Batch says how far a slot
is filled. No global state: two engines own two caches.
"""

from __future__ import annotations

import torch

from ..errors import MinferError


class KVCache:
    def __init__(self, n_layer: int, n_slots: int, n_ctx: int, n_head_kv: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        if min(n_layer, n_slots, n_ctx, n_head_kv, head_dim) < 1:
            raise MinferError(f"KV cache sizes must be >= 1 (layers {n_layer}, slots {n_slots}, ctx {n_ctx})")
        self.n_slots, self.n_ctx = n_slots, n_ctx
        shape = (n_layer, n_slots, n_head_kv, n_ctx, head_dim)
        # uninitialised: attention reads only positions a step has written
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self._free = list(range(n_slots - 1, -1, -1))

    def acquire(self) -> int:
        """A free slot for a new sequence; MinferError when all are taken."""
        if not self._free:
            raise MinferError(f"all {self.n_slots} KV-cache slots are in use")
        return self._free.pop()

    def release(self, slot: int) -> None:
        if not 0 <= slot < self.n_slots or slot in self._free:
            raise MinferError(f"KV-cache slot {slot} is not in use")
        self._free.append(slot)
