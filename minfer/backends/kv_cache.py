"""The KV cache: per-layer key/value buffers, one region per slot, allocated once by a backend.

`k` and `v` are each one tensor [n_layer, n_slots, n_head_kv, n_ctx, head_dim] (a quantized
cache: [..., row_width] bytes per position, kernels/triton/attention.py's Q8_0 layout): k[layer] is a
layer's buffer, k[:, slot] a sequence's keys in every layer, and within a head the keys are
contiguous rows, the layout attention kernels read. The buffers never move after allocation
(a CUDA graph captures their addresses).

The cache is memory only: which sequence owns which slot, and which tokens a slot holds, is the
scheduler's business (engine/scheduler.py). The Attention node writes a step's keys/values at
the positions the step's Batch names.
"""

from __future__ import annotations

import torch

from ..errors import MinferError, UnsupportedError


class KVType:
    """One way to store cached keys and values: its torch dtype, its contract dtype, bytes per
    element (a Q8_0 cache: int8 rows of 32-element blocks with an f16 scale each, 17/16)."""

    def __init__(self, name: str, dtype: torch.dtype, contract: str, itemsize: float):
        self.name, self.dtype, self.contract, self.itemsize = name, dtype, contract, itemsize


KV_TYPES = {t.name: t for t in (KVType("f32", torch.float32, "F32", 4), KVType("f16", torch.float16, "F16", 2),
                                KVType("q8_0", torch.int8, "I8", 17 / 16))}


def kv_type(backend: str, asked: str, supported: tuple[str, ...]) -> KVType:
    """The cache type `asked` ("auto": the backend's first) of a backend supporting `supported`."""
    name = supported[0] if asked == "auto" else asked
    if name not in supported:
        raise UnsupportedError(f"{backend} backend: KV cache dtype {asked!r} is not supported (supported: auto, "
                               f"{', '.join(supported)})")
    return KV_TYPES[name]


def kv_bytes(n_layer: int, n_slots: int, n_ctx: int, n_head_kv: int, head_dim: int, itemsize: float) -> int:
    """Bytes of keys plus values for these sizes (`itemsize`: bytes per element, 17/16 for Q8_0)."""
    return int(2 * n_layer * n_slots * n_ctx * n_head_kv * head_dim * itemsize)


class KVCache:
    def __init__(self, n_layer: int, n_slots: int, n_ctx: int, n_head_kv: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", row_width: int | None = None):
        if min(n_layer, n_slots, n_ctx, n_head_kv, head_dim) < 1:
            raise MinferError(f"KV cache sizes must be >= 1 (layers {n_layer}, slots {n_slots}, ctx {n_ctx}, "
                              f"kv heads {n_head_kv}, head dim {head_dim})")
        self.n_layer, self.n_slots, self.n_ctx = n_layer, n_slots, n_ctx
        shape = (n_layer, n_slots, n_head_kv, n_ctx, row_width or head_dim)
        # uninitialised: attention reads only positions a step has written
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def copy(self, src: int, dst: int, n: int) -> None:
        """Positions 0..n of slot `src` into slot `dst`, every layer, keys and values: two copies
        (the prefix cache's reuse of another slot's blocks; in stream order on a GPU)."""
        if not (0 <= src < self.n_slots and 0 <= dst < self.n_slots and 0 < n <= self.n_ctx):
            raise MinferError(f"KV copy of {n} positions from slot {src} to slot {dst}: expected slots in "
                              f"0..{self.n_slots - 1} and 1..{self.n_ctx} positions")
        for t in (self.k, self.v):
            t[:, dst, :, :n].copy_(t[:, src, :, :n])
