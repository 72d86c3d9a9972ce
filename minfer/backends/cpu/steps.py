"""The cpu backend's op table: for each graph op, how it runs on the cpu (the reference math of
ops.py, the prepared weights of weights.py, the KV cache the backend owns). Adding an op to the
cpu is one entry here.

An entry is `compile(backend, node)` -> a step function `fn(values, state)` for every way of
running, or ({way: fn}, {way: kernel name} or None) where decode rows and prompt chunks differ
(KINDS: "decode", "prefill")."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ...graph.ir import Node, Op
from ...kernels.cpu import vnni as cpu_vnni
from ..rope import rope_key
from . import ops as cpu_ops

if TYPE_CHECKING:
    from .backend import CPUBackend, _State

KINDS = ("decode", "prefill")  # the ways a step runs: decode rows (compact weights), prompt chunks


def _add_into(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y written into x when x is the float32 sum (the same values as x + y)."""
    return x.add_(y) if x.dtype == torch.float32 else x + y




def _input(be: CPUBackend, node: Node):
    name = node.name
    return lambda vals, st: getattr(st.batch, name)


def _get_rows(be: CPUBackend, node: Node):
    if "w" in node.weights:
        (i,), table = node.inputs, be.table(node.weights["w"].name)
        return lambda vals, st: table(vals[i])
    i, r = node.inputs
    return lambda vals, st: vals[i].index_select(0, vals[r])


def _rms_norm(be: CPUBackend, node: Node):
    # bfloat16 straight away when only int4 matmuls read it (they would convert it first)
    dtype = torch.bfloat16 if be.int4_inputs(node) else torch.float32
    (i,), norm = node.inputs, cpu_ops.RMSNorm(be.vector(node.weights["w"].name), node.params["eps"], dtype, be.vnni,
                                              node.params.get("group"))
    return lambda vals, st: norm(vals[i])


def _matmul(be: CPUBackend, node: Node):
    m = be.matrix(node.weights["w"], node.weights.get("b"))
    (i,) = node.inputs
    kernels = {"decode": m.kernel(True), "prefill": m.kernel(False)}
    if node.id == be.graph.logits_id:  # logits are float32 whatever the weight's path
        # and the VNNI kernels give them the decode rows' two activation passes in prompts too
        fn = lambda vals, st: m(vals[i], st.decode, passes=2).float()  # noqa: E731
        return dict.fromkeys(KINDS, fn), dict.fromkeys(KINDS, m.kernel(True))
    direct = m.direct()
    if direct is not None:  # one quantized kernel, no bias: called as it is
        kind, mm = direct
        if kind == "vnni":  # the activations' int8 passes: Matrix.passes
            (pd,), (pp,) = m.passes(True), m.passes(False)
            return {"decode": lambda vals, st: mm(vals[i], pd), "prefill": lambda vals, st: mm(vals[i], pp)}, kernels
        fn = lambda vals, st: mm(vals[i])  # noqa: E731
        return dict.fromkeys(KINDS, fn), kernels
    return {"decode": lambda vals, st: m(vals[i], True), "prefill": lambda vals, st: m(vals[i], False)}, kernels


def _add(be: CPUBackend, node: Node):
    i, j = node.inputs
    if be.owned_last_use(node, i):  # the residual stream: added to in place
        return lambda vals, st: _add_into(vals[i], vals[j])
    return lambda vals, st: vals[i] + vals[j]


def _slice(be: CPUBackend, node: Node):
    (i,), a, b = node.inputs, node.params["start"], node.params["stop"]
    return lambda vals, st: vals[i][..., a:b]


def _glu(be: CPUBackend, node: Node, c_fn, torch_fn, kernel: str):
    i, j = node.inputs
    # float32 rows on the C kernel (native.py's decode program runs the same one, so the program on or off
    # gives the same bits); torch's where the C kernels are off (MINFER_CPU_VNNI=0, no AVX2)
    if be.vnni and cpu_vnni.available():

        def run_c(vals, st):
            g, u = vals[i], vals[j]
            if g.dtype == torch.float32 and g.dim() == 2 and g.stride(1) == 1 and u.stride(1) == 1:
                return c_fn(g, u)
            return torch_fn(g, u)

        return dict.fromkeys(KINDS, run_c), dict.fromkeys(KINDS, kernel)
    return lambda vals, st: torch_fn(vals[i], vals[j])


def _swiglu(be: CPUBackend, node: Node):
    return _glu(be, node, cpu_vnni.swiglu, cpu_ops.swiglu, "cpu_swiglu")


