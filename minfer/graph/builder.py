"""GraphBuilder: appends nodes with shape checks, so a model file reads like its math.

Each method returns the new node's id. Shapes are inferred from the inputs and weights; a
mismatch (e.g. metadata that makes the heads not add up to the embedding) is a ModelError naming
the node, raised when the graph is built, not when it first runs.
"""

from __future__ import annotations

from typing import Any

from ..errors import ModelError
from .ir import Dim, Graph, Node, Op, WeightRef


class GraphBuilder:
    def __init__(self, meta: dict[str, Any] | None = None):
        self._nodes: list[Node] = []
        self._inputs: dict[str, int] = {}
        self._weights: dict[str, WeightRef] = {}
        self._meta = dict(meta or {})

    # ------------------------------------------------------------------ helpers
    def _add(self, name: str, op: Op, inputs: tuple[int, ...], shape: tuple[Dim, ...], *,
             dtype: str = "F32", layer: int | None = None, weights: dict[str, WeightRef] | None = None,
             **params: Any) -> int:
        node = Node(len(self._nodes), name, op, inputs, shape, dtype, layer, weights or {}, params)
        self._nodes.append(node)
        return node.id

    def shape(self, node_id: int) -> tuple[Dim, ...]:
        return self._nodes[node_id].shape

    def weight(self, name: str, shape: tuple[int, ...]) -> WeightRef:
        """Register a weight; using one tensor twice (tied embeddings) needs the same shape."""
        ref = WeightRef(name, tuple(shape))
        old = self._weights.setdefault(name, ref)
        if old.shape != ref.shape:
            raise ModelError(f"weight {name!r} is used with shapes {old.shape} and {ref.shape}")
        return ref

    def _check(self, cond: bool, name: str, what: str) -> None:
        if not cond:
            raise ModelError(f"graph node {name!r}: {what}")

    # ------------------------------------------------------------------ ops
    def input(self, name: str, shape: tuple[Dim, ...], dtype: str) -> int:
        nid = self._add(name, Op.INPUT, (), shape, dtype=dtype)
        self._inputs[name] = nid
        return nid

    def embed(self, table: WeightRef, ids: int, name: str) -> int:
        """GetRows from a weight table [n_embd, n_vocab] (GGUF order): one row per token id."""
        return self._add(name, Op.GET_ROWS, (ids,), (self.shape(ids)[0], table.shape[0]),
                         weights={"w": table})

    def get_rows(self, x: int, rows: int, name: str) -> int:
        """GetRows from an activation: out[i] = x[rows[i]] (selects the rows that need logits)."""
        return self._add(name, Op.GET_ROWS, (x, rows), (self.shape(rows)[0], *self.shape(x)[1:]))

    def rms_norm(self, x: int, w: WeightRef, eps: float, name: str, layer: int | None = None,
                 group: int | None = None) -> int:
        """RMSNorm over the whole row, or over each run of `group` values (per-head q/k norms:
        group = head_dim, one weight of `group` values for every head)."""
        d = self.shape(x)[-1]
        g = d if group is None else group
        self._check(g >= 1 and d % g == 0, name, f"norm group {g} does not divide width {d}")
        self._check(w.shape == (g,), name, f"norm weight {w.shape} does not match width {g}")
        params = {"eps": float(eps)}
        if g != d:
            params["group"] = g
        return self._add(name, Op.RMS_NORM, (x,), self.shape(x), layer=layer, weights={"w": w}, **params)

    def matmul(self, x: int, w: WeightRef, name: str, layer: int | None = None,
               bias: WeightRef | None = None) -> int:
        k, n = w.shape
        self._check(self.shape(x)[-1] == k, name, f"input width {self.shape(x)[-1]} != weight in-dim {k}")
        weights = {"w": w}
        if bias is not None:
            self._check(bias.shape == (n,), name, f"bias shape {bias.shape} != ({n},)")
            weights["b"] = bias
        return self._add(name, Op.MATMUL, (x,), (*self.shape(x)[:-1], n), layer=layer, weights=weights)

    def add(self, a: int, b: int, name: str, layer: int | None = None) -> int:
        self._check(self.shape(a) == self.shape(b), name,
                    f"shapes {self.shape(a)} and {self.shape(b)} differ")
        return self._add(name, Op.ADD, (a, b), self.shape(a), layer=layer)

    def rope(self, x: int, positions: int, *, n_heads: int, head_dim: int, n_rot: int, style: str,
             base: float, freq_scale: float, freq_factors: WeightRef | None, name: str,
             layer: int | None = None, attn_factor: float = 1.0, yarn: tuple | None = None,
             long_factors: WeightRef | None = None, n_ctx_orig: int | None = None) -> int:
        """Rotate the first n_rot dims of every head by angle pos * freq_scale * base^(-2i/n_rot)
        (divided by freq_factors[i] when given). style "normal": adjacent pairs (2i, 2i+1), as
        llama.cpp's mode 0; "neox": pairs (i, i + n_rot/2). `attn_factor`, `yarn` (ext_factor,
        n_ctx_orig, beta_fast, beta_slow) and LongRoPE's `long_factors` beyond `n_ctx_orig`: ir.py."""
        self._check(self.shape(x)[-1] == n_heads * head_dim, name,
                    f"width {self.shape(x)[-1]} != {n_heads} heads x {head_dim}")
        self._check(style in ("normal", "neox"), name, f"unknown rope style {style!r}")
        self._check(0 < n_rot <= head_dim and n_rot % 2 == 0, name,
                    f"n_rot {n_rot} not even in 1..{head_dim}")
        self._check(base > 0 and freq_scale > 0, name, f"rope base {base} / freq scale {freq_scale} not > 0")
        self._check(attn_factor > 0, name, f"rope attn_factor {attn_factor} not > 0")
        weights, extra = {}, {}
        for role, ff in (("freq_factors", freq_factors), ("freq_factors_long", long_factors)):
            if ff is not None:
                self._check(ff.shape == (n_rot // 2,), name, f"rope factors {ff.shape} != ({n_rot // 2},)")
                weights[role] = ff
        if long_factors is not None:
            self._check(freq_factors is not None and n_ctx_orig is not None and n_ctx_orig >= 1, name,
                        "LongRoPE needs short factors and n_ctx_orig")
            extra["n_ctx_orig"] = int(n_ctx_orig)
        if attn_factor != 1.0:
            extra["attn_factor"] = float(attn_factor)
        if yarn is not None:
            ext, orig, fast, slow = yarn
            extra["yarn"] = (float(ext), int(orig), float(fast), float(slow))
        return self._add(name, Op.ROPE, (x, positions), self.shape(x), layer=layer, weights=weights,
                         n_heads=n_heads, head_dim=head_dim, n_rot=n_rot, style=style, base=float(base),
                         freq_scale=float(freq_scale), **extra)

    def attention(self, q: int, k: int, v: int, positions: int, *, n_head: int, n_head_kv: int, head_dim: int,
                  kv_layer: int, name: str, layer: int | None = None, scale: float | None = None,
                  window: int = 0, softcap: float = 0.0, sinks: WeightRef | None = None) -> int:
        """Causal attention with the KV cache: k, v of this step go to cache layer `kv_layer` at
        `positions`; each query attends its own sequence's cache up to its position (the last
        `window` positions when window > 0), scores scaled by `scale` (1/sqrt(head_dim) by
        default) and soft-capped when softcap > 0; `sinks` [n_head]: one logit per head added to
        the softmax's denominator (gpt-oss; graph/ir.py)."""
        self._check(n_head % n_head_kv == 0, name, f"{n_head} heads not a multiple of {n_head_kv} kv heads")
        self._check(self.shape(q)[-1] == n_head * head_dim, name, "q width != n_head * head_dim")
        for t in (k, v):
            self._check(self.shape(t)[-1] == n_head_kv * head_dim, name, "k/v width != n_head_kv * head_dim")
        scale = head_dim ** -0.5 if scale is None else float(scale)
        self._check(scale > 0 and window >= 0 and softcap >= 0, name,
                    f"scale {scale}, window {window}, softcap {softcap}: not sane")
        extra = {}
        if window:
            extra["window"] = int(window)
        if softcap:
            extra["softcap"] = float(softcap)
        weights = {}
        if sinks is not None:
            self._check(sinks.shape == (n_head,), name, f"attention sinks {sinks.shape} != ({n_head},)")
            weights["sinks"] = sinks
        return self._add(name, Op.ATTENTION, (q, k, v, positions), self.shape(q), layer=layer, weights=weights,
                         n_head=n_head,
                         n_head_kv=n_head_kv, head_dim=head_dim, kv_layer=kv_layer, scale=scale, **extra)

    def swiglu(self, gate: int, up: int, name: str, layer: int | None = None) -> int:
        self._check(self.shape(gate) == self.shape(up), name, "gate and up shapes differ")
        return self._add(name, Op.SWIGLU, (gate, up), self.shape(gate), layer=layer)

    def swiglu_oai(self, gate: int, up: int, name: str, layer: int | None = None, *, alpha: float,
                   limit: float) -> int:
        """gpt-oss's clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit),
        g * sigmoid(alpha g) * (u + 1) (ggml's swiglu_oai)."""
        self._check(self.shape(gate) == self.shape(up), name, "gate and up shapes differ")
        self._check(alpha > 0 and limit > 0 and alpha != float("inf") and limit != float("inf"), name,
                    f"alpha {alpha} / limit {limit}: not finite and > 0")
        return self._add(name, Op.SWIGLU_OAI, (gate, up), self.shape(gate), layer=layer, alpha=float(alpha),
                         limit=float(limit))

    def geglu(self, gate: int, up: int, name: str, layer: int | None = None) -> int:
        """gelu_tanh(gate) * up (gemma's feed-forward)."""
        self._check(self.shape(gate) == self.shape(up), name, "gate and up shapes differ")
        return self._add(name, Op.GEGLU, (gate, up), self.shape(gate), layer=layer)

    def scale(self, x: int, scale: float, name: str, layer: int | None = None) -> int:
        return self._add(name, Op.SCALE, (x,), self.shape(x), layer=layer, scale=float(scale))

    def softcap(self, x: int, cap: float, name: str, layer: int | None = None) -> int:
        """cap * tanh(x / cap)."""
        self._check(cap > 0, name, f"soft-cap {cap} not > 0")
        return self._add(name, Op.SOFTCAP, (x,), self.shape(x), layer=layer, cap=float(cap))

    def slice(self, x: int, start: int, stop: int, name: str, layer: int | None = None) -> int:
        """Columns start..stop of x (a view: phi3's fused q+k+v and gate+up outputs)."""
        self._check(0 <= start < stop <= self.shape(x)[-1], name, f"slice {start}:{stop} outside {self.shape(x)}")
        return self._add(name, Op.SLICE, (x,), (*self.shape(x)[:-1], stop - start), layer=layer,
                         start=start, stop=stop)

    def pick(self, x: int, index: int, name: str, shape: tuple[Dim, ...], dtype: str = "F32",
             layer: int | None = None) -> int:
        """Value `index` of a node that returns several (MoERoute's weights and ids)."""
        return self._add(name, Op.PICK, (x,), shape, dtype=dtype, layer=layer, index=index)

    # ------------------------------------------------------------------ mixture of experts
    GATINGS = ("softmax", "sigmoid", "softmax_weight")

    def moe_route(self, logits: int, *, n_used: int, gating: str, norm: bool, scale: float, name: str,
                  layer: int | None = None, bias: WeightRef | None = None) -> tuple[int, int]:
        """(weights [T, k], ids [T, k] I32) of the k = n_used experts chosen from router logits
        [T, E] (graph/ir.py MoERoute: gating, selection bias, normalisation, scale)."""
        n_exp = self.shape(logits)[-1]
        self._check(isinstance(n_exp, int) and 1 <= n_used <= n_exp, name,
                    f"{n_used} experts used of {n_exp}: not in 1..{n_exp}")
        self._check(gating in self.GATINGS, name, f"unknown gating {gating!r}; one of {', '.join(self.GATINGS)}")
        self._check(scale > 0 and scale == scale and scale != float("inf"), name, f"weights scale {scale} not > 0")
        weights = {}
        if bias is not None:
            self._check(bias.shape == (n_exp,), name, f"selection bias {bias.shape} != ({n_exp},)")
            weights["b"] = bias
        t = self.shape(logits)[0]
        route = self._add(name, Op.MOE_ROUTE, (logits,), (t, n_used), layer=layer, weights=weights, n_used=n_used,
                          gating=gating, norm=bool(norm), scale=float(scale))
        return (self.pick(route, 0, name + "_weights", (t, n_used), "F32", layer),
                self.pick(route, 1, name + "_ids", (t, n_used), "I32", layer))

    def moe_matmul(self, x: int, ids: int, w: WeightRef, name: str, layer: int | None = None,
                   bias: WeightRef | None = None) -> int:
        """out [T, k, N]: each row's chosen experts (ids [T, k]) applied to x [T, K] (every chosen
        expert of a row reads its row) or x [T, k, K] (slot j feeds expert ids[t, j]); w (K, N, E)."""
        self._check(len(w.shape) == 3, name, f"expert weight {w.name!r} is not 3-D: {w.shape}")
        k_in, n, n_exp = w.shape
        t, used = self.shape(ids)
        xs = self.shape(x)
        self._check(xs[-1] == k_in, name, f"input width {xs[-1]} != expert in-dim {k_in}")
        self._check(len(xs) == 2 or (len(xs) == 3 and xs[1] == used), name,
                    f"input {xs} is neither [T, {k_in}] nor [T, {used}, {k_in}]")
        weights = {"w": w}
        if bias is not None:
            self._check(bias.shape == (n, n_exp), name, f"expert bias {bias.shape} != ({n}, {n_exp})")
            weights["b"] = bias
        return self._add(name, Op.MOE_MATMUL, (x, ids), (t, used, n), layer=layer, weights=weights,
                         n_expert=n_exp)

    def moe_sum(self, y: int, weights: int, name: str, layer: int | None = None) -> int:
        """out [T, N] = sum_j weights[t, j] * y[t, j] (in slot order)."""
        t, used, n = self.shape(y)
        self._check(self.shape(weights) == (t, used), name, f"weights {self.shape(weights)} != {(t, used)}")
        return self._add(name, Op.MOE_SUM, (y, weights), (t, n), layer=layer)

    # ------------------------------------------------------------------ tensor parallelism
    def all_reduce(self, x: int, name: str, layer: int | None = None) -> int:
        """The sum of x over the ranks (the partial outputs of a row-parallel matmul)."""
        return self._add(name, Op.ALL_REDUCE, (x,), self.shape(x), layer=layer)

    def all_gather(self, x: int, widths: tuple[int, ...], rank: int, name: str) -> int:
        """Every rank's x side by side in the last dim: rank r holds `widths[r]` columns."""
        self._check(self.shape(x)[-1] == widths[rank], name, f"width {self.shape(x)[-1]} != this rank's "
                    f"{widths[rank]} of {widths}")
        return self._add(name, Op.ALL_GATHER, (x,), (*self.shape(x)[:-1], sum(widths)), widths=tuple(widths))

    def local_ids(self, ids: int, lo: int, hi: int, name: str) -> int:
        """Indices into this rank's rows [lo, hi) of a vocab-parallel table (0 for the others)."""
        self._check(0 <= lo < hi, name, f"row range {lo}..{hi} is empty")
        return self._add(name, Op.LOCAL_IDS, (ids,), self.shape(ids), dtype="I32", lo=lo, hi=hi)

    def mask_rows(self, x: int, ids: int, lo: int, hi: int, name: str) -> int:
        """x with the rows whose id is outside [lo, hi) zeroed (another rank holds them)."""
        self._check(self.shape(x)[0] == self.shape(ids)[0], name, "rows of x and ids differ")
        return self._add(name, Op.MASK_ROWS, (x, ids), self.shape(x), lo=lo, hi=hi)

    # ------------------------------------------------------------------ result
    def build(self, output: int) -> Graph:
        return Graph(tuple(self._nodes), dict(self._inputs), output, dict(self._weights), self._meta)

