"""The cpu backend's ops as plain torch functions on float32 tensors.

These are the numerical reference of every graph op: GPU kernels are tested against them.
Activations are token-major [T, width]; heads are contiguous runs of `head_dim` in a row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...kernels.cpu import vnni as cpu_vnni
from ..rope import rope_table  # noqa: F401  (the RoPE tables of every backend; cpu_ops.rope_table)


class RMSNorm:
    """x / sqrt(mean(x^2) + eps) * w over the last dimension of [T, d].

    Each row's mean is its own reduction over d (not a matmul over the rows, whose kernel and
    rounding change with the row count), so a row's result is the same whatever else is in the
    batch."""

    def __init__(self, w: torch.Tensor, eps: float, dtype: torch.dtype = torch.float32, c: bool = True,
                 group: int | None = None):
        self.w = w
        self.eps = float(eps)
        self.group = group  # normalise each run of `group` values (per-head q/k norms); None: whole rows
        self.dtype = dtype  # of the result: bfloat16 when the only consumers are int4 matmuls
        # float32 results of a width the C kernel takes run there, where it is available (and `c` allows it)
        self.c = c and dtype == torch.float32 and w.dtype == torch.float32 and cpu_vnni.available() and \
            cpu_vnni.norm_fits(torch.float32, w.shape[0]) and w.is_contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.group is not None:  # [T, n * group] -> n rows of `group` per token, normed alone
            t = x.shape[0]
            return self._rows(x.reshape(-1, self.group)).view(t, -1)
        return self._rows(x)

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        if self.c and x.dtype == torch.float32 and x.dim() == 2:  # the C kernel: one call
            return cpu_vnni.rms_norm(x, self.w, self.eps)
        r = (x * x).mean(-1, keepdim=True).add_(self.eps).rsqrt_().mul(x)
        if self.dtype == r.dtype:
            return r.mul_(self.w)
        return torch.mul(r, self.w, out=torch.empty(r.shape, dtype=self.dtype))  # rounded once, as .to() would


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return RMSNorm(w, eps)(x)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, in the inputs' dtype (bfloat16 on the decode path: the next int4 matmul's input)."""
    return F.silu(gate).mul_(up)


def swiglu_oai(gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's clamped SwiGLU (ggml's swiglu_oai): g = min(gate, limit), u = clamp(up, -limit,
    limit), g * sigmoid(alpha g) * (u + 1), in float32."""
    g = gate.float().clamp(max=limit)
    u = up.float().clamp(-limit, limit).add_(1.0)
    return torch.sigmoid(g * alpha).mul_(g).mul_(u)


def geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up (gemma's GeGLU; llama.cpp's ggml_gelu is the tanh form)."""
    return F.gelu(gate, approximate="tanh").mul_(up)


def scale(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap): bounds x to (-cap, cap), nearly the identity well inside it."""
    return torch.tanh(x / cap).mul_(cap)


def rope_rotation(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The complex rotations cos + i sin [T, 1, n_rot/2] of a step's tokens, shared by every layer
    and head (the 1 broadcasts over heads)."""
    return torch.complex(cos, sin).unsqueeze(1)


def apply_rope(x: torch.Tensor, rot: torch.Tensor, n_heads: int, head_dim: int, n_rot: int,
               style: str) -> torch.Tensor:
    """Rotate [T, n_heads * head_dim] (a column view or bfloat16 is fine) by rope_rotation's
    [T, 1, n_rot/2]; returns a new contiguous float32 [T, n_heads * head_dim].

    Pair i of a head, (a_i, b_i), turns by angle i: y_a = x_a cos - x_b sin, y_b = x_a sin + x_b cos,
    one complex multiply per pair. "normal" pairs adjacent dims (2i, 2i+1), llama.cpp's rope mode 0;
    "neox" pairs (i, i + n_rot/2), its NEOX mode. Dims from n_rot on pass through. Elementwise, so a
    row's result does not depend on the other rows."""
    t = x.shape[0]
    half = n_rot // 2
    if style == "normal" and n_rot == head_dim:  # the common case in the fewest ops (decode runs it per layer)
        h = x.to(torch.float32, memory_format=torch.contiguous_format).view(t, n_heads, half, 2)
        return torch.view_as_real(torch.view_as_complex(h) * rot).view(t, n_heads * head_dim)
    h = x.reshape(t, n_heads, head_dim).float()  # every op below makes a new tensor: x is not touched
    if style == "normal":
        part = h[..., :n_rot]
        if not part.is_contiguous():
            part = part.contiguous()
        z = torch.view_as_complex(part.view(t, n_heads, half, 2)) * rot
        out = torch.view_as_real(z).flatten(-2)
    else:
        z = torch.complex(h[..., :half], h[..., half:n_rot]) * rot
        out = torch.cat([z.real, z.imag], -1)
    if n_rot < head_dim:
        out = torch.cat([out, h[..., n_rot:]], -1)
    return out.reshape(t, n_heads * head_dim)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, head_dim: int, n_rot: int,
         style: str) -> torch.Tensor:
    """Rotate [T, n_heads * head_dim] by per-token cos/sin [T, n_rot/2] (see apply_rope)."""
    return apply_rope(x, rope_rotation(cos, sin), n_heads, head_dim, n_rot, style)


