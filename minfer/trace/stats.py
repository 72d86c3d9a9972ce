"""Per-tensor statistics, value heatmaps and logit distributions for the trace recorder.

Statistics and heatmaps are computed on the host with numpy: each node's output is copied to the
host once (a no-op view for CPU tensors) and reduced with a handful of vectorized calls. On CPU
that costs a few microseconds per decode-sized node, where the equivalent torch calls cost ~5 us
each in dispatch alone; on a GPU the copy is small next to the synchronization that per-node
timing needs anyway.

- `tensor_stats`: exact min / max / mean / population std over the finite elements plus NaN and Inf
  counts, accumulated in float64. Large tensors are reduced in chunks (merged with Chan's parallel
  variance formula) so no float64 copy of more than `CHUNK_ELEMS` elements is ever made.
- `heatmap`: the tensor viewed as rows x cols (leading dims folded into rows), averaged over
  rectangular bins to at most `max_side` x `max_side` cells and quantized to uint8 between the
  smallest and largest cell.
- `distribution`: softmax of one logit row in float64: top-k ids and probabilities,
  entropy, and the probability and rank of the chosen token.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from ..errors import MinferError

CHUNK_ELEMS = 1 << 22
"""Elements reduced per float64 pass (32 MiB of float64): bounds the recorder's extra memory."""

NONFINITE_CODE = 255
"""Heatmap byte marking a cell whose source elements include a NaN or an Inf."""
LEVELS = 254
"""Finite cells are quantized to 0..LEVELS (LEVELS + 1 levels)."""

_NUMPY_OK = {torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
             torch.bool}


@dataclass(frozen=True)
class Stats:
    """Statistics of one tensor. min/max/mean/std are None when no element is finite."""

    numel: int
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    nan: int
    inf: int


def host_array(x: torch.Tensor) -> np.ndarray:
    """`x` as a numpy array on the host, converting only dtypes numpy lacks (f16/bf16/fp8 -> f32)."""
    t = x.detach()
    if t.dtype not in _NUMPY_OK:
        t = t.float()
    return t.cpu().numpy()


def _sq_dev(c: np.ndarray, mean: float) -> float:
    """Sum of squared deviations. Not `dev @ dev`: BLAS threads stall on a busy machine."""
    dev = c - mean
    return float(np.square(dev, out=dev).sum())


def _chunk_moments(c: np.ndarray) -> tuple[int, float, float, float, float, int, int]:
    """(n_finite, mean, M2, min, max, nan, inf) of a flat float64 chunk."""
    n = c.size
    mean = float(c.sum()) / n
    if math.isfinite(mean):  # float64 sums of float32-range values cannot overflow: all elements finite
        return n, mean, _sq_dev(c, mean), float(c.min()), float(c.max()), 0, 0
    finite = np.isfinite(c)
    nf = int(np.count_nonzero(finite))
    nan = int(np.count_nonzero(np.isnan(c)))
    if nf == 0:
        return 0, 0.0, 0.0, math.inf, -math.inf, nan, n - nan
    f = c[finite]
    mean = float(f.sum()) / nf
    return nf, mean, _sq_dev(f, mean), float(f.min()), float(f.max()), nan, n - nf - nan


def tensor_stats(x: torch.Tensor | np.ndarray) -> Stats:
    """Exact statistics of `x` (any dtype, any device) over its finite elements, in float64."""
    flat = (x if isinstance(x, np.ndarray) else host_array(x)).reshape(-1)
    numel = flat.size
    n, mean, m2, lo, hi, nan, inf = 0, 0.0, 0.0, math.inf, -math.inf, 0, 0
    for start in range(0, numel, CHUNK_ELEMS):
        chunk = flat[start : start + CHUNK_ELEMS].astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf in a sum is expected here
            cn, cm, cm2, clo, chi, cnan, cinf = _chunk_moments(chunk)
        nan += cnan
        inf += cinf
        if cn == 0:
            continue
        total = n + cn
        delta = cm - mean
        mean += delta * cn / total
        m2 += cm2 + delta * delta * n * cn / total
        n = total
        lo, hi = min(lo, clo), max(hi, chi)
    if n == 0:
        return Stats(numel, None, None, None, None, nan, inf)
    return Stats(numel, lo, hi, mean, math.sqrt(m2 / n), nan, inf)


@dataclass(frozen=True)
class Heatmap:
    """A binned, uint8-quantized picture of a tensor viewed as `rows` x `cols`.

    Cell value = lo + code * (hi - lo) / LEVELS for code <= LEVELS; NONFINITE_CODE marks a cell
    whose bin holds a NaN or Inf. `data` is the base64 of h*w bytes, row-major.
    """

    rows: int
    cols: int
    h: int
    w: int
    lo: float
    hi: float
    data: str

    def nbytes(self) -> int:
        return len(self.data)