def _swiglu_oai(be: CPUBackend, node: Node):
    (i, j), alpha, limit = node.inputs, node.params["alpha"], node.params["limit"]
    return lambda vals, st: cpu_ops.swiglu_oai(vals[i], vals[j], alpha, limit)


def _geglu(be: CPUBackend, node: Node):
    return _glu(be, node, cpu_vnni.geglu, cpu_ops.geglu, "cpu_geglu")


def _scale(be: CPUBackend, node: Node):
    (i,), c = node.inputs, node.params["scale"]
    return lambda vals, st: cpu_ops.scale(vals[i], c)


def _softcap(be: CPUBackend, node: Node):
    (i,), c = node.inputs, node.params["cap"]
    return lambda vals, st: cpu_ops.softcap(vals[i], c)


def _rope(be: CPUBackend, node: Node):
    p = node.params
    key = rope_key(node)
    i, pos = node.inputs
    n_heads, hd, n_rot, style = p["n_heads"], p["head_dim"], p["n_rot"], p["style"]

    if be.vnni and cpu_vnni.available() and style in ("normal", "neox"):  # the C kernel: one call a node
        neox = style == "neox"

        def run_c(vals, st: _State) -> torch.Tensor:
            rows = st.rope.get(key)
            if rows is None:  # first RoPE node of the step: the tokens' cos / sin rows, for all layers
                cos, sin = be._ropes[key]
                positions = vals[pos]
                rows = st.rope[key] = (cos[positions].contiguous(), sin[positions].contiguous())
            return cpu_vnni.rope(vals[i], *rows, n_heads, hd, n_rot, neox)

        return run_c

    def run(vals, st: _State) -> torch.Tensor:
        rot = st.rope.get(key)
        if rot is None:  # first RoPE node of the step: the tokens' rotations, for all layers
            cos, sin = be._ropes[key]
            positions = vals[pos]
            rot = st.rope[key] = cpu_ops.rope_rotation(cos[positions], sin[positions])
        return cpu_ops.apply_rope(vals[i], rot, n_heads, hd, n_rot, style)

    return run


