"""Attention over the KV cache: write each row's k/v, then causal GQA attention of its q.

The cache is the backend's: k and v each [layers, slots, kv_heads, n_ctx, head_dim] f16. A batch
row carries its slot and position on the device (`row_slots`, `positions`), so the kernels need
no host data and replay in a CUDA graph: row r writes its k/v at (slot_r, position_r) and attends
positions 0..position_r of slot_r. Decode rows, a batch of them, and a prompt chunk all fit this
form (a chunk's rows are consecutive positions of one slot).

`attention_rows` (flash-decoding, Dao et al. 2023): programs (row, kv head, split) walk BLOCK_N
keys at a time over their split of 0..position; the query heads of one kv head (the GQA group)
are one [G, head_dim] tile padded to 16 rows, so q.K^T and p.V are tensor-core dots on f16
inputs with f32 accumulation and an online softmax in f32. With more than one split, a second
kernel combines the splits' partial sums by log-sum-exp; with one split the first kernel writes
the output itself. The split count comes from the cache's n_ctx (a graph's grid is fixed), and
splits past a row's position exit at once.

`attention_prefill` (flash-attention 2, Dao 2023, over the cache): prompt chunks. The rows come
as spans (consecutive positions of one slot), cut into tiles of up to BLOCK_M rows by
`prefill_tiles`; a program (tile, query head) loads its [BLOCK_M, head_dim] queries once and
walks the slot's keys 0..its last position BLOCK_N at a time (causal mask inside the tile), so a
chunk of n rows reads its keys n / BLOCK_M times instead of n times. The tile table is an int32
device tensor [tiles, 4] (first row, slot, first position, rows; rows 0 = an unused tile), so a
step of every span in one launch replays in a CUDA graph; without one the launcher builds it
from the slots and positions on the host.

Q8_0 cache (`--kv-cache q8_0`, the `*_q8` launchers): int8 [layers, slots, kv_heads, n_ctx,
head_dim + head_dim / 16], each position's row its head_dim int8 codes, then one f16 scale per
32 of them (little-endian bytes): seed 004's Q8_0 values (d = max|x| / 127, codes rounded half
away from zero, as kernels/triton/quantize.py), laid out so a row's codes load as one run and a key
tile dequantizes with one multiply. 1.06 bytes per element instead of 2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import UnsupportedError
from ._common import (
    cdiv,
    check_device,
    check_grid,
    check_int,
    check_tensor,
    make_out,
    pdl_args,
    release_late,
    release_next,
    rows_view,
    tanh,
    wait_prior,
)

SPLIT_LEN = 512  # keys per split: one split (no combine kernel) for contexts up to 512
BLOCK_N = 64  # keys per inner step (32 for head_dim > 64: the tile then fits the registers, sm_90 compile check)
MAX_SPLITS = 64
PREFILL_BLOCK_M = 64  # query rows per prefill tile


@triton.jit
def _store_q8_row(x, ptr, row, d, m, HD, BLOCK_D: tl.constexpr):
    """One cache row in the Q8_0 layout: the codes of x [BLOCK_D] (0 past HD) at row + d, then
    the f16 scale of every 32 of them at row + HD + 2 b."""
    NB: tl.constexpr = BLOCK_D // 32
    xb = tl.reshape(x, [NB, 32])
    dsc = tl.math.div_rn(tl.max(tl.abs(xb), axis=1), 127.0)
    inv = tl.where(dsc == 0.0, 0.0, tl.math.div_rn(tl.full(dsc.shape, 1.0, tl.float32), dsc))
    v = xb * inv[:, None]
    whole = v.to(tl.int32)  # truncates toward zero; + trunc(2 frac): round half away from zero
    q = tl.reshape(whole + ((v - whole.to(tl.float32)) * 2.0).to(tl.int32), [BLOCK_D])
    tl.store(ptr + row + d, q.to(tl.int8), mask=m)
    b = tl.arange(0, NB)
    tl.store((ptr + row + HD).to(tl.pointer_type(tl.float16)) + b, dsc.to(tl.float16), mask=b * 32 < HD)


@triton.jit
def _kv_write_kernel(k_ptr, v_ptr, ck_ptr, cv_ptr, slot_ptr, pos_ptr, stride_k, stride_v, layer_off,
                     S_STRIDE, H_STRIDE, HD, RS, BLOCK_D: tl.constexpr, Q8: tl.constexpr, PDL: tl.constexpr):
    release_next(PDL)
    wait_prior(PDL)
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    p = tl.load(pos_ptr + row).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    m = d < HD
    base = layer_off + slot * S_STRIDE + head * H_STRIDE + p * RS
    k = tl.load(k_ptr + row * stride_k + head * HD + d, mask=m, other=0.0)
    v = tl.load(v_ptr + row * stride_v + head * HD + d, mask=m, other=0.0)
    release_late(PDL)
    if Q8:
        _store_q8_row(k, ck_ptr, base, d, m, HD, BLOCK_D)
        _store_q8_row(v, cv_ptr, base, d, m, HD, BLOCK_D)
    else:
        tl.store(ck_ptr + base + d, k.to(ck_ptr.dtype.element_ty), mask=m)
        tl.store(cv_ptr + base + d, v.to(cv_ptr.dtype.element_ty), mask=m)


@triton.jit
def _load_kv(ptr, rows, d, mask, HD, Q8: tl.constexpr):
    """A [BLOCK_N, BLOCK_D] f16 tile of cached keys or values at row offsets `rows` [BLOCK_N, 1]."""
    if Q8:
        codes = tl.load(ptr + rows + d[None, :], mask=mask, other=0)
        scales = tl.load((ptr + rows + HD).to(tl.pointer_type(tl.float16)) + (d // 32)[None, :], mask=mask,
                         other=0.0)
        return (codes.to(tl.float32) * scales.to(tl.float32)).to(tl.float16)
    else:
        return tl.load(ptr + rows + d[None, :], mask=mask, other=0.0)


@triton.jit
def _softmax_step(q, ck_ptr, cv_ptr, kv_rows, d, kv_m, keep, m_i, l_i, acc, HD, softcap, Q8: tl.constexpr,
                  CAP: tl.constexpr):
    """One key tile of flash attention (both kernels' loop body): scores q . k of the tile's keys
    (kv_rows, masked by kv_m; `keep` [rows or 1, keys] the scores that count, -inf elsewhere), with
    CAP soft-capped to softcap * tanh(s / softcap), the running max m_i and sum l_i rescaled, p . v
    added to acc; returns (m_i, l_i, acc)."""
    k = _load_kv(ck_ptr, kv_rows, d, kv_m, HD, Q8)
    s = tl.dot(q, tl.trans(k))
    if CAP:
        s = softcap * tanh(s / softcap)
    s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # a row that has seen no key yet (a window starts past this tile) keeps m -inf: shift by 0 there
    m_use = tl.where(m_new > float("-inf"), m_new, 0.0)
    alpha = tl.exp(m_i - m_use)
    p = tl.exp(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = _load_kv(cv_ptr, kv_rows, d, kv_m, HD, Q8)
    return m_new, l_i, acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)


@triton.jit
def _add_sink(sink_ptr, heads, hm, m_i, l_i, acc):
    """The heads' learned sink logits (gpt-oss; ggml_soft_max_add_sinks) joined to a finished online
    softmax: the max becomes max(m, sink), the sum gains exp(sink - max), no value is added."""
    sk = tl.load(sink_ptr + heads, mask=hm, other=0.0)
    m_f = tl.maximum(m_i, sk)
    c = tl.exp(m_i - m_f)  # (m -inf, a row that saw no key: c 0)
    return m_f, l_i * c + tl.exp(sk - m_f), acc * c[:, None]


@triton.jit
def _attn_rows_kernel(q_ptr, ck_ptr, cv_ptr, slot_ptr, pos_ptr, out_ptr, po_ptr, pml_ptr, sink_ptr, stride_q,
                      layer_off, S_STRIDE, H_STRIDE, scale, G, N_HEAD, HD, RS, SPLIT_LEN, NSPLIT, window, softcap,
                      GP: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                      Q8: tl.constexpr, CAP: tl.constexpr, SINK: tl.constexpr, PDL: tl.constexpr):
    release_next(PDL)
    wait_prior(PDL)
    row = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    last = tl.load(pos_ptr + row)  # attends keys 0..last (last - window + 1..last with a window)
    first = tl.where(window > 0, tl.maximum(last - window + 1, 0), 0)
    lo = tl.maximum(sp * SPLIT_LEN, first)  # a split wholly before the window stays empty (m -inf, l 0)
    hi = tl.minimum(sp * SPLIT_LEN + SPLIT_LEN, last + 1)
    g = tl.arange(0, GP)
    d = tl.arange(0, BLOCK_D)
    gm = g < G
    dm = d < HD
    heads = kvh * G + g
    q = tl.load(q_ptr + row * stride_q + heads[:, None] * HD + d[None, :], mask=gm[:, None] & dm[None, :],
                other=0.0)
    q = (q.to(tl.float32) * scale).to(tl.float16)
    base = layer_off + slot * S_STRIDE + kvh.to(tl.int64) * H_STRIDE
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        nm = n < hi
        kv_rows = base + n.to(tl.int64)[:, None] * RS
        kv_m = nm[:, None] & dm[None, :]
        m_i, l_i, acc = _softmax_step(q, ck_ptr, cv_ptr, kv_rows, d, kv_m, nm[None, :], m_i, l_i, acc, HD, softcap,
                                      Q8, CAP)
    release_late(PDL)
    if SPLIT:  # partial sums and (max, sum) per split; the combine kernel finishes
        part = (row * N_HEAD + heads).to(tl.int64) * NSPLIT + sp
        tl.store(po_ptr + part[:, None] * HD + d[None, :], acc, mask=gm[:, None] & dm[None, :])
        tl.store(pml_ptr + part * 2, m_i, mask=gm)
        tl.store(pml_ptr + part * 2 + 1, l_i, mask=gm)
    else:
        if SINK:
            m_i, l_i, acc = _add_sink(sink_ptr, heads, gm, m_i, l_i, acc)
        o = acc / l_i[:, None]
        tl.store(out_ptr + row * N_HEAD * HD + heads[:, None] * HD + d[None, :], o, mask=gm[:, None] & dm[None, :])


@triton.jit
def _attn_combine_kernel(po_ptr, pml_ptr, out_ptr, sink_ptr, N_HEAD, HD, NSPLIT, SP: tl.constexpr,
                         BLOCK_D: tl.constexpr, SINK: tl.constexpr, PDL: tl.constexpr):
    release_next(PDL)
    wait_prior(PDL)
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    s = tl.arange(0, SP)
    sm = s < NSPLIT
    d = tl.arange(0, BLOCK_D)
    dm = d < HD
    part = (row * N_HEAD + head) * NSPLIT + s
    m = tl.load(pml_ptr + part * 2, mask=sm, other=float("-inf"))
    l_s = tl.load(pml_ptr + part * 2 + 1, mask=sm, other=0.0)
    mx = tl.max(m, axis=0)  # finite: the split of the row's own position holds a key
    if SINK:  # the head's sink logit joins the max and the denominator (no value)
        sk = tl.load(sink_ptr + head)
        mx = tl.maximum(mx, sk)
    w = tl.where(m > float("-inf"), tl.exp(m - mx), 0.0)  # empty splits (before a window) weigh nothing
    o = tl.load(po_ptr + part[:, None] * HD + d[None, :], mask=sm[:, None] & dm[None, :], other=0.0)
    num = tl.sum(o * w[:, None], axis=0)
    den = tl.sum(l_s * w, axis=0)
    if SINK:
        den += tl.exp(sk - mx)
    release_late(PDL)
    tl.store(out_ptr + row * N_HEAD * HD + head * HD + d, num / den, mask=dm)


@triton.jit
def _attn_prefill_kernel(q_ptr, ck_ptr, cv_ptr, tiles_ptr, out_ptr, sink_ptr, stride_q, layer_off, S_STRIDE,
                         H_STRIDE, scale, G, N_HEAD, HD, RS, window, softcap, BLOCK_M: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, Q8: tl.constexpr, CAP: tl.constexpr,
                         SINK: tl.constexpr, PDL: tl.constexpr):
    release_next(PDL)
    wait_prior(PDL)
    t = tl.program_id(0)
    head = tl.program_id(1)
    row0 = tl.load(tiles_ptr + t * 4).to(tl.int64)
    slot = tl.load(tiles_ptr + t * 4 + 1).to(tl.int64)
    start = tl.load(tiles_ptr + t * 4 + 2)
    n = tl.load(tiles_ptr + t * 4 + 3)  # 0: an unused tile (its loop is empty, its stores masked)
    m = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    mm = m < n
    dm = d < HD
    qpos = start + m
    rows = row0 + m.to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * stride_q + head * HD + d[None, :], mask=mm[:, None] & dm[None, :], other=0.0)
    q = (q.to(tl.float32) * scale).to(tl.float16)
    base = layer_off + slot * S_STRIDE + (head // G).to(tl.int64) * H_STRIDE
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    hi = tl.where(n > 0, start + n, 0)  # keys 0..the tile's last position
    # with a window: from the first key the tile's first query sees, in whole key tiles
    lo = tl.where(window > 0, (tl.maximum(start - window + 1, 0) // BLOCK_N) * BLOCK_N, 0)
    for k0 in range(lo, hi, BLOCK_N):
        kk = k0 + tl.arange(0, BLOCK_N)
        km = kk < hi
        kv_rows = base + kk.to(tl.int64)[:, None] * RS
        kv_m = km[:, None] & dm[None, :]
        causal = km[None, :] & (kk[None, :] <= qpos[:, None]) & ((window <= 0) | (qpos[:, None] - kk[None, :] < window))
        m_i, l_i, acc = _softmax_step(q, ck_ptr, cv_ptr, kv_rows, d, kv_m, causal, m_i, l_i, acc, HD, softcap,
                                      Q8, CAP)
    release_late(PDL)
    if SINK:
        m_i, l_i, acc = _add_sink(sink_ptr, tl.full([BLOCK_M], 0, tl.int32) + head, mm, m_i, l_i, acc)
    o = acc / tl.where(mm, l_i, 1.0)[:, None]  # (a row of the tile holds key 0 at least: l_i > 0)
    tl.store(out_ptr + rows[:, None] * (N_HEAD * HD) + head * HD + d[None, :], o, mask=mm[:, None] & dm[None, :])


def q8_row_bytes(head_dim: int) -> int:
    """Bytes of one position's row of one head in the Q8_0 cache: the codes, then f16 scales."""
    return head_dim + head_dim // 16


def check_cache(what: str, cache_k: torch.Tensor, cache_v: torch.Tensor, layer: int, n_head_kv: int,
                head_dim: int) -> tuple[int, ...]:
    """[layers, slots, kv heads, n_ctx, head_dim] of the cache (f16/bf16/f32, or the int8 Q8_0
    layout whose rows are q8_row_bytes(head_dim) wide)."""
    for name, c in (("cache_k", cache_k), ("cache_v", cache_v)):
        check_tensor(what, name, c, (torch.float16, torch.bfloat16, torch.float32, torch.int8), ndim=5)
    if cache_k.shape != cache_v.shape or cache_k.dtype != cache_v.dtype:
        raise UnsupportedError(f"{what}: cache_k and cache_v differ: {tuple(cache_k.shape)} {cache_k.dtype} vs "
                               f"{tuple(cache_v.shape)} {cache_v.dtype}")
    n_layer, n_slots, nkv, n_ctx, width = cache_k.shape
    q8 = cache_k.dtype == torch.int8
    if q8 and head_dim % 32:
        raise UnsupportedError(f"{what}: a Q8_0 cache needs head_dim a multiple of 32, got {head_dim}")
    want = q8_row_bytes(head_dim) if q8 else head_dim
    if (nkv, width) != (n_head_kv, want):
        raise UnsupportedError(f"{what}: the cache holds {nkv} kv heads of row width {width}, the call needs "
                               f"{n_head_kv} of {want}")
    if not 0 <= layer < n_layer:
        raise UnsupportedError(f"{what}: layer {layer} outside the cache's 0..{n_layer - 1}")
    return (n_layer, n_slots, nkv, n_ctx, head_dim)


def check_attention_call(what, q, k, v, cache_k, cache_v, row_slots, positions, layer, n_head, n_head_kv, head_dim,
                         cache_dtype: torch.dtype | None = None):
    """The call's q/k/v row views, the cache's shape and the device; typed errors for anything
    else (`cache_dtype`: the one cache dtype the kernel reads)."""
    for name, val in (("n_head", n_head), ("n_head_kv", n_head_kv), ("head_dim", head_dim), ("layer", layer)):
        check_int(what, name, val, 0 if name == "layer" else 1)
    if n_head % n_head_kv:
        raise UnsupportedError(f"{what}: n_head_kv {n_head_kv} does not divide n_head {n_head}")
    q2 = rows_view(what, "q", q, n_head * head_dim)
    k2 = rows_view(what, "k", k, n_head_kv * head_dim)
    v2 = rows_view(what, "v", v, n_head_kv * head_dim)
    for name, t in (("q", q2), ("k", k2), ("v", v2)):
        if t.dtype != torch.float32:
            raise UnsupportedError(f"{what}: {name} must be float32, got {t.dtype}")
    rows = q2.shape[0]
    if k2.shape[0] != rows or v2.shape[0] != rows:
        raise UnsupportedError(f"{what}: q, k, v have {rows}, {k2.shape[0]}, {v2.shape[0]} rows")
    for name, t in (("row_slots", row_slots), ("positions", positions)):
        check_tensor(what, name, t, (torch.int32,), ndim=1)
        if t.numel() != rows:
            raise UnsupportedError(f"{what}: {rows} rows but {t.numel()} {name}")
    shape = check_cache(what, cache_k, cache_v, layer, n_head_kv, head_dim)
    if cache_dtype is not None and cache_k.dtype != cache_dtype:
        raise UnsupportedError(f"{what}: the cache must be {str(cache_dtype).removeprefix('torch.')}, got "
                               f"{str(cache_k.dtype).removeprefix('torch.')}")
    device = check_device(what, q=q2, k=k2, v=v2, cache_k=cache_k, cache_v=cache_v, row_slots=row_slots,
                          positions=positions)
    return q2, k2, v2, shape, device


def check_window(what: str, window: int, softcap: float) -> None:
    """A sliding window of >= 0 positions (0: none) and a soft-cap >= 0 (0: none), else UnsupportedError."""
    check_int(what, "window", window)
    if isinstance(softcap, bool) or not isinstance(softcap, float | int) or not 0 <= softcap < float("inf"):
        raise UnsupportedError(f"{what}: softcap must be a finite number >= 0 (0: none), got {softcap!r}")


def check_sinks(what: str, sinks, n_head: int, like: torch.Tensor) -> None:
    """None, or the per-head sink logits: contiguous f32 [n_head] on the call's device."""
    if sinks is None:
        return
    check_tensor(what, "sinks", sinks, (torch.float32,), ndim=1)
    if sinks.numel() != n_head or not sinks.is_contiguous():
        raise UnsupportedError(f"{what}: sinks must be contiguous f32 [{n_head}] (one logit per query head), got "
                               f"{tuple(sinks.shape)}")
    check_device(what, q=like, sinks=sinks)


def kv_write(k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
             row_slots: torch.Tensor, positions: torch.Tensor, layer: int) -> None:
    """cache[layer, slot_r, :, position_r] = k[r], v[r] for every row r (rounded to the cache dtype,
    or quantized to the Q8_0 layout for an int8 cache). Slots and positions are the caller's to keep
    in range: the backend checks each batch once."""
    n_layer, n_slots, nkv, n_ctx, rs = cache_k.shape
    hd = k.shape[1] // nkv
    if k.shape[0]:
        _kv_write_kernel[check_grid("kv_write", (k.shape[0], nkv))](
            k, v, cache_k, cache_v, row_slots, positions, k.stride(0), v.stride(0), layer * n_slots * nkv * n_ctx * rs,
            nkv * n_ctx * rs, n_ctx * rs, hd, rs, BLOCK_D=max(32, triton.next_power_of_2(hd)),
            Q8=cache_k.dtype == torch.int8, num_warps=1, **pdl_args())


def block_n(head_dim: int, q8: bool = False) -> int:
    """Keys per inner step: 64, 32 past head_dim 64 (the tile then fits the registers), 16 for a
    Q8_0 cache past head_dim 64 (its dequantized tiles need more: sm_90 compile check)."""
    if head_dim <= 64:
        return BLOCK_N
    return BLOCK_N // 4 if q8 else BLOCK_N // 2


def split_plan(n_ctx: int) -> tuple[int, int]:
    """(keys per split, splits) for a cache of n_ctx positions."""
    split_len = max(SPLIT_LEN, cdiv(n_ctx, MAX_SPLITS))
    return split_len, cdiv(n_ctx, split_len)


def attention_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                   row_slots: torch.Tensor, positions: torch.Tensor, layer: int, n_head: int, n_head_kv: int,
                   head_dim: int, scale: float, spans=None, tiles=None,
                   out: torch.Tensor | None = None, kv_written: bool = False, window: int = 0,
                   softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Write k/v into the cache at (row_slots, positions), then out [rows, n_head * head_dim] f32 =
    softmax(q K^T * scale) V over positions 0..position of each row's slot. q/k/v: f32 rows
    (row-strided views are fine), cache f16 [layers, slots, n_head_kv, n_ctx, head_dim]. `spans`
    and `tiles` are not needed (every row reads its own slot and position on the device).
    `kv_written`: the producer of k and v already wrote them into the cache (gemv_rope's KV
    epilogue), so the write is skipped. `window` > 0: a row attends its last `window` positions
    only (sliding-window layers; the cache keeps every position); `softcap` > 0: scores s become
    softcap * tanh(s / softcap) before the softmax (gemma2). `sinks` f32 [n_head]: each head's learned
    logit joins the softmax's max and denominator, adding no value (gpt-oss; ggml_soft_max_add_sinks)."""
    return _attention_rows("attention_rows", torch.float16, q, k, v, cache_k, cache_v, row_slots, positions, layer,
                           n_head, n_head_kv, head_dim, scale, out, kv_written, window, softcap, sinks)


def attention_rows_q8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor,
                      cache_v: torch.Tensor, row_slots: torch.Tensor, positions: torch.Tensor, layer: int, n_head: int,
                      n_head_kv: int, head_dim: int, scale: float, spans=None, tiles=None,
                      out: torch.Tensor | None = None, window: int = 0, softcap: float = 0.0,
                      sinks: torch.Tensor | None = None) -> torch.Tensor:
    """`attention_rows` over a Q8_0 cache (int8, rows of q8_row_bytes(head_dim)): k/v quantized as
    they are written, keys and values dequantized to f16 tiles as they are read."""
    return _attention_rows("attention_rows_q8", torch.int8, q, k, v, cache_k, cache_v, row_slots, positions, layer,
                           n_head, n_head_kv, head_dim, scale, out, False, window, softcap, sinks)


