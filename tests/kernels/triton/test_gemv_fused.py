"""The decode GEMVs with a fused epilogue (gemv_swiglu, gemv_rope) or tail (gemv_add_rms_norm,
gemv_norm_add_rms_norm) against float64 math on the reference-decoded weights, at the 32-row tile
with split K (the 7B-like config) and the small tile, and against the unfused kernels they replace."""

from __future__ import annotations

import pytest
import torch

from minfer.backends.cpu import ops as cpu_ops
from minfer.contracts.harness import random_blocks
from minfer.errors import UnsupportedError
from minfer.kernels.triton.elementwise import swiglu
from minfer.kernels.triton.gemv_fused import (
    gemv_add_rms_norm,
    gemv_geglu,
    gemv_norm_add_rms_norm,
    gemv_norm_rope,
    gemv_rope,
    gemv_swiglu,
    repack_rope,
    repack_swiglu,
    rope_pairs,
)
from minfer.kernels.triton.int4 import INT4_TYPES
from minfer.kernels.triton.lut4 import LUT4_TYPES
from minfer.kernels.triton.norm import add_rms_norm
from minfer.kernels.triton.q4_0 import q4_0_gemv
from minfer.kernels.triton.qmatmul import gemv_default_config, repack_gemv
from minfer.kernels.triton.quantize import quantize_act_q8
from minfer.kernels.triton.rope import norm_rope, rope
from minfer.quant import reference
from minfer.quant.types import GGMLType, quant_info


def _weight(t: GGMLType, n: int, k: int, gen):
    raw = random_blocks(quant_info(t), n, k, gen)
    return raw, reference.dequantize(raw.reshape(-1), t, (n, k)).double()


