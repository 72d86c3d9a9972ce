"""The counter-based random numbers sampling draws from (no torch here).

Token i of a sequence seeded with `seed` is drawn with u = uniform(seed, i): splitmix64 of
seed + (i + 1) * golden ratio, its top 24 bits over 2^24. No state, so a draw does not depend on
what else ran, and any implementation (kernels/sample.py's int64 tensor form, on the device)
reproduces it bit for bit.
"""

from __future__ import annotations

MASK64 = (1 << 64) - 1
GOLDEN, MIX1, MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
SHIFTS = (30, 27, 31)  # the three xor-shifts of splitmix64's finalizer
BITS = 24  # bits of the result: exact in float32


def uniform(seed: int, index: int) -> float:
    """u in [0, 1) for token `index` of a sequence seeded with `seed` (0 <= seed < 2^64)."""
    z = (seed + (index + 1) * GOLDEN) & MASK64
    z = ((z ^ (z >> SHIFTS[0])) * MIX1) & MASK64
    z = ((z ^ (z >> SHIFTS[1])) * MIX2) & MASK64
    z ^= z >> SHIFTS[2]
    return (z >> (64 - BITS)) / float(1 << BITS)