def _attention_rows(what, cache_dtype, q, k, v, cache_k, cache_v, row_slots, positions, layer, n_head, n_head_kv,
                    head_dim, scale, out, kv_written=False, window=0, softcap=0.0, sinks=None):
    q2, k2, v2, shape, device = check_attention_call(what, q, k, v, cache_k, cache_v, row_slots, positions, layer,
                                                     n_head, n_head_kv, head_dim, cache_dtype)
    check_window(what, window, softcap)
    check_sinks(what, sinks, n_head, q2)
    rows = q2.shape[0]
    out = make_out(what, out, (rows, n_head * head_dim), torch.float32, device)
    if not rows:
        return out
    if not kv_written:
        kv_write(k2, v2, cache_k, cache_v, row_slots, positions, layer)
    n_layer, n_slots, nkv, n_ctx, hd = shape
    rs = cache_k.shape[4]  # elements (bytes for Q8_0) from one position's row to the next
    split_len, nsplit = split_plan(n_ctx)
    g = n_head // n_head_kv
    gp = max(16, triton.next_power_of_2(g))
    block_d = max(16, triton.next_power_of_2(hd))
    po = pml = out  # unused with one split
    if nsplit > 1:
        po = torch.empty(rows * n_head * nsplit * hd, dtype=torch.float32, device=device)
        pml = torch.empty(rows * n_head * nsplit * 2, dtype=torch.float32, device=device)
    _attn_rows_kernel[check_grid(what, (rows, nkv, nsplit))](
        q2, cache_k, cache_v, row_slots, positions, out, po, pml, out if sinks is None else sinks, q2.stride(0),
        layer * n_slots * nkv * n_ctx * rs,
        nkv * n_ctx * rs, n_ctx * rs, float(scale), g, n_head, hd, rs, split_len, nsplit, int(window),
        float(softcap) or 1.0, GP=gp, BLOCK_D=block_d, BLOCK_N=block_n(hd, cache_dtype == torch.int8),
        SPLIT=nsplit > 1, Q8=cache_dtype == torch.int8, CAP=softcap > 0, SINK=sinks is not None, num_warps=4,
        **pdl_args())
    if nsplit > 1:
        _attn_combine_kernel[check_grid(what, (rows, n_head))](
            po, pml, out, out if sinks is None else sinks, n_head, hd, nsplit, SP=triton.next_power_of_2(nsplit),
            BLOCK_D=block_d, SINK=sinks is not None, num_warps=1, **pdl_args())
    return out


