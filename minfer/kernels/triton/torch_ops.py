"""Kernels that are torch calls: where cuBLAS or torch's SDPA win, declared by contract like ours.

- `linear_f16`: out = x @ W^T with W an f16 copy of any ggml weight type (the load layout
  `f16_weight` dequantizes once, on the device, with minfer's dequant kernel) and x rounded to
  f16; cuBLAS multiplies on tensor cores with f32 accumulation and an f32 result. Costs 2 bytes
  per weight of device memory (the "W16 cache" of seed 000) and per token-batch of traffic.
  f16 rather than bf16: the same speed with 3 more mantissa bits (bf16 operands cost ~1 % relative
  error on logits, f16 ~0.25 %); activations past f16's range (65504) would overflow, which the
  matmul inputs of llama/qwen models (normalized rows, SwiGLU outputs) do not reach.
- `linear_f32`: out = x @ W^T for F32 weights, in f32 (cuBLAS without TF32, on the file's bytes:
  no copy), as llama.cpp multiplies them. A mixture of experts' router is F32 in every published
  mix: its logits choose the experts, a discrete choice that f16 rounding flips at near-ties (the
  prompt path routed otherwise than llama.cpp and than the decode rows, tiny-gpt-oss on the H200).
- `attention_sdpa`: the Attention op for prompt chunks: k/v written into the cache by minfer's
  `kv_write` kernel, then torch's scaled_dot_product_attention (flash / memory-efficient
  backends) per sequence span over its cached positions, causal.
- `row_select`: out = x[rows] (the rows whose logits a step returns).
- `argmax_rows`: out[r] = argmax of row r (greedy decoding's token, picked on the device so that
  only the token ids cross to the host; the first index of equal values, as torch.argmax).

On the CPU (the Triton interpreter in CI) the same functions run with the same operand roundings
(`linear_f16` sums in float64 there, rounded once to float32, so that its rows do not depend on the
batch's row count), so their tests check the semantics the GPU path has.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...errors import UnsupportedError
from ...quant import reference
from ...quant.types import GGMLType
from ._common import check_device, check_int, check_tensor, make_out, rows_view
from .attention import check_attention_call, check_window, kv_write, spans_of
from .dequant import dequant, resolve_qtype


def f16_weight(w: torch.Tensor, n: int, k: int, qtype: GGMLType | int | str) -> torch.Tensor:
    """The f16 [n, k] copy of a GGUF weight (raw bytes of any ggml type, or a float16/bfloat16
    matrix), made on w's device."""
    what = "f16_weight"
    check_int(what, "n", n, 1)
    check_int(what, "k", k, 1)
    if isinstance(w, torch.Tensor) and w.dtype in (torch.float16, torch.bfloat16):
        if tuple(w.shape) != (n, k):
            raise UnsupportedError(f"{what}: a 16-bit weight must be [{n}, {k}], got {tuple(w.shape)}")
        return w.to(torch.float16)
    info = resolve_qtype(what, qtype)
    check_tensor(what, "w", w, (torch.uint8,))
    if w.device.type != "cuda":  # the interpreter: the reference decoder (the Triton one has its own tests)
        return reference.dequantize(w.reshape(-1), info.type, (n, k)).to(torch.float16)
    return dequant(w.reshape(-1), info.type, n, k, out_dtype=torch.float16)


def _rows_times(what: str, x: torch.Tensor, w: torch.Tensor, k: int, out: torch.Tensor | None) -> torch.Tensor:
    """out [m, n] f32 = x [m, k] (or [k]) @ w^T with x rounded to w's dtype (f16 or f32): cuBLAS on
    the GPU (f32 accumulate; TF32 off for f32); on the CPU, the interpreter's stand-in, the same
    operands summed in f64 and rounded once to f32, so that a row's result does not depend on the
    rows beside it (a CPU BLAS picks its kernel, and with it the order of a row's sums, by the row
    count: a decode graph's padded bucket must equal the eager step)."""
    x2 = x.reshape(1, -1) if x.dim() == 1 else x
    check_tensor(what, "x", x2, (torch.float32,), ndim=2)
    if x2.shape[1] != k:
        raise UnsupportedError(f"{what}: x must be [m, {k}], got {tuple(x.shape)}")
    device = check_device(what, x=x2, w=w, out=out)
    xw = x2.to(w.dtype)
    if device.type != "cuda":
        res = torch.mm(xw.double(), w.double().t()).float()
    elif w.dtype == torch.float16:
        res = torch.mm(xw, w.t(), out_dtype=torch.float32)
    else:
        prior = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False  # (torch's default; held here whatever a caller set)
        try:
            res = torch.mm(xw, w.t())
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prior
    if out is None:
        return res
    make_out(what, out, res.shape, torch.float32, device).copy_(res)
    return out


