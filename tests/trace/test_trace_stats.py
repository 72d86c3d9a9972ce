"""Tensor statistics, heatmaps and logit distributions against direct float64 computations."""

from __future__ import annotations

import base64
import math
import zlib

import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from minfer.trace import stats as st


def _oracle(a: np.ndarray) -> dict:
    """Direct float64 statistics over the finite elements (Python floats, math.fsum for the sums)."""
    flat = a.astype(np.float64).ravel()
    fin = flat[np.isfinite(flat)]
    out = {"numel": flat.size, "nan": int(np.isnan(flat).sum()), "inf": int(np.isinf(flat).sum())}
    if fin.size == 0:
        return out | {"min": None, "max": None, "mean": None, "std": None}
    vals = fin.tolist()
    mean = math.fsum(vals) / len(vals)
    var = math.fsum((v - mean) ** 2 for v in vals) / len(vals)
    return out | {"min": min(vals), "max": max(vals), "mean": mean, "std": math.sqrt(var)}


def _assert_stats(s: st.Stats, ref: dict) -> None:
    assert (s.numel, s.nan, s.inf) == (ref["numel"], ref["nan"], ref["inf"])
    if ref["mean"] is None:
        assert (s.min, s.max, s.mean, s.std) == (None, None, None, None)
        return
    assert s.min == ref["min"] and s.max == ref["max"]  # min/max are exact
    assert s.mean == pytest.approx(ref["mean"], rel=1e-12, abs=1e-15)
    assert s.std == pytest.approx(ref["std"], rel=1e-10, abs=1e-15)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32])
@pytest.mark.parametrize("shape", [(1, 576), (7, 3, 50), (5,), ()])
def test_stats_match_float64(dtype, shape):
    g = torch.Generator().manual_seed(zlib.crc32(f"{dtype}{shape}".encode()))
    x = (torch.randn(shape, generator=g) * 3 + 1.5)
    x = x.round().to(dtype) if dtype == torch.int32 else x.to(dtype)
    ref = _oracle(x.double().numpy())
    _assert_stats(st.tensor_stats(x), ref)


def test_stats_large_offset_values_stay_accurate():
    """mean >> std: the two-pass deviation sum must not cancel catastrophically."""
    x = torch.tensor(np.float32(1e4) + np.random.default_rng(0).standard_normal(4096).astype(np.float32))
    _assert_stats(st.tensor_stats(x), _oracle(x.numpy()))


def test_stats_chunked_merge_equals_single_pass(monkeypatch):
    """Chunked reduction (Chan's merge) equals the direct computation, NaNs spread across chunks."""
    rng = np.random.default_rng(1)
    a = (rng.standard_normal(10_007) * 2 - 0.7).astype(np.float32)
    a[[3, 5000, 9999]] = np.nan
    a[[17, 7000]] = np.inf
    a[8000] = -np.inf
    monkeypatch.setattr(st, "CHUNK_ELEMS", 1000)
    _assert_stats(st.tensor_stats(torch.from_numpy(a)), _oracle(a))


def test_nan_inf_counts_and_finite_only_stats():
    x = torch.tensor([[1.0, float("nan"), 3.0], [float("inf"), -2.0, float("-inf")], [float("nan"), 0.5, 4.0]])
    s = st.tensor_stats(x)
    assert (s.nan, s.inf, s.numel) == (2, 2, 9)
    finite = [1.0, 3.0, -2.0, 0.5, 4.0]
    assert s.min == -2.0 and s.max == 4.0
    assert s.mean == pytest.approx(sum(finite) / 5, rel=1e-15)
    assert s.std == pytest.approx(np.std(finite), rel=1e-14)


def test_all_nonfinite_and_empty():
    s = st.tensor_stats(torch.tensor([float("nan"), float("inf"), float("nan")]))
    assert (s.nan, s.inf, s.mean, s.min, s.std) == (2, 1, None, None, None)
    e = st.tensor_stats(torch.zeros(0, 4))
    assert (e.numel, e.nan, e.inf, e.mean) == (0, 0, 0, None)
    assert st.heatmap(torch.zeros(0, 4), 8) is None


def _decode(hm: st.Heatmap) -> tuple[np.ndarray, np.ndarray]:
    codes = np.frombuffer(base64.b64decode(hm.data), dtype=np.uint8).reshape(hm.h, hm.w)
    values = hm.lo + codes.astype(np.float64) * (hm.hi - hm.lo) / st.LEVELS
    return codes, values