def attention_one(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """attention() for one query that sees every cached position: q [n_head, hd] against
    keys/values [n_head_kv, L, hd]. Returns [1, n_head * hd].

    With one query there is no causal mask: one SDPA call on views, no repeated keys (measured
    on 2 AVX2 cores: ~25% faster than baddbmm + softmax + bmm at L = 32..512)."""
    n_head, hd = q.shape
    out = attention_decode(q.view(1, n_head, 1, hd), keys.unsqueeze(0), values.unsqueeze(0), scale)
    return out.view(1, n_head * hd)


def attention_decode(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """attention_one on views already in SDPA's shapes (the decode path makes them once per step):
    q [1, n_head, 1, hd], keys/values [1, n_kv, L, hd]; returns [1, n_head, 1, hd]."""
    return F.scaled_dot_product_attention(q, keys, values, scale=scale, enable_gqa=keys.shape[1] != q.shape[1])


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: int,
              scale: float, window: int = 0, softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of one sequence's queries q [n, n_head, hd] at positions start..start+n-1
    over its cache k/v [n_head_kv, >= start+n, hd] (already holding this step's keys).
    `window` > 0: query p sees keys p - window < k <= p only; `softcap` > 0: scores s become
    softcap * tanh(s / softcap) before the softmax; `sinks` [n_head]: each head's logit added to
    the softmax's denominator (graph/ir.py). Returns [n, n_head * hd]."""
    n, n_head, hd = q.shape
    length = start + n
    if window or softcap or sinks is not None:
        return attention_masked(q, k_cache[:, :length], v_cache[:, :length], start, scale, window, softcap, sinks)
    qh = q.transpose(0, 1).unsqueeze(0)
    k = k_cache[:, :length].unsqueeze(0)
    v = v_cache[:, :length].unsqueeze(0)
    mask = None
    if n > 1 and start > 0:  # query i sees keys 0..start+i: a causal mask offset by `start`
        mask = torch.ones(n, length, dtype=torch.bool).tril_(diagonal=start)
    out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, is_causal=(n > 1 and start == 0),
                                         scale=scale, enable_gqa=k.shape[1] != n_head)
    return out[0].transpose(0, 1).reshape(n, n_head * hd)


def attention_masked(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, scale: float,
                     window: int, softcap: float, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """attention() with a sliding window, soft-capped scores and/or attention sinks, spelled out
    (SDPA has neither soft-cap nor sinks): q [n, n_head, hd] at positions start.., keys/values
    [n_kv, start + n, hd]. Only the keys some query can see are read (the last window + n - 1 of
    them). A sink is a column of the softmax that no value row follows (ggml_soft_max_add_sinks)."""
    n, n_head, hd = q.shape
    n_kv, length, _ = keys.shape
    lo = max(0, start - window + 1) if window else 0  # first key any query of the chunk sees
    k, v = keys[:, lo:], values[:, lo:]
    qh = q.transpose(0, 1).reshape(n_kv, n_head // n_kv * n, hd)  # query heads grouped by their kv head
    s = torch.bmm(qh, k.transpose(1, 2)).mul_(scale)
    if softcap:
        s = torch.tanh(s / softcap).mul_(softcap)
    qpos = torch.arange(start, start + n).unsqueeze(1)
    kpos = torch.arange(lo, length).unsqueeze(0)
    visible = kpos <= qpos
    if window:
        visible &= qpos - kpos < window
    s = s.view(n_kv, n_head // n_kv, n, -1).masked_fill_(~visible, float("-inf"))
    if sinks is not None:  # head h = kv * group + g: its sink as one more column, dropped after the softmax
        sink = sinks.float().view(n_kv, n_head // n_kv, 1, 1).expand(n_kv, n_head // n_kv, n, 1)
        p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1].reshape(n_kv, n_head // n_kv * n, -1)
    else:
        p = torch.softmax(s, -1).view(n_kv, n_head // n_kv * n, -1)
    out = torch.bmm(p, v).view(n_head, n, hd)
    return out.transpose(0, 1).reshape(n, n_head * hd)


def moe_route(logits: torch.Tensor, n_used: int, gating: str, norm: bool, scale: float,
              bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] float32, ids [T, k] int32) of router logits [T, E] (graph/ir.py MoERoute,
    llama.cpp's build_moe_ffn): probs by the gating function; the k experts of largest probs
    (+ the selection bias), largest first, the lower index first among equal values; their probs
    as weights (softmaxed for "softmax_weight"), normalised by their sum (clamped at 2^-14) and
    scaled. Each row on its own."""
    x = logits.float()
    if gating == "softmax":
        probs = torch.softmax(x, dim=-1)
    elif gating == "sigmoid":
        probs = torch.sigmoid(x)
    else:  # "softmax_weight": the logits themselves, the chosen ones softmaxed below
        probs = x
    select = probs if bias is None else probs + bias
    select = select.nan_to_num(nan=float("-inf"))  # a diverged (NaN) value is never chosen over a number
    ids = torch.argsort(select, dim=-1, descending=True, stable=True)[:, :n_used]
    w = probs.gather(-1, ids)
    if gating == "softmax_weight":
        w = torch.softmax(w, dim=-1)
    if norm:
        w = w / w.sum(-1, keepdim=True).clamp_(min=6.103515625e-5)
    if scale != 1.0:
        w = w * scale
    return w.contiguous(), ids.to(torch.int32)


def moe_sum(y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """out [T, N] = sum_j weights[t, j] * y[t, j] of y [T, k, N], added in slot order j = 0, 1, ...
    (as llama.cpp adds its experts' views)."""
    w = weights.float()
    out = y[:, 0].float() * w[:, :1]
    for j in range(1, y.shape[1]):
        out.add_(y[:, j].float() * w[:, j:j + 1])
    return out