def linear_f16(x: torch.Tensor, w: torch.Tensor, n: int, k: int, qtype: GGMLType | int | str,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """out [m, n] f32 = f16(x) [m, k] @ W^T: W the `f16_weight` layout (or raw bytes, converted
    on every call: correct, but a full pass over W each time)."""
    return _rows_times("linear_f16", x, f16_weight(w, n, k, qtype), k, out)


def f32_weight(w: torch.Tensor, n: int, k: int, qtype: GGMLType | int | str) -> torch.Tensor:
    """An F32 GGUF weight's [n, k] float32 view (its raw bytes reinterpreted: no copy)."""
    what = "f32_weight"
    check_int(what, "n", n, 1)
    check_int(what, "k", k, 1)
    if isinstance(w, torch.Tensor) and w.dtype == torch.float32:
        if tuple(w.shape) != (n, k):
            raise UnsupportedError(f"{what}: an f32 weight must be [{n}, {k}], got {tuple(w.shape)}")
        return w
    if resolve_qtype(what, qtype).type != GGMLType.F32:
        raise UnsupportedError(f"{what}: reads F32 weights, got {resolve_qtype(what, qtype).name}")
    check_tensor(what, "w", w, (torch.uint8,))
    if w.numel() != n * k * 4 or not w.is_contiguous():
        raise UnsupportedError(f"{what}: an F32 [{n}, {k}] weight is {n * k * 4} contiguous bytes, got {w.numel()}")
    return w.reshape(-1).view(torch.float32).view(n, k)


def linear_f32(x: torch.Tensor, w: torch.Tensor, n: int, k: int, qtype: GGMLType | int | str,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """out [m, n] f32 = x [m, k] @ W^T in f32 for an F32 weight (`f32_weight`'s view): cuBLAS with
    TF32 off on the GPU; the interpreter's stand-in in f64 (as linear_f16's)."""
    return _rows_times("linear_f32", x, f32_weight(w, n, k, qtype), k, out)


def attention_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor,
                   cache_v: torch.Tensor, row_slots: torch.Tensor, positions: torch.Tensor, layer: int, n_head: int,
                   n_head_kv: int, head_dim: int, scale: float, spans=None, tiles=None,
                   out: torch.Tensor | None = None, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """The Attention op by torch SDPA: as `attention.attention_rows`, for rows that come in spans
    of consecutive positions of one slot (prompt chunks). `spans`: [(first row, slot, start,
    rows)] from the host's batch, or None to read them from row_slots/positions (a device sync,
    which every layer of a step would pay). `tiles` (attention_prefill's table) is not used.
    `window`: a sliding window, as a mask (and only the keys some query sees are read); SDPA has
    no soft-cap, so `softcap` must be 0 (the contract refuses others)."""
    return _attention_sdpa("attention_sdpa", False, q, k, v, cache_k, cache_v, row_slots, positions, layer, n_head,
                           n_head_kv, head_dim, scale, spans, out, window, softcap)


def attention_sdpa_q8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor,
                      cache_v: torch.Tensor, row_slots: torch.Tensor, positions: torch.Tensor, layer: int, n_head: int,
                      n_head_kv: int, head_dim: int, scale: float, spans=None, tiles=None,
                      out: torch.Tensor | None = None, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """`attention_sdpa` over a Q8_0 cache (attention.py's layout): the k/v written quantized, each
    span's cached keys and values dequantized to f16 for SDPA."""
    return _attention_sdpa("attention_sdpa_q8", True, q, k, v, cache_k, cache_v, row_slots, positions, layer, n_head,
                           n_head_kv, head_dim, scale, spans, out, window, softcap)


def dequant_q8_rows(c: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Q8_0 cache rows [..., q8_row_bytes(head_dim)] int8 -> f32 [..., head_dim]."""
    scales = c[..., head_dim:].contiguous().view(torch.float16).float()
    return c[..., :head_dim].float() * scales.repeat_interleave(32, dim=-1)


def _attention_sdpa(what, q8, q, k, v, cache_k, cache_v, row_slots, positions, layer, n_head, n_head_kv, head_dim,
                    scale, spans, out, window=0, softcap=0.0):
    q2, k2, v2, shape, device = check_attention_call(what, q, k, v, cache_k, cache_v, row_slots, positions, layer,
                                                     n_head, n_head_kv, head_dim)
    check_window(what, window, softcap)
    if softcap:
        raise UnsupportedError(f"{what}: torch SDPA has no soft-cap (softcap {softcap}): attention_prefill has one")
    if (cache_k.dtype == torch.int8) != q8:
        raise UnsupportedError(f"{what}: the cache must be {'int8 (Q8_0)' if q8 else 'a float type'}, got "
                               f"{str(cache_k.dtype).removeprefix('torch.')}")
    rows = q2.shape[0]
    out = make_out(what, out, (rows, n_head * head_dim), torch.float32, device)
    if not rows:
        return out
    kv_write(k2, v2, cache_k, cache_v, row_slots, positions, layer)
    ck, cv = cache_k[layer], cache_v[layer]
    dt = (torch.float16 if q8 else cache_k.dtype) if device.type == "cuda" else torch.float32
    for r0, slot, start, n in (spans if spans is not None else spans_of(row_slots, positions)):
        end = start + n
        lo = max(0, start - window + 1) if window and end > window else 0  # the first key a query sees
        qs = q2[r0:r0 + n].view(n, n_head, head_dim).transpose(0, 1).unsqueeze(0).to(dt)
        if q8:
            ks = dequant_q8_rows(ck[slot, :, lo:end], head_dim).unsqueeze(0).to(dt)
            vs = dequant_q8_rows(cv[slot, :, lo:end], head_dim).unsqueeze(0).to(dt)
        else:
            ks = ck[slot, :, lo:end].unsqueeze(0).to(dt)
            vs = cv[slot, :, lo:end].unsqueeze(0).to(dt)
        mask = None
        if window and end > window:  # query start + i sees keys start + i - window + 1 .. start + i
            qpos = torch.arange(start, end, device=device)[:, None]
            kpos = torch.arange(lo, end, device=device)[None, :]
            mask = (kpos <= qpos) & (qpos - kpos < window)
        elif start > 0 and n > 1:  # query i sees keys 0..start+i
            mask = torch.ones(n, end, dtype=torch.bool, device=device).tril_(diagonal=start)
        causal = mask is None and start == 0 and n > 1
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, is_causal=causal, scale=float(scale),
                                           enable_gqa=n_head != n_head_kv)
        out[r0:r0 + n] = o[0].transpose(0, 1).reshape(n, n_head * head_dim).float()
    return out


def row_select(x: torch.Tensor, rows: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out [len(rows), width] = x[rows] (rows int32, in range: the backend's batch guarantees it)."""
    what = "row_select"
    x2 = rows_view(what, "x", x)
    check_tensor(what, "rows", rows, (torch.int32,), ndim=1)
    device = check_device(what, x=x2, rows=rows, out=out)
    out = make_out(what, out, (rows.numel(), x2.shape[1]), x2.dtype, device)
    torch.index_select(x2, 0, rows, out=out)
    return out


def argmax_rows(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out int32 [rows] = the index of each row's largest value (the first of equal ones)."""
    what = "argmax_rows"
    x2 = rows_view(what, "x", x)
    if x2.shape[1] < 1:
        raise UnsupportedError(f"{what}: rows of width 0 have no largest value")
    device = check_device(what, x=x2, out=out)
    out = make_out(what, out, (x2.shape[0],), torch.int32, device)
    out.copy_(torch.argmax(x2, dim=-1))
    return out