def _oracle_cells(m: np.ndarray, h: int, w: int) -> np.ndarray:
    """Bin means by explicit loops; bin i of n items over b bins is [floor(i*n/b), floor((i+1)*n/b))."""
    rows, cols = m.shape
    out = np.empty((h, w))
    for i in range(h):
        for j in range(w):
            r0, r1 = i * rows // h, (i + 1) * rows // h
            c0, c1 = j * cols // w, (j + 1) * cols // w
            block = [float(v) for row in m[r0:r1, c0:c1] for v in row]
            out[i, j] = math.fsum(block) / len(block)
    return out


@pytest.mark.parametrize("shape,max_side", [((37, 200), 16), ((4, 9, 30), 8), ((1, 576), 64), ((3, 5), 64),
                                            ((130,), 64)])
def test_heatmap_cells_are_bin_means(shape, max_side):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(7))
    hm = st.heatmap(x, max_side)
    m = x.numpy().reshape(-1, shape[-1])
    assert (hm.rows, hm.cols) == m.shape
    assert (hm.h, hm.w) == (min(m.shape[0], max_side), min(m.shape[1], max_side))
    ref = _oracle_cells(m, hm.h, hm.w)
    codes, values = _decode(hm)
    assert hm.lo == pytest.approx(ref.min(), rel=1e-6) and hm.hi == pytest.approx(ref.max(), rel=1e-6)
    assert codes.max() == st.LEVELS and codes.min() == 0
    step = (ref.max() - ref.min()) / st.LEVELS
    assert np.abs(values - ref).max() <= step / 2 + 1e-6 * (abs(ref).max() + 1)


def test_heatmap_marks_nonfinite_cells():
    x = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    x[0, 0] = float("nan")
    x[7, 7] = float("inf")
    hm = st.heatmap(x, 4)
    codes, values = _decode(hm)
    assert codes[0, 0] == st.NONFINITE_CODE and codes[3, 3] == st.NONFINITE_CODE
    assert (codes == st.NONFINITE_CODE).sum() == 2
    ref = _oracle_cells(x.numpy(), 4, 4)
    good = codes != st.NONFINITE_CODE
    assert hm.lo == ref[good].min() and hm.hi == ref[good].max()
    assert np.abs(values[good] - ref[good]).max() <= (hm.hi - hm.lo) / st.LEVELS / 2 + 1e-9


def test_heatmap_constant_tensor():
    hm = st.heatmap(torch.full((3, 70), 2.5), 64)
    codes, _ = _decode(hm)
    assert hm.lo == hm.hi == 2.5 and not codes.any()


def _softmax64(v: np.ndarray) -> np.ndarray:
    e = np.exp(v - v.max())
    return e / e.sum()


def test_distribution_matches_float64_softmax():
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((3, 1000)).astype(np.float32) * 4
    row = logits[-1].astype(np.float64)
    p = _softmax64(row)
    order = np.argsort(-p, kind="stable")
    tok = int(order[17])
    d = st.distribution(torch.from_numpy(logits), 10, tok)
    assert d.top_ids == order[:10].tolist()
    assert d.top_probs == pytest.approx(p[order[:10]].tolist(), rel=1e-12)
    assert d.top_logits == row[order[:10]].tolist()
    assert d.entropy == pytest.approx(-math.fsum(float(q * math.log(q)) for q in p if q > 0), rel=1e-12)
    assert d.token_prob == pytest.approx(p[tok], rel=1e-12)
    assert d.token_rank == 17 and d.token_logit == row[tok]


def test_distribution_masked_logits_and_small_vocab():
    logits = torch.tensor([0.0, float("-inf"), math.log(3.0)])
    d = st.distribution(logits, 10, 1)
    assert d.top_ids[:2] == [2, 0] and d.top_probs[:2] == pytest.approx([0.75, 0.25])
    assert len(d.top_ids) == 3
    assert d.entropy == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert d.token_prob == 0.0 and d.token_rank == 2


def test_distribution_rejects_bad_input():
    with pytest.raises(MinferError, match="outside"):
        st.distribution(torch.zeros(10), 3, 10)
    with pytest.raises(MinferError, match="vocab"):
        st.distribution(torch.tensor(1.0), 3, None)