@lru_cache(maxsize=512)
def bins(n: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, sizes) of `count` contiguous bins over range(n): bin i is [i*n//count, (i+1)*n//count)."""
    edges = (np.arange(count + 1, dtype=np.int64) * n) // count
    return edges[:-1], np.diff(edges)


def _bin_mean(m: np.ndarray, h: int, w: int) -> np.ndarray:
    """float64 means of m (rows x cols) over h x w bins; a dim that needs no binning is not reduced."""
    rows, cols = m.shape
    if h == rows:
        out = m.astype(np.float64)
    else:
        starts, sizes = bins(rows, h)
        out = np.add.reduceat(m, starts, axis=0, dtype=np.float64) / sizes[:, None]
    if w != cols:
        starts, sizes = bins(cols, w)
        out = np.add.reduceat(out, starts, axis=1) / sizes
    return out


def heatmap(x: torch.Tensor | np.ndarray, max_side: int, all_finite: bool | None = None) -> Heatmap | None:
    """Bin-average `x` (last dim = columns, leading dims folded into rows) to <= max_side^2 cells.

    `all_finite` (known from `tensor_stats`) skips the NaN/Inf scan; None means unknown.
    """
    a = x if isinstance(x, np.ndarray) else host_array(x)
    m = a.reshape(1, 1) if a.ndim == 0 else a.reshape(-1, a.shape[-1])
    rows, cols = m.shape
    if rows == 0 or cols == 0:
        return None
    h, w = min(rows, max_side), min(cols, max_side)
    if all_finite is None:
        all_finite = m.dtype.kind != "f" or bool(np.isfinite(m).all())
    if all_finite:
        cells = _bin_mean(m, h, w)
        bad = None
        lo, hi = float(cells.min()), float(cells.max())
    else:
        finite = np.isfinite(m)
        cells = _bin_mean(np.where(finite, m, 0), h, w)
        bad = _bin_mean(~finite, h, w) > 0
        good = cells[~bad]
        lo, hi = (float(good.min()), float(good.max())) if good.size else (0.0, 0.0)
    span = hi - lo
    codes = np.zeros(cells.shape) if span == 0 else np.rint((cells - lo) * (LEVELS / span))
    if bad is not None:
        codes[bad] = NONFINITE_CODE
    raw = codes.astype(np.uint8).tobytes()  # codes lie in [0, LEVELS]: (hi - lo) * LEVELS / span rounds to LEVELS
    return Heatmap(rows, cols, h, w, lo, hi, base64.b64encode(raw).decode("ascii"))


@dataclass(frozen=True)
class Distribution:
    """The softmax of one logit row: top-k, entropy (nats), and the chosen token's place in it."""

    top_ids: list[int]
    top_probs: list[float]
    top_logits: list[float]
    entropy: float
    token_prob: float | None
    token_logit: float | None
    token_rank: int | None


def distribution(logits: torch.Tensor, top_k: int, token_id: int | None) -> Distribution:
    """Top-k / entropy / chosen-token probability of the LAST row of `logits` ([vocab] or [.., vocab])."""
    if logits.dim() == 0 or logits.numel() == 0:
        raise MinferError(f"trace: end_step needs logits of shape [.., vocab], got {list(logits.shape)}")
    row = host_array(logits.reshape(-1, logits.shape[-1])[-1]).astype(np.float64)
    vocab = row.size
    if token_id is not None and not 0 <= token_id < vocab:
        raise MinferError(f"trace: token id {token_id} outside the logits' vocabulary of {vocab}")
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        shifted = row - row.max()
        e = np.exp(shifted)
        total = e.sum()
        p = e / total
        ok = math.isfinite(total) and total > 0  # else a NaN logit, or all -inf: no distribution
        logp = shifted - math.log(total) if ok else shifted
        entropy = -float(np.where(p > 0, p * logp, 0.0).sum()) if ok else math.nan
    k = min(top_k, vocab)
    top = np.argpartition(-logp, k - 1)[:k] if k < vocab else np.arange(vocab)
    top = top[np.lexsort((top, -logp[top]))]  # by probability, ties by id
    tok_prob = tok_logit = tok_rank = None
    if token_id is not None:
        tok_prob, tok_logit = float(p[token_id]), float(row[token_id])
        tok_rank = int(np.count_nonzero(logp > logp[token_id]))
    return Distribution(
        top_ids=top.tolist(),
        top_probs=p[top].tolist(),
        top_logits=row[top].tolist(),
        entropy=entropy,
        token_prob=tok_prob,
        token_logit=tok_logit,
        token_rank=tok_rank,
    )