# ---------------------------------------------------------------------- prompt chunks
def spans_of(row_slots: torch.Tensor, positions: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """(first row, slot, first position, rows) of each run of rows with one slot and consecutive
    positions: the sequences of a prefill batch (one host read of the two small tensors)."""
    slots, pos = row_slots.tolist(), positions.tolist()
    spans: list[list[int]] = []
    for r, (s, p) in enumerate(zip(slots, pos, strict=True)):
        if spans and spans[-1][1] == s and spans[-1][2] + spans[-1][3] == p:
            spans[-1][3] += 1
        else:
            spans.append([r, s, p, 1])
    return [tuple(x) for x in spans]


def prefill_tiles(spans, block_m: int = PREFILL_BLOCK_M) -> list[tuple[int, int, int, int]]:
    """(first row, slot, first position, rows) tiles of up to block_m rows covering `spans`
    [(first row, slot, start, rows)]: the tile table `attention_prefill` reads."""
    return [(r0 + t, slot, start + t, min(block_m, n - t))
            for r0, slot, start, n in spans for t in range(0, n, block_m)]


def max_prefill_tiles(rows: int, spans: int, block_m: int = PREFILL_BLOCK_M) -> int:
    """Tiles `prefill_tiles` makes at most for `rows` rows in up to `spans` spans."""
    return rows // block_m + spans


def attention_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor,
                      cache_v: torch.Tensor, row_slots: torch.Tensor, positions: torch.Tensor, layer: int, n_head: int,
                      n_head_kv: int, head_dim: int, scale: float, spans=None, tiles: torch.Tensor | None = None,
                      out: torch.Tensor | None = None, window: int = 0, softcap: float = 0.0,
                      sinks: torch.Tensor | None = None) -> torch.Tensor:
    """`attention_rows` for prompt chunks: k/v written, then flash-attention per tile of up to
    PREFILL_BLOCK_M rows of one span. `tiles`: the int32 [T, 4] device tile table (CUDA graphs;
    rows not in a tile are left unwritten); else it is built from `spans` or, without them, from
    the slots and positions (host reads). `window`, `softcap`, `sinks`: as attention_rows (a tile's key
    loop starts at the first key its first query sees)."""
    return _attention_prefill("attention_prefill", torch.float16, q, k, v, cache_k, cache_v, row_slots, positions,
                              layer, n_head, n_head_kv, head_dim, scale, spans, tiles, out, window, softcap, sinks)


