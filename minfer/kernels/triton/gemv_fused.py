"""Decode GEMVs with the node after them fused into their store (epilogue fusion): one kernel
where a decode row ran two or three, and one pass over the output instead of three.

    gemv_swiglu: out [1, f]  = silu(y[:f]) * y[f:],  y = x @ W^T,  W the stacked gate+up [2f, k]
    gemv_geglu:  out [1, f]  = gelu_tanh(y[:f]) * y[f:] (gemma's feed-forward; the SwiGLU layout)
    gemv_rope:   out [1, n]  = RoPE(y + b) on the first n_heads * head_dim columns, y + b on the
                 rest,  y = x @ W^T,  W the stacked q+k+v [n, k] (b zero for models without bias)
    gemv_add_norm: h = res + x @ W^T over res, out [1, n] = h * w_n and each row tile's sum of h^2:
                 a deferred RMSNorm, which the GEMVs after it finish (`rstd=`: their sums divided by
                 h's rms before their store); W in its plain GEMV layout (the copy the GEMV reads)

The deferred norm removes the norm's kernel and its grid-wide wait from a decode row (the attention
output -> AddRMSNorm -> gate+up chain, and down -> AddRMSNorm -> q+k+v): no program waits for another,
where stop 49's last-arriver tails (the last program finishing the row's norm) measured slower. Its
value is not RMSNorm(h) until a reader divides: the compiler runs it only where every reader takes
rstd (backends/compile.py `rstd_link`). H100, bench/studies/deferred_norm.py: the GEMV chains of a
SmolLM2 step 392 -> 350 us, Qwen2.5-0.5B 445 -> 419 us.

Both run gemv.py's GEMV kernel unchanged up to its store (its tile, K loop, split K and every
weight type it reads: Q4_0, Q4_1, Q4_K, Q8_0, Q5_0, Q5_1, Q5_K, Q6_K, Q3_K, Q2_K; the lookup types IQ4_NL,
IQ4_XS, MXFP4 run too, tests/kernels/triton/test_gemv_fused.py, but their contracts do not list them yet: their
conformance cases would cost CI ~80 s of interpreter time), on the weight
with its rows permuted once at load so that the two values the epilogue combines sit in one
program: a program's tile of BLOCK_N rows holds BLOCK_N / 2 pairs, pair l being its rows l and
l + BLOCK_N / 2 (`_gemv_store`). For SwiGLU, pair j is (gate row j, up row j) and tile t holds
pairs t * BLOCK_N / 2 ...; the output column of pair j is j. For RoPE, the pairs are the two
elements one rotation mixes (neox: i and i + n_rot / 2 of a head; normal: 2i and 2i + 1) with
their frequency index; unrotated columns (v, a head's dims past n_rot) pair up with identity;
a table gives each permuted row its output column, another each pair's frequency.

Every row's sum is the one the plain GEMV computes for that row (same config, same order), so
the fused output equals the unfused GEMV + SwiGLU / bias + RoPE kernels up to the epilogue's own
f32 rounding. The layout depends on the config's BLOCK_N, so the packed weight carries its config.
n must be a multiple of BLOCK_N (a whole number of pair tiles).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import UnsupportedError
from ...quant.types import GGMLType
from ._common import check_device, check_tensor, make_out
from .gemv import ACT_Q8_PASSES, add_norm_epilogue, gemv_operands, glu_epilogue, tiles_of
from .qmatmul import (
    GemvConfig,
    GemvPacked,
    gemv_default_config,
    gemv_type,
    launch_packed,
    packed_gemv,
    repack_gemv,
)

EPI_SWIGLU, EPI_ROPE, EPI_ROPE_KV, EPI_GEGLU = 1, 2, 3, 4


@dataclass(frozen=True)
class PairPacked:
    """A weight in a pair layout: its rows permuted (`perm[j]`: the original row of row j) and
    repacked in its type's GEMV layout; `config` the launch config the layout was cut for. RoPE
    layouts: `dst` int32 [n] (each permuted row's output column), `fi` int32 [n / 2] (each pair's
    frequency index, -1 for none) and `rope` = (n_heads, head_dim, n_rot, neox)."""

    inner: GemvPacked
    qtype: GGMLType
    n: int
    k: int
    config: GemvConfig
    dst: torch.Tensor | None = None
    fi: torch.Tensor | None = None
    rope: tuple | None = None


def _check_tiles(what: str, n: int, cfg: GemvConfig) -> None:
    if n % cfg.block_n:
        raise UnsupportedError(f"{what}: n = {n} rows must be a multiple of the GEMV tile's {cfg.block_n} rows")


def swiglu_perm(n: int, block_n: int) -> torch.Tensor:
    """Row j of the SwiGLU layout <- original row perm[j] (gate rows 0..f-1, up rows f..2f-1)."""
    f, h = n // 2, block_n // 2
    t = torch.arange(n // block_n)[:, None]
    l = torch.arange(h)[None, :]
    return torch.cat([t * h + l, f + t * h + l], dim=1).reshape(-1)


def rope_pairs(n: int, n_heads: int, head_dim: int, n_rot: int, neox: bool) -> tuple[torch.Tensor, torch.Tensor,
                                                                                        torch.Tensor]:
    """(first, second, frequency) of every pair of the n columns: the rotated pairs of the first
    n_heads heads, then the remaining columns two by two (frequency -1)."""
    half = n_rot // 2
    i = torch.arange(half)
    ia, ib = (i, i + half) if neox else (2 * i, 2 * i + 1)
    heads = torch.arange(n_heads)[:, None] * head_dim
    first, second, freq = [(heads + ia).reshape(-1)], [(heads + ib).reshape(-1)], [i.repeat(n_heads)]
    rotated = torch.zeros(n, dtype=torch.bool)
    rotated[first[0]] = True
    rotated[second[0]] = True
    rest = torch.nonzero(~rotated).reshape(-1)
    first.append(rest[0::2])
    second.append(rest[1::2])
    freq.append(torch.full((rest.numel() // 2,), -1))
    return torch.cat(first), torch.cat(second), torch.cat(freq)


def rope_perm(n: int, n_heads: int, head_dim: int, n_rot: int, neox: bool, block_n: int):
    """(perm, frequency per pair) of the RoPE layout: tile t's rows are the first elements of
    pairs t * block_n / 2 ..., then their second elements."""
    a, b, f = rope_pairs(n, n_heads, head_dim, n_rot, neox)
    h = block_n // 2
    perm = torch.cat([a.view(-1, h), b.view(-1, h)], dim=1).reshape(-1)
    return perm, f


def _check_rope(what: str, n: int, n_heads: int, head_dim: int, n_rot: int) -> None:
    if n % 2 or head_dim % 2 or n_rot % 2 or not 0 < n_rot <= head_dim or n_heads < 1 or n_heads * head_dim > n:
        raise UnsupportedError(f"{what}: RoPE of {n_heads} heads x {head_dim} (n_rot {n_rot}) does not fit "
                               f"{n} columns (even sizes, n_rot <= head_dim)")


def _permuted(raw: torch.Tensor, n: int, perm: torch.Tensor) -> torch.Tensor:
    rows = raw.reshape(n, -1)
    return rows.index_select(0, perm.to(rows.device)).contiguous()


def repack_swiglu(raw: torch.Tensor, n: int, k: int, qtype: GGMLType | int | str,
                  act_q8: int = ACT_Q8_PASSES) -> PairPacked:
    """Raw GGUF bytes of a stacked gate+up [n, k] weight -> its SwiGLU pair layout (its GEMV
    config: the type's default with `act_q8` int8 activation passes where it takes them)."""
    what = "repack_swiglu"
    t = gemv_type(what, qtype)
    check_tensor(what, "raw", raw, (torch.uint8,))
    cfg = gemv_default_config(n, k, t, act_q8)
    _check_tiles(what, n, cfg)
    inner = repack_gemv(_permuted(raw, n, swiglu_perm(n, cfg.block_n)), n, k, t, act_q8)
    return PairPacked(inner, t, n, k, cfg)


def repack_rope(raw: torch.Tensor, n: int, k: int, qtype: GGMLType | int | str, n_heads: int, head_dim: int,
                n_rot: int, neox: bool, act_q8: int = ACT_Q8_PASSES) -> PairPacked:
    """Raw GGUF bytes of a stacked q+k+v [n, k] weight -> its RoPE pair layout for rotating the
    first n_heads heads of head_dim columns (n_rot of them, neox or normal pairs); `act_q8` as
    for repack_swiglu."""
    what = "repack_rope"
    t = gemv_type(what, qtype)
    check_tensor(what, "raw", raw, (torch.uint8,))
    _check_rope(what, n, n_heads, head_dim, n_rot)
    cfg = gemv_default_config(n, k, t, act_q8)
    _check_tiles(what, n, cfg)
    perm, freq = rope_perm(n, n_heads, head_dim, n_rot, bool(neox), cfg.block_n)
    inner = repack_gemv(_permuted(raw, n, perm), n, k, t, act_q8)
    dev = raw.device
    return PairPacked(inner, t, n, k, cfg, perm.to(torch.int32).to(dev), freq.to(torch.int32).to(dev),
                      (n_heads, head_dim, n_rot, bool(neox)))


def _check_x(what: str, x: torch.Tensor, k: int) -> None:
    check_tensor(what, "x", x, (torch.float32,), ndim=(1, 2))
    if x.numel() != k or (x.dim() == 2 and x.shape[0] != 1):
        raise UnsupportedError(f"{what}: x must be [{k}] or [1, {k}] (M == 1), got {tuple(x.shape)}")


def _check_packed(what: str, w: PairPacked, n: int, k: int, t: GGMLType) -> None:
    if (w.n, w.k, w.qtype) != (n, k, t):
        raise UnsupportedError(f"{what}: w is a {w.qtype.name} [{w.n}, {w.k}] pair layout, the call says {t.name} "
                               f"[{n}, {k}]")


def gemv_swiglu(x: torch.Tensor, w: PairPacked | torch.Tensor, n: int, k: int, qtype: GGMLType | int | str,
                out: torch.Tensor | None = None, *, xq: tuple | None = None,
                rstd: tuple | None = None) -> torch.Tensor:
    """out [1, n / 2] f32 = silu(x @ Wg^T) * (x @ Wu^T) for one token, W the stacked gate+up
    [n, k] weight: a PairPacked from repack_swiglu, or raw GGUF bytes (laid out per call); `xq`:
    x's int8 form made before the call (q4_0.q4_0_gemv); `rstd`: x is a deferred RMSNorm's h * w
    (gemv_add_norm), the sums divided by h's rms before the SwiGLU (q4_0.q4_0_gemv)."""
    return _gemv_glu("gemv_swiglu", EPI_SWIGLU, x, w, n, k, qtype, out, xq, rstd)


def gemv_geglu(x: torch.Tensor, w: PairPacked | torch.Tensor, n: int, k: int, qtype: GGMLType | int | str,
               out: torch.Tensor | None = None, *, xq: tuple | None = None,
               rstd: tuple | None = None) -> torch.Tensor:
    """out [1, n / 2] f32 = gelu_tanh(x @ Wg^T) * (x @ Wu^T) (gemma's feed-forward), W in the
    SwiGLU pair layout (repack_swiglu); as gemv_swiglu."""
    return _gemv_glu("gemv_geglu", EPI_GEGLU, x, w, n, k, qtype, out, xq, rstd)


def _gemv_glu(what: str, epi: int, x, w, n, k, qtype, out, xq, rstd) -> torch.Tensor:
    t = gemv_type(what, qtype)
    if not isinstance(w, PairPacked):
        w = repack_swiglu(w, n, k, t)
    elif w.rope is not None:
        raise UnsupportedError(f"{what}: w is a RoPE pair layout (repack_rope), not a SwiGLU one")
    _check_packed(what, w, n, k, t)
    _check_x(what, x, k)
    device = check_device(what, x=x, qs=w.inner.qs, out=out)
    out = make_out(what, out, (1, n // 2), torch.float32, device)
    launch_packed(what, x, w.inner, out, w.config, glu_epilogue(epi, out, w.inner.qs), xq, rstd=rstd)
    return out


def gemv_rope(x: torch.Tensor, w: PairPacked | torch.Tensor, b: torch.Tensor, positions: torch.Tensor,
              cos: torch.Tensor, sin: torch.Tensor, n: int, k: int, qtype: GGMLType | int | str, n_heads: int,
              head_dim: int, n_rot: int, neox: bool, out: torch.Tensor | None = None, *,
              cache_k: torch.Tensor | None = None, cache_v: torch.Tensor | None = None,
              row_slots: torch.Tensor | None = None, layer: int = 0, n_head_kv: int = 0,
              xq: tuple | None = None, rstd: tuple | None = None) -> torch.Tensor:
    """out [1, n] f32 = x @ W^T + b for one token, its first n_heads heads rotated by RoPE at
    positions[0] (cos / sin f32 [n_ctx, n_rot / 2] tables); W a PairPacked from repack_rope with
    the same RoPE settings, or raw GGUF bytes (laid out per call).

    With `cache_k` / `cache_v` (f16 [layers, slots, n_head_kv, n_ctx, head_dim]) the row's keys
    (the last n_head_kv of the rotated heads) and values (the n_head_kv heads after them) are also
    written into the cache at (layer, row_slots[0], positions[0]): the KV write of the attention
    after it (`attention_rows(..., kv_written=True)` then skips its own). `xq`: x's int8 form made
    before the call (q4_0.q4_0_gemv); `rstd`: x is a deferred RMSNorm's h * w (gemv_add_norm), the
    sums divided by h's rms before the bias and the rotation."""
    what = "gemv_rope"
    t = gemv_type(what, qtype)
    rope = (n_heads, head_dim, n_rot, bool(neox))
    if not isinstance(w, PairPacked):
        w = repack_rope(w, n, k, t, *rope)
    elif w.rope != rope:
        raise UnsupportedError(f"{what}: w's pair layout was made for RoPE {w.rope}, the call says {rope}")
    _check_packed(what, w, n, k, t)
    _check_x(what, x, k)
    check_tensor(what, "b", b, (torch.float32,), ndim=(1,))
    if b.numel() != n:
        raise UnsupportedError(f"{what}: b must have n = {n} values, got {b.numel()}")
    check_tensor(what, "positions", positions, (torch.int32,), ndim=(1,))
    if positions.numel() != 1:
        raise UnsupportedError(f"{what}: one position (M == 1), got {positions.numel()}")
    half = n_rot // 2
    for name, table in (("cos", cos), ("sin", sin)):
        check_tensor(what, name, table, (torch.float32,), ndim=(2,))
        if table.shape[1] != half:
            raise UnsupportedError(f"{what}: {name} must be [n_ctx, {half}], got {tuple(table.shape)}")
    device = check_device(what, x=x, qs=w.inner.qs, b=b, positions=positions, cos=cos, sin=sin, out=out)
    out = make_out(what, out, (1, n), torch.float32, device)
    if cache_k is None:
        c = w.dst
        launch_packed(what, x, w.inner, out, w.config, (EPI_ROPE, b, w.dst, w.fi, cos, sin, positions, half, out, out,
                                                        c, 0, 0, 1, 0, 0, 0), xq, rstd=rstd)
        return out
    kstart = (n_heads - n_head_kv) * head_dim
    vstart = n_heads * head_dim
    if n_head_kv < 1 or n_heads <= n_head_kv or vstart + n_head_kv * head_dim != n:
        raise UnsupportedError(f"{what}: {n_head_kv} kv heads of {head_dim} after {n_heads - n_head_kv} q heads do not "
                               f"make the {n} columns of q+k+v")
    for name, t in (("cache_k", cache_k), ("cache_v", cache_v)):
        check_tensor(what, name, t, (torch.float16,), ndim=(5,))
    layers, slots, nkv, n_ctx, hd = cache_k.shape
    if cache_v.shape != cache_k.shape or (nkv, hd) != (n_head_kv, head_dim) or not 0 <= layer < layers:
        raise UnsupportedError(f"{what}: caches {tuple(cache_k.shape)} / {tuple(cache_v.shape)} do not hold layer "
                               f"{layer} of {n_head_kv} heads x {head_dim}")
    check_tensor(what, "row_slots", row_slots, (torch.int32,), ndim=(1,))
    check_device(what, x=x, cache_k=cache_k, cache_v=cache_v, row_slots=row_slots)
    launch_packed(what, x, w.inner, out, w.config,
                  (EPI_ROPE_KV, b, w.dst, w.fi, cos, sin, positions, half, cache_k, cache_v, row_slots, kstart, vstart,
                   hd, layer * slots * nkv * n_ctx * hd, nkv * n_ctx * hd, n_ctx * hd), xq, rstd=rstd)
    return out


def add_norm_sums(n: int, k: int, qtype: GGMLType | int | str) -> int:
    """The sums of squares gemv_add_norm writes for an [n, k] weight of `qtype` (its row tiles)."""
    t = gemv_type("add_norm_sums", qtype)
    return tiles_of(n, gemv_default_config(n, k, t))


def gemv_add_norm(x: torch.Tensor, w: GemvPacked | torch.Tensor, res: torch.Tensor, w_n: torch.Tensor, n: int,
                  k: int, qtype: GGMLType | int | str, out: torch.Tensor | None = None, *,
                  ss: torch.Tensor | None = None, config: GemvConfig | dict | None = None) -> torch.Tensor:
    """A deferred RMSNorm's writer half, for one token: h = res + x @ W^T is stored over res (the
    residual, f32 [n] or [1, n], updated in place), out [1, n] f32 = h * w_n (the norm's numerator),
    and `ss` f32 [add_norm_sums(n, k, qtype)] gets each row tile's sum of h^2 (made when None). The
    GEMV after it reads out as x with rstd=(ss, eps) (q4_0.q4_0_gemv and the fused GEMVs): its
    sums are then those of RMSNorm(h) * w_n, the norm's one-program-a-row kernel and its grid wait
    gone. W an [n, k] weight of any GEMV type in its plain GEMV layout (`repack_gemv`: the copy the
    GEMV and the prompt matmuls read) or raw GGUF bytes; x f32 (the compiler runs it only where its
    GEMV reads x as f32, so it writes no int8 records of it and reads none); `config` a
    GemvConfig (or its fields) instead of the type's default (tests: ss then has its tiles)."""
    what = "gemv_add_norm"
    t = gemv_type(what, qtype)
    w = packed_gemv(what, w, n, k, t)
    _check_x(what, x, k)
    out, cfg = gemv_operands(what, x, w.d, n, k, out, config,
                             lambda: gemv_default_config(n, k, t, getattr(w, "act_q8", 0)))
    for name, v in (("res", res), ("w_n", w_n)):
        check_tensor(what, name, v, (torch.float32,), ndim=(1, 2) if name == "res" else (1,))
        if v.numel() != n:
            raise UnsupportedError(f"{what}: {name} must hold n = {n} values, got {tuple(v.shape)}")
    if not res.is_contiguous():
        raise UnsupportedError(f"{what}: res must be contiguous (h is written over it)")
    device = check_device(what, x=x, qs=w.d, res=res, w_n=w_n, out=out, ss=ss)
    ss = make_out(what, ss, (tiles_of(n, cfg),), torch.float32, device)
    launch_packed(what, x, w, out, cfg, add_norm_epilogue(res, w_n, ss, out, out.view(torch.int32)))
    return out
