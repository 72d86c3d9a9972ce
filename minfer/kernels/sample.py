"""Sampling from a row of logits, one algorithm for the host and the device.

The chain is llama.cpp's default order (engine/params.py): top-k, top-p, min-p, temperature,
then a draw. The draw is an inverse-CDF pick with a counter-based uniform number: token i of a
sequence uses u = uniform(seed, i) (`minfer.rng`, a splitmix64 hash of (seed, i)), so a draw needs no generator
state, the same sequence draws the same tokens whatever else shares its batch, and the host
(`engine/sampler.py`, on CPU tensors) and the device (`sample_rows`, inside a CUDA graph) pick
the same token from the same logits (up to float rounding of the softmax at a CDF boundary).

- `pick_from_top(values, ids, top_k, temp, top_p, min_p, u)`: rows of candidates sorted largest
  first -> the chosen ids. Works for any number of candidates (the host passes all top_k of them,
  or the whole vocabulary when top_k is 0).
- `apply_bitmask(logits, bits)`: a grammar's allowed tokens (one bit per token, llguidance's
  layout) applied to logits rows: every refused token -inf (engine/masks.py on any backend's
  logits; inside the cuda backend's masked decode graphs).
- `sample_rows(x, params)`: the `Sample` contract: logits [B, V] and per-row parameters packed in
  one int32 [7, B] tensor (`pack_params`); rows with temperature 0 take the argmax (the first
  index of equal values, as the Argmax contract), the others the chain over the KMAX largest
  logits. The device takes rows with 1 <= top_k <= KMAX; others are sampled on the host.

This module imports torch only: the host sampler and the vulkan backend's sampled rows run it on
machines without Triton, on host tensors; the cuda backend runs it on the GPU inside the decode
graph.
"""

from __future__ import annotations

import torch

from .. import rng
from ..errors import UnsupportedError
from .checks import check_tensor, make_out, rows_view, same_device

KMAX = 64  # candidates per row on the device: the largest top_k it samples (llama.cpp's default is 40)
PARAM_ROWS = 7  # top_k, temperature, top_p, min_p (f32 bits), seed low, seed high, token index


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def uniform(seed: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`minfer.rng.uniform` on int64 tensors (bit patterns of unsigned 64-bit values; products
    wrap modulo 2^64): float32 [B] in [0, 1)."""
    a, b, c = rng.SHIFTS
    z = seed + (index + 1) * _signed(rng.GOLDEN)
    z = (z ^ _shr(z, a)) * _signed(rng.MIX1)
    z = (z ^ _shr(z, b)) * _signed(rng.MIX2)
    z = z ^ _shr(z, c)
    return _shr(z, 64 - rng.BITS).to(torch.float32) / float(1 << rng.BITS)


def pick_from_top(values: torch.Tensor, ids: torch.Tensor, top_k: torch.Tensor, temp: torch.Tensor,
                  top_p: torch.Tensor, min_p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The chosen id per row: values/ids [B, K] sorted largest first; per-row top_k (<= K, >= 1),
    temperature (> 0), top_p (1: off), min_p (0: off) and the uniform draw u."""
    rows, k_all = values.shape
    rank = torch.arange(k_all, device=values.device)[None, :]
    ninf = values.new_full((1, 1), float("-inf"), dtype=torch.float32)  # (a fill, not a host copy: graph-safe)
    v = values.float()
    k = top_k.clamp(1, k_all)[:, None]
    # top-p: the smallest prefix of the top-k whose probability mass reaches top_p (at least one)
    cum = torch.softmax(torch.where(rank < k, v, ninf), -1).cumsum(-1)
    n_p = ((cum < top_p[:, None]) & (rank < k)).sum(-1, keepdim=True) + 1
    keep = torch.where(top_p[:, None] < 1.0, torch.minimum(k, n_p), k)
    # min-p: the candidates at least min_p times as probable as the most probable one
    probs = torch.softmax(torch.where(rank < keep, v, ninf), -1)
    n_m = ((probs >= min_p[:, None] * probs[:, :1]) & (rank < keep)).sum(-1, keepdim=True).clamp(min=1)
    keep = torch.where(min_p[:, None] > 0.0, n_m, keep)
    # temperature, then the inverse-CDF draw
    cdf = torch.softmax(torch.where(rank < keep, v / temp[:, None], ninf), -1).cumsum(-1)
    choice = (cdf <= u[:, None] * cdf[:, -1:]).sum(-1, keepdim=True)
    choice = torch.minimum(choice, keep - 1)
    return ids.gather(1, choice)[:, 0]


def apply_bitmask(logits: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """`logits` [R, V] with every token whose bit is 0 in `bits` (int32 [R, ceil(V / 32)], on
    the logits' device; bit j of word w is token 32 w + j) set to -inf. Out of place; no host
    value is read (graph-safe)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bits.device)
    allowed = ((bits.unsqueeze(-1) >> shifts) & 1).reshape(bits.shape[0], -1)[:, :logits.shape[-1]]
    return logits.masked_fill(allowed == 0, float("-inf"))


def pack_params(rows: list[tuple[int, float, float, float, int, int]]) -> torch.Tensor:
    """int32 [7, B] (pinnable host tensor) from (top_k, temperature, top_p, min_p, seed, index)
    per row; floats as their f32 bit patterns."""
    if not rows:
        return torch.zeros(PARAM_ROWS, 0, dtype=torch.int32)
    k, t, p, m, seed, idx = zip(*rows, strict=True)
    floats = torch.tensor([t, p, m], dtype=torch.float32).view(torch.int32)
    lo = [s & 0xFFFFFFFF for s in seed]
    hi = [(s >> 32) & 0xFFFFFFFF for s in seed]
    ints = torch.tensor([lo, hi], dtype=torch.int64)
    ints = torch.where(ints >= 1 << 31, ints - (1 << 32), ints).to(torch.int32)
    return torch.cat([torch.tensor([k], dtype=torch.int32), floats, ints, torch.tensor([idx], dtype=torch.int32)])


def sample_rows(x: torch.Tensor, params: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out int32 [B]: the token of each row of logits x [B, V] under its packed parameters
    (`pack_params`): the argmax where the temperature is 0, else the sampling chain over the
    min(KMAX, V) largest logits with top_k clamped to 1..KMAX (the backend sends only rows
    whose top_k is in that range)."""
    what = "sample_rows"
    x2 = rows_view(what, "x", x)
    check_tensor(what, "params", params, (torch.int32,), ndim=2)
    rows = x2.shape[0]
    if params.shape != (PARAM_ROWS, rows):
        raise UnsupportedError(f"{what}: params must be [{PARAM_ROWS}, {rows}], got {tuple(params.shape)}")
    if x2.shape[1] < 1:
        raise UnsupportedError(f"{what}: rows of width 0 have no token")
    device = same_device(what, x=x2, params=params, out=out)  # any device (vulkan: the host)
    out = make_out(what, out, (rows,), torch.int32, device)
    fl = params[1:4].contiguous().view(torch.float32)
    temp, top_p, min_p = fl[0], fl[1], fl[2]
    seed = (params[5].long() << 32) | (params[4].long() & 0xFFFFFFFF)
    u = uniform(seed, params[6].long())
    values, ids = torch.topk(x2.float(), min(KMAX, x2.shape[1]), dim=-1)
    greedy_temp = torch.where(temp > 0, temp, torch.ones_like(temp))  # (rows at 0 take the argmax below)
    drawn = pick_from_top(values, ids, params[0].long(), greedy_temp, top_p, min_p, u)
    out.copy_(torch.where(temp > 0, drawn, torch.argmax(x2, dim=-1)))
    return out