def _attention(be: CPUBackend, node: Node):
    p = node.params
    q_i, k_i, v_i, _ = node.inputs
    layer, n_head, n_kv, hd, scale = p["kv_layer"], p["n_head"], p["n_head_kv"], p["head_dim"], p["scale"]
    window, softcap = p.get("window", 0), p.get("softcap", 0.0)
    sinks = be.vector(node.weights["sinks"].name) if "sinks" in node.weights else None

    def decode(vals, st: _State) -> torch.Tensor:  # one query per sequence, over its own cache
        q, k, v = vals[q_i], vals[k_i], vals[v_i]
        rows = q.shape[0]
        kc, vc = be._flat[0][layer], be._flat[1][layer]  # [slot * n_kv * n_ctx, hd]
        kc.index_copy_(0, st.at, k.reshape(rows * n_kv, hd).to(kc.dtype))  # each row at its slot, position
        vc.index_copy_(0, st.at, v.reshape(rows * n_kv, hd).to(vc.dtype))
        if st.lens is not None:  # every row in one call (q4_vnni.c attn_decode), a window's first key per row
            starts = None
            if window:  # (once a step per window size)
                starts = st.starts.get(window)
                if starts is None:
                    starts = st.starts[window] = (st.lens - window).clamp_(min=0)
            return cpu_vnni.attention_decode(q, st.cache.k[layer], st.cache.v[layer], st.batch.row_slots,
                                             st.lens, n_head, scale, starts, softcap, sinks)
        # a window only matters once some row is `window` positions in (the plain paths before that)
        if softcap or sinks is not None or (window and max(s.end for s in st.batch.spans) > window):
            return each_row(q, st)
        if rows == 1:
            keys, values = st.views[0]
            out = cpu_ops.attention_decode(q.view(1, n_head, 1, hd), keys[layer], values[layer], scale)
            return out.view(1, n_head * hd)
        qs = q.view(rows, 1, n_head, 1, hd).unbind(0)
        return torch.cat([cpu_ops.attention_decode(qs[b], keys[layer], values[layer], scale)
                          for b, (keys, values) in enumerate(st.views)]).view(rows, n_head * hd)

    def each_row(q: torch.Tensor, st: _State) -> torch.Tensor:
        """Every row alone over its slot's keys up to its position (torch): a row's numbers depend on
        its own position only, as a decode row's do (the same calls as the decode path's)."""
        rows = q.shape[0]
        slots, pos = st.batch.row_slots.tolist(), st.batch.positions.tolist()
        k_all, v_all = st.cache.k[layer], st.cache.v[layer]
        if not softcap and sinks is None:  # one query sees a contiguous run of keys: SDPA over the window's slice
            qs = q.reshape(rows, 1, n_head, 1, hd).unbind(0)
            keys = [slice(max(0, p + 1 - window) if window else 0, p + 1) for p in pos]
            return torch.cat([cpu_ops.attention_decode(qs[b], k_all[slots[b], :, keys[b]].unsqueeze(0),
                                                       v_all[slots[b], :, keys[b]].unsqueeze(0), scale).view(1, -1)
                              for b in range(rows)])
        qs = q.reshape(rows, 1, n_head, hd).unbind(0)
        return torch.cat([cpu_ops.attention_masked(qs[b], k_all[slots[b], :, :pos[b] + 1],
                                                   v_all[slots[b], :, :pos[b] + 1], pos[b], scale,
                                                   window, softcap, sinks) for b in range(rows)])

    def prefill(vals, st: _State) -> torch.Tensor:
        # Each row attends as a decode row at its position would (the C kernel, or one SDPA call per row):
        # its numbers do not depend on which rows share its chunk or where the chunk starts, so a prompt
        # whose first part is reused (a slot's cached tokens, prefix-cache blocks) computes the rest with
        # the bits of a fresh run. (One causal SDPA over the chunk rounds a row by the chunk's shape: 1e-7
        # there, which the int8 activations of the next matmul turn into logits ~0.5 apart.)
        kc, vc = st.cache.k[layer], st.cache.v[layer]
        k = vals[k_i].unflatten(-1, (n_kv, hd)).transpose(0, 1)
        v = vals[v_i].unflatten(-1, (n_kv, hd)).transpose(0, 1)
        for s in st.batch.spans:
            rows = slice(s.offset, s.offset + s.n_tokens)
            kc[s.slot, :, s.start:s.end] = k[:, rows]
            vc[s.slot, :, s.start:s.end] = v[:, rows]
        q = vals[q_i]
        if be._c_attention:  # every row in one call (q4_vnni.c attn_decode), as the decode rows
            lens = st.batch.positions + 1
            starts = (lens - window).clamp_(min=0) if window else None
            return cpu_vnni.attention_decode(q, kc, vc, st.batch.row_slots, lens, n_head, scale, starts, softcap,
                                             sinks)
        return each_row(q, st)

    return {"decode": decode, "prefill": prefill}, None


def _pick(be: CPUBackend, node: Node):
    (i,), j = node.inputs, node.params["index"]
    return lambda vals, st: vals[i][j]


def _moe_route(be: CPUBackend, node: Node):
    (i,), p = node.inputs, node.params
    bias = be.vector(node.weights["b"].name) if "b" in node.weights else None
    n_used, gating, norm, scale = p["n_used"], p["gating"], p["norm"], p["scale"]
    return lambda vals, st: cpu_ops.moe_route(vals[i], n_used, gating, norm, scale, bias)


def _moe_matmul(be: CPUBackend, node: Node):
    x, ids = node.inputs
    experts = be.experts(node.weights["w"].name)
    bias = be.vector(node.weights["b"].name).view(experts.e, experts.n) if "b" in node.weights else None
    if bias is None:
        return lambda vals, st: experts(vals[x], vals[ids], st.decode)
    return lambda vals, st: experts(vals[x], vals[ids], st.decode).add_(bias[vals[ids].long()])


def _moe_sum(be: CPUBackend, node: Node):
    y, w = node.inputs
    return lambda vals, st: cpu_ops.moe_sum(vals[y], vals[w])


CPU_OPS = {
    Op.INPUT: _input, Op.GET_ROWS: _get_rows, Op.RMS_NORM: _rms_norm, Op.MATMUL: _matmul, Op.ADD: _add,
    Op.SLICE: _slice, Op.SWIGLU: _swiglu, Op.SWIGLU_OAI: _swiglu_oai, Op.GEGLU: _geglu, Op.SCALE: _scale,
    Op.SOFTCAP: _softcap, Op.ROPE: _rope,
    Op.ATTENTION: _attention, Op.PICK: _pick, Op.MOE_ROUTE: _moe_route, Op.MOE_MATMUL: _moe_matmul,
    Op.MOE_SUM: _moe_sum,
}