def attention_prefill_q8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor,
                         cache_v: torch.Tensor, row_slots: torch.Tensor, positions: torch.Tensor, layer: int,
                         n_head: int, n_head_kv: int, head_dim: int, scale: float, spans=None,
                         tiles: torch.Tensor | None = None, out: torch.Tensor | None = None, window: int = 0,
                         softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """`attention_prefill` over a Q8_0 cache (k/v quantized as written, tiles dequantized as read)."""
    return _attention_prefill("attention_prefill_q8", torch.int8, q, k, v, cache_k, cache_v, row_slots, positions,
                              layer, n_head, n_head_kv, head_dim, scale, spans, tiles, out, window, softcap, sinks)


def prefill_block_n(head_dim: int, q8: bool = False) -> int:
    """Keys per inner step of a prefill tile: 32 up to head_dim 64, else 16 (a [64, head_dim]
    tile of 4 warps then fits the registers without spilling, on triton 3.6 and 3.7: sm_90 compile
    check; 8 warps instead were 1.6-1.9x slower on the H200, bench/NOTES.md run 28)."""
    return 32 if head_dim <= 64 and not q8 else 16



def _attention_prefill(what, cache_dtype, q, k, v, cache_k, cache_v, row_slots, positions, layer, n_head, n_head_kv,
                       head_dim, scale, spans, tiles, out, window=0, softcap=0.0, sinks=None):
    q2, k2, v2, shape, device = check_attention_call(what, q, k, v, cache_k, cache_v, row_slots, positions, layer,
                                                     n_head, n_head_kv, head_dim, cache_dtype)
    check_window(what, window, softcap)
    check_sinks(what, sinks, n_head, q2)
    rows = q2.shape[0]
    out = make_out(what, out, (rows, n_head * head_dim), torch.float32, device)
    if not rows:
        return out
    if tiles is None:
        if spans is None:
            spans = spans_of(row_slots, positions)  # (host reads: outside graphs only)
        tiles = torch.tensor(prefill_tiles(spans) or [(0, 0, 0, 0)], dtype=torch.int32).to(device)
    else:
        check_tensor(what, "tiles", tiles, (torch.int32,), ndim=2)
        if tiles.shape[1] != 4 or not tiles.is_contiguous():
            raise UnsupportedError(f"{what}: tiles must be contiguous int32 [T, 4], got {tuple(tiles.shape)}")
        check_device(what, q=q2, tiles=tiles)
    kv_write(k2, v2, cache_k, cache_v, row_slots, positions, layer)
    n_layer, n_slots, nkv, n_ctx, hd = shape
    rs = cache_k.shape[4]
    q8 = cache_dtype == torch.int8
    _attn_prefill_kernel[check_grid(what, (tiles.shape[0], n_head))](
        q2, cache_k, cache_v, tiles, out, out if sinks is None else sinks, q2.stride(0),
        layer * n_slots * nkv * n_ctx * rs, nkv * n_ctx * rs,
        n_ctx * rs, float(scale), n_head // n_head_kv, n_head, hd, rs, int(window), float(softcap) or 1.0,
        BLOCK_M=PREFILL_BLOCK_M, BLOCK_D=max(16, triton.next_power_of_2(hd)), BLOCK_N=prefill_block_n(hd, q8), Q8=q8,
        CAP=softcap > 0, SINK=sinks is not None, num_warps=4,
        **pdl_args())
    return out
