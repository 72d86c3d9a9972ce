"""The decode GEMVs with a fused epilogue (gemv_swiglu, gemv_rope) against float64 math on the
reference-decoded weights, at the 32-row tile with split K (the 7B-like config) and the small
tile, and against the unfused kernels they replace."""

from __future__ import annotations

import pytest
import torch

from minfer.backends.cpu import ops as cpu_ops
from minfer.contracts.harness import random_blocks
from minfer.errors import UnsupportedError
from minfer.kernels.triton.elementwise import swiglu
from minfer.kernels.triton.gemv_fused import (
    add_norm_sums,
    gemv_add_norm,
    gemv_geglu,
    gemv_rope,
    gemv_swiglu,
    repack_rope,
    repack_swiglu,
    rope_pairs,
)
from minfer.kernels.triton.int4 import INT4_TYPES
from minfer.kernels.triton.lut4 import LUT4_TYPES, lut4_gemv
from minfer.kernels.triton.planes import planes_gemv
from minfer.kernels.triton.q4_0 import q4_0_gemv
from minfer.kernels.triton.qmatmul import gemv_default_config, repack_gemv
from minfer.kernels.triton.rope import rope
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


# ------------------------------------------------------------------ the deferred RMSNorm (gemv_add_norm + rstd)
EPS = 1e-5


def _add_norm_case(t: GGMLType, n: int, k: int, device, gen, check):
    """gemv_add_norm on a random [n, k] weight: (h, out, ss, res after) and the float64 h."""
    raw, w = _weight(t, n, k, gen)
    x, res, w_n = torch.randn(k, generator=gen), torch.randn(n, generator=gen), torch.rand(n, generator=gen) + 0.5
    h = res.double() + w @ x.double()
    r = res.to(device)[None, :].contiguous()
    out = check.poisoned((1, n), torch.float32, device)
    ss = check.poisoned((add_norm_sums(n, k, t),), torch.float32, device)
    gemv_add_norm(x.to(device), raw.to(device), r, w_n.to(device), n, k, t, out=out, ss=ss)
    return h, w_n, r, out, ss


@pytest.mark.parametrize("t, n, k", [(GGMLType.Q4_0, 3584, 4608), (GGMLType.Q4_K, 512, 8448), *SMALL])
def test_gemv_add_norm_writes_the_sum_its_numerator_and_the_tiles_squares(t, n, k, device, gen, check):
    """h = res + x W^T over res, out = h * w_n, and the tiles' sums of h^2 add to |h|^2: the split-K
    32-row tile (a 7B's attention output) and the small tiles, every layout group."""
    h, w_n, r, out, ss = _add_norm_case(t, n, k, device, gen, check)
    tol = TOL[1] if t in Q8_TYPES and n * k > 1 << 24 else 1e-5  # x of f32 below 2^24 weights, int8 above
    assert check.rel_err(r, h[None, :]) < tol
    assert check.rel_err(out, (h * w_n.double())[None, :]) < tol
    assert abs(float(ss.double().sum()) / float((h * h).sum()) - 1) < 2 * tol and not ss.isnan().any()


def _rmsnormed(h: torch.Tensor, w_n: torch.Tensor) -> torch.Tensor:
    return h / torch.sqrt((h * h).mean() + EPS) * w_n.double()


@pytest.mark.parametrize("t, d, f", [(GGMLType.Q4_0, 256, 384), (GGMLType.Q6_K, 512, 256), (GGMLType.Q4_1, 256, 2304),
                                     (GGMLType.Q4_0, 2048, 2304)])
def test_a_reader_with_rstd_gives_the_gemv_of_the_normed_row(t, d, f, device, gen, check):
    """The attention output's GEMV writes h * w_n and the tiles' squares; the FFN's gate+up (SwiGLU), a
    q+k+v (RoPE, bias) and a plain GEMV after it read that with rstd: each equals its GEMV of
    RMSNorm(h) * w_n in float64. The last case's readers split K (2304 x 2048: the last of a row
    tile's programs to arrive divides the sum)."""
    h, w_n, _, xn, ss = _add_norm_case(t, d, d, device, gen, check)
    xr = _rmsnormed(h, w_n)
    rstd = (ss, EPS)
    raw, w = _weight(t, f, d, gen)
    y = w @ xr
    out = check.poisoned((1, f), torch.float32, device)
    if d == 2048:
        assert gemv_default_config(f, d, t).split > 1 and repack_swiglu(raw, f, d, t).config.split > 1
    if t == GGMLType.Q4_0:
        q4_0_gemv(xn, repack_gemv(raw.to(device), f, d, t), f, d, out=out, rstd=rstd)
    elif t == GGMLType.Q6_K:
        planes_gemv(xn, raw.to(device), f, d, t, out=out, rstd=rstd)
    else:
        from minfer.kernels.triton.int4 import int4_gemv

        int4_gemv(xn, raw.to(device), f, d, t, out=out, rstd=rstd)
    assert check.rel_err(out, y[None, :]) < 1e-5
    glu = check.poisoned((1, f // 2), torch.float32, device)
    gemv_swiglu(xn, raw.to(device), f, d, t, out=glu, rstd=rstd)
    assert check.rel_err(glu, (torch.nn.functional.silu(y[: f // 2]) * y[f // 2:])[None, :]) < 1e-5
    hd, n_rot = 32, 32
    n_heads = f // hd - 2
    b = torch.randn(f, generator=gen)
    cos, sin = _tables(16, n_rot // 2)
    rot = check.poisoned((1, f), torch.float32, device)
    pos = torch.tensor([5], dtype=torch.int32, device=device)
    gemv_rope(xn, raw.to(device), b.to(device), pos, cos.to(device), sin.to(device), f, d, t, n_heads, hd, n_rot,
              True, out=rot, rstd=rstd)
    assert check.rel_err(rot, _rope64(y + b.double(), 5, cos, sin, n_heads, hd, n_rot, True)[None, :]) < 1e-5


def test_a_lookup_type_reader_with_rstd(device, gen, check):
    h, w_n, _, xn, ss = _add_norm_case(GGMLType.IQ4_XS, 256, 256, device, gen, check)
    raw, w = _weight(GGMLType.IQ4_XS, 128, 256, gen)
    out = check.poisoned((1, 128), torch.float32, device)
    lut4_gemv(xn, raw.to(device), 128, 256, GGMLType.IQ4_XS, out=out, rstd=(ss, EPS))
    assert check.rel_err(out, (w @ _rmsnormed(h, w_n))[None, :]) < 1e-5


def test_rstd_is_one_row_and_checked(device, gen):
    t, n, k = GGMLType.Q4_0, 64, 256
    raw, _ = _weight(t, n, k, gen)
    ss = torch.ones(4, device=device)
    with pytest.raises(UnsupportedError, match="one row"):
        q4_0_gemv(torch.randn(2, k, device=device), raw.to(device), n, k, rstd=(ss, EPS))
    with pytest.raises(UnsupportedError, match="eps"):
        q4_0_gemv(torch.randn(k, device=device), raw.to(device), n, k, rstd=(ss, -1.0))
    with pytest.raises(UnsupportedError, match="rstd"):
        q4_0_gemv(torch.randn(k, device=device), raw.to(device), n, k, rstd=ss)
    with pytest.raises(UnsupportedError, match="res must hold"):
        gemv_add_norm(torch.randn(k, device=device), raw.to(device), torch.zeros(n + 1, device=device),
                      torch.ones(n, device=device), n, k, t)