def _tables(n_ctx: int, half: int):
    inv = 10000.0 ** (-torch.arange(half, dtype=torch.float64) / half)
    ang = torch.arange(n_ctx, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def _rope64(y: torch.Tensor, pos: int, cos, sin, n_heads: int, hd: int, n_rot: int, neox: bool) -> torch.Tensor:
    y = y.clone()
    half = n_rot // 2
    i = torch.arange(half)
    ia, ib = (i, i + half) if neox else (2 * i, 2 * i + 1)
    h = y[: n_heads * hd].view(n_heads, hd)
    a, b = h[:, ia].clone(), h[:, ib].clone()
    c, s = cos[pos].double(), sin[pos].double()
    h[:, ia] = a * c - b * s
    h[:, ib] = a * s + b * c
    return y


# the bound per activation form of the layout's config (GemvConfig.q8: f32, one or two int8 passes)
TOL = {0: 1e-5, 1: 1.5e-2, 2: 1e-4}
Q8_TYPES = (GGMLType.Q4_0, *INT4_TYPES, *LUT4_TYPES)  # the types whose GEMV takes int8 activations

# (type, n, k): a split-K 32-row tile config (n * k > 2^22), the small 8-row tile
BIG = [(GGMLType.Q4_0, 1024, 4608), (GGMLType.Q4_K, 512, 8448)]
SMALL = [(GGMLType.Q6_K, 64, 512), (GGMLType.Q8_0, 96, 320), (GGMLType.Q5_1, 32, 256), (GGMLType.IQ4_XS, 64, 512)]


@pytest.mark.parametrize("t, n, k", BIG + SMALL)
def test_gemv_swiglu(t, n, k, device, gen, check):
    raw, w = _weight(t, n, k, gen)
    x = torch.randn(k, generator=gen)
    y = w @ x.double()
    f = n // 2
    ref = (torch.nn.functional.silu(y[:f]) * y[f:])[None, :]
    packed = repack_swiglu(raw.to(device), n, k, t)
    if (t, n, k) in BIG:
        assert packed.config.block_n == 32 and packed.config.split > 1  # the tile a 7B layer runs
    out = check.poisoned((1, f), torch.float32, device)
    gemv_swiglu(x.to(device), packed, n, k, t, out=out)
    assert check.rel_err(out, ref) < TOL[packed.config.q8 if t in Q8_TYPES else 0]


@pytest.mark.parametrize("t, n, k", SMALL[:2])
def test_gemv_geglu(t, n, k, device, gen, check):
    """gemma's gate+up GEMV with gelu_tanh (the cpu reference's) in its store, on the SwiGLU layout."""
    raw, w = _weight(t, n, k, gen)
    x = torch.randn(k, generator=gen)
    y = w @ x.double()
    f = n // 2
    ref = cpu_ops.geglu(y[:f], y[f:])[None, :]
    packed = repack_swiglu(raw.to(device), n, k, t)
    out = check.poisoned((1, f), torch.float32, device)
    gemv_geglu(x.to(device), packed, n, k, t, out=out)
    assert check.rel_err(out, ref) < TOL[packed.config.q8 if t in Q8_TYPES else 0]


@pytest.mark.parametrize("t, n, k", BIG[:1] + SMALL[:2])
@pytest.mark.parametrize("neox", [True, False])
def test_gemv_rope(t, n, k, neox, device, gen, check):
    hd = 128 if n >= 1024 else 16
    n_heads = n // hd - 2  # the rest: one "v" head and one more head's worth of unrotated columns
    n_rot = hd if neox else hd // 2  # a partial rotation (the head's other dims pass through)
    raw, w = _weight(t, n, k, gen)
    x = torch.randn(k, generator=gen)
    b = torch.randn(n, generator=gen)
    cos, sin = _tables(64, n_rot // 2)
    pos = int(torch.randint(0, 64, (1,), generator=gen))
    ref = _rope64(w @ x.double() + b.double(), pos, cos, sin, n_heads, hd, n_rot, neox)[None, :]
    packed = repack_rope(raw.to(device), n, k, t, n_heads, hd, n_rot, neox)
    out = check.poisoned((1, n), torch.float32, device)
    positions = torch.tensor([pos], dtype=torch.int32, device=device)
    gemv_rope(x.to(device), packed, b.to(device), positions, cos.to(device), sin.to(device), n, k, t, n_heads,
              hd, n_rot, neox, out=out)
    assert check.rel_err(out, ref) < TOL[packed.config.q8 if t in Q8_TYPES else 0]


def test_fused_equals_the_kernels_it_replaces(device, gen):
    """The GEMV rows are the plain GEMV's sums; SwiGLU and RoPE add their own f32 rounding only."""
    t, n, k = GGMLType.Q4_0, 1024, 4608
    raw, _ = _weight(t, n, k, gen)
    x = torch.randn(k, generator=gen).to(device)
    plain = q4_0_gemv(x, repack_gemv(raw.to(device), n, k, t), n, k)
    fused = gemv_swiglu(x, raw.to(device), n, k, t)
    unfused = swiglu(plain[:, : n // 2].contiguous(), plain[:, n // 2:].contiguous())
    assert torch.allclose(fused, unfused, rtol=1e-6, atol=1e-6)
    cos, sin = _tables(16, 64)
    pos = torch.tensor([7], dtype=torch.int32, device=device)
    b = torch.zeros(n, device=device)
    got = gemv_rope(x, raw.to(device), b, pos, cos.to(device), sin.to(device), n, k, t, 6, 128, 128, True)
    want = plain.clone()
    want[:, :768] = rope(plain[:, :768].contiguous(), pos, cos.to(device), sin.to(device), 6, 128, 128, True)
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-5)


def test_rope_pairs_cover_every_column_once():
    for n, heads, hd, n_rot, neox in [(4608, 32, 128, 128, True), (96, 5, 16, 12, True), (64, 3, 16, 8, False)]:
        a, b, f = rope_pairs(n, heads, hd, n_rot, neox)
        cols = torch.cat([a, b]).sort().values
        assert torch.equal(cols, torch.arange(n))
        assert int((f >= 0).sum()) == heads * n_rot // 2
        rotated = f >= 0
        assert torch.equal(b[rotated] - a[rotated], torch.full_like(a[rotated], n_rot // 2 if neox else 1))


def test_misuse_is_a_typed_error(device, gen):
    t, n, k = GGMLType.Q4_0, 36, 64  # 36 rows: not a whole number of 8-row tiles
    raw, _ = _weight(t, n, k, gen)
    with pytest.raises(UnsupportedError, match="multiple of the GEMV tile"):
        repack_swiglu(raw.to(device), n, k, t)
    raw, _ = _weight(t, 32, k, gen)
    packed = repack_rope(raw.to(device), 32, k, t, 1, 16, 16, True)
    with pytest.raises(UnsupportedError, match="RoPE pair layout"):
        gemv_swiglu(torch.randn(k, device=device), packed, 32, k, t)
    cos, sin = _tables(8, 8)
    args = (torch.zeros(32, device=device), torch.zeros(1, dtype=torch.int32, device=device), cos.to(device),
            sin.to(device), 32, k, t)
    with pytest.raises(UnsupportedError, match="made for RoPE"):
        gemv_rope(torch.randn(k, device=device), packed, *args, 1, 16, 8, True)
    with pytest.raises(UnsupportedError, match="reads Q4_0"):
        repack_swiglu(raw.to(device), 32, k, GGMLType.F16)
    with pytest.raises(UnsupportedError, match="does not fit"):
        repack_rope(raw.to(device), 32, k, t, 3, 16, 16, True)  # 48 rotated columns of 32



def test_gemv_rope_writes_the_rows_keys_and_values_into_the_cache(device, gen):
    """With a cache, gemv_rope also stores the row's k (rotated) and v columns at (layer, slot,
    position), as kv_write would, and touches no other cache entry."""
    t, hd, nq, nkv, k = GGMLType.Q4_0, 16, 4, 2, 256
    n = (nq + 2 * nkv) * hd
    raw, _ = _weight(t, n, k, gen)
    x, b = torch.randn(k, generator=gen).to(device), torch.randn(n, generator=gen).to(device)
    cos, sin = _tables(32, hd // 2)
    cos, sin = cos.to(device), sin.to(device)
    layers, slots, n_ctx = 3, 4, 32
    ck = torch.full((layers, slots, nkv, n_ctx, hd), float("nan"), dtype=torch.float16, device=device)
    cv = ck.clone()
    layer, slot, pos = 1, 2, 19
    positions = torch.tensor([pos], dtype=torch.int32, device=device)
    row_slots = torch.tensor([slot], dtype=torch.int32, device=device)
    out = gemv_rope(x, raw.to(device), b, positions, cos, sin, n, k, t, nq + nkv, hd, hd, True, cache_k=ck,
                    cache_v=cv, row_slots=row_slots, layer=layer, n_head_kv=nkv)
    plain = gemv_rope(x, raw.to(device), b, positions, cos, sin, n, k, t, nq + nkv, hd, hd, True)
    assert torch.equal(out, plain)
    keys = out[0, nq * hd:(nq + nkv) * hd].view(nkv, hd).half()
    vals = out[0, (nq + nkv) * hd:].view(nkv, hd).half()
    assert torch.equal(ck[layer, slot, :, pos], keys) and torch.equal(cv[layer, slot, :, pos], vals)
    ck[layer, slot, :, pos] = float("nan")
    cv[layer, slot, :, pos] = float("nan")
    assert bool(ck.isnan().all()) and bool(cv.isnan().all())  # nothing else written
    with pytest.raises(UnsupportedError, match="do not make"):
        gemv_rope(x, raw.to(device), b, positions, cos, sin, n, k, t, nq + nkv, hd, hd, True, cache_k=ck,
                  cache_v=cv, row_slots=row_slots, layer=layer, n_head_kv=3)


def _rms64(v: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    v = v.double()
    return v / torch.sqrt((v * v).mean(-1, keepdim=True) + eps) * w.double()


# (type, n, k, rows, pinned config): the split-K 32-row tile, the small 8-row tile (12 row tiles a row), and
# 3 rows (the ROWS programs) with 2 K splits on 16 row tiles a row
TAILS = [(GGMLType.Q4_0, 1024, 4608, 1, None), (GGMLType.Q6_K, 96, 512, 1, None), (GGMLType.Q8_0, 96, 320, 1, None),
         (GGMLType.Q4_K, 64, 512, 3, {"r": 2, "lr": 2, "wk": 2, "split": 2, "maxnreg": None}),
         (GGMLType.IQ4_XS, 128, 512, 2, {"r": 4, "lr": 2, "wk": 2, "split": 1, "maxnreg": None})]


@pytest.mark.parametrize("t, n, k, rows, config", TAILS)
@pytest.mark.parametrize("post", [False, True])
def test_gemv_add_rms_norm(t, n, k, rows, config, post, device, gen, check):
    """out = RMSNorm(res + y) with w_n (post: res + RMSNorm(y) with w_y), y = x @ W^T, the sum over
    res in place, the int8 records of out those quantize_act_q8 makes of it; a second call on the
    same weight (its row counters reset by the first) gives the same bits."""
    raw, w = _weight(t, n, k, gen)
    x = torch.randn(rows, k, generator=gen)
    res = torch.randn(rows, n, generator=gen)
    w_n, w_y = torch.rand(n, generator=gen) + 0.5, torch.rand(n, generator=gen) + 0.5
    y = x.double() @ w.T
    h = res.double() + (_rms64(y, w_y, 1e-6) if post else y)
    packed = repack_gemv(raw.to(device), n, k, t)
    q8 = (check.poisoned((rows, n // 32, 16), torch.int32, device), check.poisoned((rows, n // 32, 4), torch.float32,
                                                                                  device))
    outs, sums = [], []
    for _ in range(2):
        r = res.to(device).clone()  # (the residual, updated in place)
        out = check.poisoned((rows, n), torch.float32, device)
        if post:
            gemv_norm_add_rms_norm(x.to(device), packed, r, w_y.to(device), w_n.to(device), n, k, t, 1e-6, out=out,
                                   sum_out=r, q8=q8, config=config)
        else:
            gemv_add_rms_norm(x.to(device), packed, r, w_n.to(device), n, k, t, 1e-6, out=out, sum_out=r, q8=q8,
                              config=config)
        outs.append(out.cpu().clone())
        sums.append(r.cpu().clone())
    q8x = (config or {}).get("q8", gemv_default_config(n, k, t).q8) if t in Q8_TYPES else 0
    assert check.rel_err(sums[0], h) < TOL[q8x] and check.rel_err(outs[0], _rms64(h, w_n, 1e-6)) < TOL[q8x]
    check.same_values(outs[1], outs[0])
    check.same_values(sums[1], sums[0])
    codes, scales = quantize_act_q8(outs[0].to(device), 2)
    assert torch.equal(q8[0].cpu(), codes.cpu())
    check.same_values(q8[1], scales)


def test_tail_equals_the_gemv_then_add_rms_norm(device, gen):
    """The tail's y is the plain GEMV's sums bit for bit; the add and norm differ from add_rms_norm's
    only by the order of the sum of squares (per row tile, then the tiles)."""
    t, n, k = GGMLType.Q4_0, 1024, 4608
    raw, _ = _weight(t, n, k, gen)
    packed = repack_gemv(raw.to(device), n, k, t)
    x = torch.randn(1, k, generator=gen).to(device)
    res = torch.randn(1, n, generator=gen).to(device)
    w_n = (torch.rand(n, generator=gen) + 0.5).to(device)
    want_h = res.clone()
    want = add_rms_norm(want_h, q4_0_gemv(x, packed, n, k), w_n, 1e-6, sum_out=want_h)
    got_h = torch.empty_like(res)
    got = gemv_add_rms_norm(x, packed, res, w_n, n, k, t, 1e-6, sum_out=got_h)
    assert torch.equal(got_h, want_h)  # (the same y, the same f32 add)
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)


def test_tail_misuse_is_a_typed_error(device, gen):
    t, n, k = GGMLType.Q4_0, 64, 256
    raw, _ = _weight(t, n, k, gen)
    packed = repack_gemv(raw.to(device), n, k, t)
    x, w_n = torch.randn(1, k, device=device), torch.ones(n, device=device)
    with pytest.raises(UnsupportedError, match="res must be"):
        gemv_add_rms_norm(x, packed, torch.zeros(2, n, device=device), w_n, n, k, t, 1e-6)
    with pytest.raises(UnsupportedError, match="w_n must be"):
        gemv_add_rms_norm(x, packed, torch.zeros(1, n, device=device), w_n[:32], n, k, t, 1e-6)
    with pytest.raises(UnsupportedError, match="the call says"):
        gemv_add_rms_norm(x, packed, torch.zeros(1, n, device=device), w_n, n, k, GGMLType.Q8_0, 1e-6)
    with pytest.raises(UnsupportedError, match="eps"):
        gemv_add_rms_norm(x, packed, torch.zeros(1, n, device=device), w_n, n, k, t, -1.0)


# (type, q heads, k heads, head_dim, n_rot, neox, k, rows, pinned config): the split-K 32-row tile (4 tiles a
# head), the planes' small tile (8 rows: 8 tiles a head) with a partial rotation, 3 rows on 2 K splits
NORM_ROPE = [(GGMLType.Q4_0, 8, 2, 128, 128, True, 4608, 1, None),
             (GGMLType.Q6_K, 3, 1, 64, 32, False, 512, 1, None),
             (GGMLType.Q4_K, 2, 2, 32, 32, True, 512, 3, {"r": 2, "lr": 4, "wk": 2, "split": 2, "maxnreg": None})]


@pytest.mark.parametrize("t, nq, nk, hd, n_rot, neox, k, rows, config", NORM_ROPE)
def test_gemv_norm_rope(t, nq, nk, hd, n_rot, neox, k, rows, config, device, gen, check):
    """out = y = x @ W^T with its q and k heads RMS-normed (w_q, w_k) and rotated at each row's
    position, as norm_rope does, v's columns the plain GEMV's; a second call the same bits."""
    n = (nq + 2 * nk) * hd
    raw, w = _weight(t, n, k, gen)
    x = torch.randn(rows, k, generator=gen)
    w_q, w_k = torch.rand(hd, generator=gen) + 0.5, torch.rand(hd, generator=gen) + 0.5
    cos, sin = _tables(64, n_rot // 2)
    pos = torch.randint(0, 64, (rows,), generator=gen, dtype=torch.int32)
    y = x.double() @ w.T
    c = (nq + nk) * hd
    heads = y[:, :c].reshape(rows, nq + nk, hd)
    normed = heads / torch.sqrt((heads * heads).mean(-1, keepdim=True) + 1e-6) * torch.cat(
        [w_q.double().expand(nq, hd), w_k.double().expand(nk, hd)])
    ref = y.clone()
    for r in range(rows):
        ref[r, :c] = _rope64(normed[r].reshape(-1), int(pos[r]), cos, sin, nq + nk, hd, n_rot, neox)
    packed = repack_gemv(raw.to(device), n, k, t)
    args = (w_q.to(device), w_k.to(device), pos.to(device), cos.to(device), sin.to(device), n, k, t, nq, nk, hd,
            n_rot, neox, 1e-6)
    outs = []
    for _ in range(2):
        out = check.poisoned((rows, n), torch.float32, device)
        gemv_norm_rope(x.to(device), packed, *args, out=out, config=config)
        outs.append(out.cpu().clone())
    q8x = (config or {}).get("q8", gemv_default_config(n, k, t).q8) if t in Q8_TYPES else 0
    assert check.rel_err(outs[0], ref) < TOL[q8x]
    check.same_values(outs[1], outs[0])


def test_norm_rope_tail_equals_the_gemv_then_norm_rope(device, gen):
    """v's columns are the plain GEMV's bit for bit, q's and k's norm_rope's of the same sums."""
    t, nq, nk, hd, k = GGMLType.Q4_0, 8, 2, 128, 4608
    n = (nq + 2 * nk) * hd
    raw, _ = _weight(t, n, k, gen)
    packed = repack_gemv(raw.to(device), n, k, t)
    x = torch.randn(1, k, generator=gen).to(device)
    w_q, w_k = (torch.rand(hd, generator=gen) + 0.5).to(device), (torch.rand(hd, generator=gen) + 0.5).to(device)
    cos, sin = (v.to(device) for v in _tables(16, hd // 2))
    pos = torch.tensor([11], dtype=torch.int32, device=device)
    plain = q4_0_gemv(x, packed, n, k)
    got = gemv_norm_rope(x, packed, w_q, w_k, pos, cos, sin, n, k, t, nq, nk, hd, hd, True, 1e-6)
    c = (nq + nk) * hd
    assert torch.equal(got[:, c:], plain[:, c:])
    want = norm_rope(plain, w_q, w_k, pos, cos, sin, nq, nk, hd, hd, True, 1e-6)
    assert torch.allclose(got[:, :c], want, rtol=1e-6, atol=1e-6)


def test_norm_rope_tail_misuse_is_a_typed_error(device, gen):
    t, hd, k = GGMLType.Q4_0, 32, 256
    n = 4 * hd
    raw, _ = _weight(t, n, k, gen)
    packed = repack_gemv(raw.to(device), n, k, t)
    x, w = torch.randn(1, k, device=device), torch.ones(hd, device=device)
    cos, sin = (v.to(device) for v in _tables(8, hd // 2))
    pos = torch.zeros(1, dtype=torch.int32, device=device)
    with pytest.raises(UnsupportedError, match="do not fit"):
        gemv_norm_rope(x, packed, w, w, pos, cos, sin, n, k, t, 3, 2, hd, hd, True, 1e-6)  # 5 heads of 4
    with pytest.raises(UnsupportedError, match="one position a row"):
        gemv_norm_rope(x, packed, w, w, pos.repeat(2), cos, sin, n, k, t, 2, 1, hd, hd, True, 1e-6)
    with pytest.raises(UnsupportedError, match="w_k must be"):
        gemv_norm_rope(x, packed, w, w[:16], pos, cos, sin, n, k, t, 2, 1, hd, hd, True, 1e-6)
    with pytest.raises(UnsupportedError, match="cos must be"):
        gemv_norm_rope(x, packed, w, w, pos, cos[:, :4], sin, n, k, t, 2, 1, hd, hd, True, 1e-6)
