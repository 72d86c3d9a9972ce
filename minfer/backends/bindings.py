"""How the GPU backends call each op: the one table the shared compiler (compile.py) reads.

A `Binding` gives an op's `Call` (what the picker matches against the contracts: dtypes, shapes
as a function of the row count, params, layouts) and binds a chosen kernel into a step function
`fn(values, state)`. An op whose contract inputs are the node's inputs (F32 rows) then its 1-D
weights, and whose params are the node's, is bound by `generic` and needs no entry: adding such
an op to the GPU backends is its contracts and launchers only. The entries here name operands
that are not node inputs: weights in a kernel's load layout, embedding tables, RoPE tables, the
KV cache, a fused node's several values.

Per-step side values travel in `state.aux` (node id -> value): the int8 records of x a node
writes for the matmuls that read them (compile.py's q8 pairing), a deferred RMSNorm's row tiles'
sums of squares and eps (its readers' `rstd`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..contracts.ops import op_spec
from ..contracts.registry import BoundKernel
from ..graph.ir import Node, Op
from ..quant.types import GGMLType, quant_info
from .calls import STRIDED, Binding, Bound, Call, Launch, Way, type_runs
from .rope import rope_key

if TYPE_CHECKING:
    from .compile import Compiler


def _strided(c: Compiler, i: int, rows: int) -> bool:
    """Whether value `i` is a row-strided view at `rows` rows (a slice of a wider value)."""
    src = c.node_of(i)
    return rows > 1 and src is not None and src.op == Op.SLICE


def _layouts(c: Compiler, node: Node, names) -> callable:
    pairs = [(n, i) for n, i in zip(names, node.inputs, strict=False)]
    return lambda r: {n: STRIDED for n, i in pairs if _strided(c, i, r)} or None


def _rows(t) -> int:
    return t.shape[0] if len(t.shape) > 1 else 1


def _q8_writer(c: Compiler, node: Node, way: Way, width: int):
    """For a node that writes x's int8 records in `way`: step(vals, st, launch) wrapping, else None."""
    passes = c.q8_link(node, way) if node.params.get("q8_out") else 0
    if not passes:
        return None
    rt, nid = c.rt, node.id

    def records(st, rows: int):
        rec = st.aux[nid] = rt.q8_records(rows, width, passes)
        return rec

    return records


def _rstd_of(c: Compiler, node: Node, way: Way) -> int | None:
    """The QMatMulAddNorm id whose (sums of squares, eps) a matmul reads as rstd in `way`, or None."""
    p = c.rstd_read(node, way)
    return None if p is None else p.id


def _xq(c: Compiler, node: Node, way: Way, kernel: BoundKernel):
    """The producer id whose int8 records a matmul reads in `way`, or None."""
    return c.q8_read(node, way, kernel)


# ---------------------------------------------------------------------- generic ops
def _generic_call(c: Compiler, node: Node) -> Call | None:
    spec = op_spec(str(node.op))
    if spec is None:
        return None
    ins = spec.inputs[:len(node.inputs)]
    widths = {name: c.node_of(i).shape[-1] for name, i in zip(ins, node.inputs, strict=False)}
    weights = {name: node.weights[name].shape for name in spec.inputs[len(ins):] if name in node.weights}
    if len(ins) + len(weights) != len(spec.inputs):
        return None
    params = {k: node.params[k] for k in spec.params if k in node.params}
    dtypes = dict.fromkeys((*ins, *weights), "F32")
    return Call(str(node.op), dtypes, lambda r: {**{n: (r, w) for n, w in widths.items()}, **weights}, params,
                _layouts(c, node, ins))


def _generic_bind(c: Compiler, node: Node, kernel: BoundKernel, call: Call, way: Way) -> Bound:
    spec = op_spec(str(node.op))
    ins = list(zip(spec.inputs, node.inputs, strict=False))
    vecs = {name: c.vector(node.weights[name]) for name in spec.inputs[len(ins):]}
    params = dict(call.params)
    launch = [Launch(call, kernel)]
    records = _q8_writer(c, node, way, node.shape[-1])
    if records is not None:
        def fn(vals, st):
            args = {n: vals[i] for n, i in ins}
            return kernel(**args, **vecs, **params, q8=records(st, _rows(args[ins[0][0]])))

        return Bound(fn, launch)
    if len(ins) == 2:  # the common shape, without building a dict per call
        (n0, i0), (n1, i1) = ins
        return Bound(lambda vals, st: kernel(**{n0: vals[i0], n1: vals[i1]}, **vecs, **params), launch)
    if len(ins) == 1:
        ((n0, i0),) = ins
        return Bound(lambda vals, st: kernel(**{n0: vals[i0]}, **vecs, **params), launch)
    return Bound(lambda vals, st: kernel(**{n: vals[i] for n, i in ins}, **vecs, **params), launch)


generic = Binding(_generic_call, _generic_bind)


# ---------------------------------------------------------------------- table lookups
def _get_rows_call(c: Compiler, node: Node) -> Call:
    if "w" not in node.weights:  # the rows whose logits the step returns
        d = node.shape[-1]
        return Call("RowSelect", {"x": "F32", "rows": "I32"}, lambda n: {"x": (max(n, 1), d), "rows": (1,)}, {},
                    lambda r: {"x": STRIDED})
    w = node.weights["w"]
    t = c.type_of(w.name)
    n_embd, n_rows = w.shape[0], w.shape[1]
    params = {"qtype": t, "n_embd": n_embd}
    table = (n_rows, quant_info(t).nbytes(n_embd))
    return Call("GetRows", {"weight_u8": quant_info(t).contract_name, "ids": "I32"},
                lambda r: {"weight_u8": table, "ids": (r,)}, params)


def _get_rows_bind(c: Compiler, node: Node, kernel: BoundKernel, call: Call, way: Way) -> Bound:
    launch = [Launch(call, kernel)]
    if "w" not in node.weights:
        i, r = node.inputs
        return Bound(lambda vals, st: kernel(x=vals[i], rows=vals[r]), launch)
    (i,), params = node.inputs, call.params
    w = node.weights["w"]
    chunks = type_runs(w, c.type_of, c.rt.max_weight_bytes)
    if len(chunks) > 1:  # a table larger than the device binds at once: one gather per chunk of rows
        return _get_rows_chunks(c, node, call, way, chunks)
    table = c.rt.table(w.name) if c.rt.upload else None
    return Bound(lambda vals, st: kernel(weight_u8=table, ids=vals[i], **params), launch)


def _get_rows_chunks(c: Compiler, node: Node, call: Call, way: Way, chunks: list) -> Bound:
    """The gather over a table cut into chunks of rows (calls.type_runs): each chunk's kernel
    (`caps.also: row_chunk`) writes the rows whose ids fall in its chunk into the one output."""
    (i,), params = node.inputs, call.params
    n_embd, total = node.weights["w"].shape
    chunk_call = call.needing("row_chunk")
    kernel = c.choose(node, chunk_call, way.rows).kernel
    rt = c.rt
    tables = [(rt.weight_bytes(ref) if rt.upload else None, a) for ref, _, a, _ in chunks]

    def fn(vals, st):
        ids = vals[i]
        out = rt.empty((ids.shape[0], n_embd))
        for table, first in tables:
            kernel(weight_u8=table, ids=ids, **params, out=out, first_row=first, total_rows=total)
        return out

    return Bound(fn, [Launch(chunk_call, kernel) for _ in tables])


# ---------------------------------------------------------------------- RoPE, attention
def _rope_params(p: dict) -> dict:
    return {"n_heads": p["n_heads"], "head_dim": p["head_dim"], "n_rot": p["n_rot"], "neox": p["style"] == "neox"}


def _rope_call(c: Compiler, node: Node) -> Call:
    params = _rope_params(node.params)
    width, half = params["n_heads"] * params["head_dim"], params["n_rot"] // 2
    return Call("RoPE", {"x": "F32", "positions": "I32", "cos": "F32", "sin": "F32"},
                lambda r: {"x": (r, width), "positions": (r,), "cos": (16, half), "sin": (16, half)}, params,
                lambda r: {"x": STRIDED})


def _rope_bind(c: Compiler, node: Node, kernel: BoundKernel, call: Call, way: Way) -> Bound:
    i, pos = node.inputs
    key, rope, params = rope_key(node), c.rt.rope, call.params

    def fn(vals, st):
        cos, sin = rope(key)
        return kernel(x=vals[i], positions=vals[pos], cos=cos, sin=sin, **params)

    return Bound(fn, [Launch(call, kernel)])


def _norm_rope_call(c: Compiler, node: Node) -> Call:
    params = {**_rope_params(node.params), "n_heads_k": node.params["n_heads_k"], "eps": node.params["eps"]}
    width, hd, half = c.node_of(node.inputs[0]).shape[-1], params["head_dim"], params["n_rot"] // 2
    return Call("NormRoPE", {"x": "F32", "w_q": "F32", "w_k": "F32", "positions": "I32", "cos": "F32", "sin": "F32"},
                lambda r: {"x": (r, width), "w_q": (hd,), "w_k": (hd,), "positions": (r,), "cos": (16, half),
                           "sin": (16, half)}, params)


def _norm_rope_bind(c: Compiler, node: Node, kernel: BoundKernel, call: Call, way: Way) -> Bound:
    """(rotated q, rotated k): two column views of the kernel's one output."""
    i, pos = node.inputs
    key, rt, params = rope_key(node), c.rt, call.params
    w_q, w_k = c.vector(node.weights["q_norm"]), c.vector(node.weights["k_norm"])
    nq = params["n_heads"] * params["head_dim"]
    n = nq + params["n_heads_k"] * params["head_dim"]

    def fn(vals, st):
        cos, sin = rt.rope(key)
        y = kernel(x=vals[i], w_q=w_q, w_k=w_k, positions=vals[pos], cos=cos, sin=sin, **params)
        return rt.cols(y, 0, nq), rt.cols(y, nq, n)

    return Bound(fn, [Launch(call, kernel)])


def _attention_call(c: Compiler, node: Node) -> Call:
    p = node.params
    nh, nkv, hd = p["n_head"], p["n_head_kv"], p["head_dim"]
    cache, dt = c.rt.kv_shape(c.graph.meta["n_layer"], nkv, hd), c.rt.kv_dtype
    dtypes = {"q": "F32", "k": "F32", "v": "F32", "cache_k": dt, "cache_v": dt, "row_slots": "I32", "positions": "I32"}
    params = {"layer": p["kv_layer"], "n_head": nh, "n_head_kv": nkv, "head_dim": hd, "scale": p["scale"],
              "window": p.get("window", 0), "softcap": p.get("softcap", 0.0)}

    def shapes(rows):
        return {"q": (rows, nh * hd), "k": (rows, nkv * hd), "v": (rows, nkv * hd), "cache_k": cache,
                "cache_v": cache, "row_slots": (rows,), "positions": (rows,)}

    needs = frozenset({"sinks"}) if "sinks" in node.weights else frozenset()  # gpt-oss: a kernel that takes them
    return Call("Attention", dtypes, shapes, params, lambda r: {"q": STRIDED, "k": STRIDED, "v": STRIDED},
                needs=needs)


def _attention_bind(c: Compiler, node: Node, kernel: BoundKernel, call: Call, way: Way) -> Bound:
    q, k, v, pos = node.inputs
    layer, kv = node.params["kv_layer"], c.rt.kv
    params = {n: call.params[n] for n in ("n_head", "n_head_kv", "head_dim", "scale", "window", "softcap")}
    if "kv_skip" in call.needs:  # the q+k+v GEMV before it wrote this row's keys and values
        params["kv_written"] = True
    if "sinks" in node.weights:
        params["sinks"] = c.vector(node.weights["sinks"])
    records = _q8_writer(c, node, way, node.shape[-1])

    def fn(vals, st):
        ck, cv, li = kv(layer)
        more = {} if records is None else {"q8": records(st, _rows(vals[q]))}
        return kernel(q=vals[q], k=vals[k], v=vals[v], cache_k=ck, cache_v=cv, row_slots=st.inputs["row_slots"],
                      positions=vals[pos], layer=li, spans=st.spans, tiles=st.tiles, **params, **more)

    return Bound(fn, [Launch(call, kernel)])


# ---------------------------------------------------------------------- matmuls
def _qmatmul_call(c: Compiler, node: Node, op: str = "QMatMul", w=None) -> Call | None:
    w = w or node.weights["w"]
    k, n = w.shape
    wq = c.matmul_type(w)
    if wq is None:  # parts of different types: their dense f16 copy (or one kernel per type run)
        if op != "QMatMul":
            return None
        wq = GGMLType.F16
    return Call(op, {"x": "F32", "w": quant_info(wq).contract_name}, lambda m: {"x": (m, k), "w": (n, k)},
                {"n": n, "k": k, "qtype": wq}, _layouts(c, node, ("x",)), c.mmq if op == "QMatMul" else None)


def _with_bias(c: Compiler, node: Node, way: Way, launches: list[Launch]):
    """(AddBias kernel, bias vector) of a matmul with a bias, its launch recorded; (None, None) without."""
    if "b" not in node.weights:
        return None, None
    n = node.weights["w"].shape[1]
    call = Call("AddBias", {"y": "F32", "b": "F32"}, lambda m: {"y": (m, n), "b": (n,)}, {"n_rows": 1})
    kernel = c.choose(node, call, 1).kernel
    launches.append(Launch(call, kernel))
    return kernel, c.vector(node.weights["b"])


def _matmul_bind(c: Compiler, node: Node, kernel: BoundKernel, call: Call, way: Way) -> Bound:
    w = node.weights["w"]
    k, n = w.shape
    (i,) = node.inputs
    launches = []
    runs = type_runs(w, c.type_of, c.rt.max_weight_bytes)
    if (c.matmul_type(w) is None or len(runs) > 1) and (way.rows == 1 or c.rt.column_outputs):
        fn = _type_runs(c, node, way, launches, runs)  # one kernel per run of one type, each into its columns
    else:
        launches.append(Launch(call, kernel))
        laid, params = c.laid_out(kernel, w, call.params), call.params
        pid, nid = c.q8_read(node, way, kernel), _rstd_of(c, node, way)
        if pid is not None:
            fn = lambda vals, st: kernel(x=vals[i], w=laid, **params, xq=st.aux[pid])  # noqa: E731
        elif nid is not None:
            fn = lambda vals, st: kernel(x=vals[i], w=laid, **params, rstd=st.aux[nid])  # noqa: E731
        else:
            fn = lambda vals, st: kernel(x=vals[i], w=laid, **params)  # noqa: E731
    add_bias, bias = _with_bias(c, node, way, launches)
    if add_bias is None:
        return Bound(fn, launches)

    def biased(vals, st):
        y = fn(vals, st)
        add_bias(y=y, b=bias, n_rows=_rows(y))
        return y

    return Bound(biased, launches)


def _type_runs(c: Compiler, node: Node, way: Way, launches: list[Launch], weight_runs: list):
    """A fused weight whose parts differ in type (or a weight larger than the device binds at once):
    per run of one type (per chunk of rows) its own kernel, picked like any matmul's, writing its
    columns of the one output."""
    w, (i,) = node.weights["w"], node.inputs
    k, n = w.shape
    runs = []
    for ref, _, a, b in weight_runs:
        call = _qmatmul_call(c, node, w=ref)
        kernel = c.choose(node, call, way.rows).kernel
        launches.append(Launch(call, kernel))
        runs.append((kernel, c.laid_out(kernel, ref, call.params), a, b, call.params))
    rt = c.rt

    def fn(vals, st):
        x = vals[i]
        y = rt.empty((_rows(x), n))
        for kernel, laid, a, b, params in runs:
            kernel(x=x, w=laid, **params, out=rt.cols(y, a, b))
        return y

    return fn


def _swiglu_call(c: Compiler, node: Node) -> Call | None:
    return _qmatmul_call(c, node, str(node.op))  # QMatMulSwiGLU or QMatMulGeGLU: one weight, one output


def _swiglu_bind(c: Compiler, node: Node, kernel: BoundKernel, call: Call, way: Way) -> Bound:
    (i,), params = node.inputs, call.params
    laid = c.laid_out(kernel, node.weights["w"], params)
    pid, nid = c.q8_read(node, way, kernel), _rstd_of(c, node, way)
    if pid is not None:
        return Bound(lambda vals, st: kernel(x=vals[i], w=laid, **params, xq=st.aux[pid]), [Launch(call, kernel)])
    if nid is not None:
        return Bound(lambda vals, st: kernel(x=vals[i], w=laid, **params, rstd=st.aux[nid]), [Launch(call, kernel)])
    return Bound(lambda vals, st: kernel(x=vals[i], w=laid, **params), [Launch(call, kernel)])


def _matmul_rope_call(c: Compiler, node: Node) -> Call | None:
    base = _qmatmul_call(c, node, "QMatMulRoPE")
    if base is None:
        return None
    k, n = node.weights["w"].shape
    params = {**base.params, **_rope_params(node.params)}
    half = params["n_rot"] // 2
    return Call("QMatMulRoPE", {**base.dtypes, "b": "F32", "positions": "I32", "cos": "F32", "sin": "F32"},
                lambda r: {"x": (r, k), "w": (n, k), "b": (n,), "positions": (r,), "cos": (16, half),
                           "sin": (16, half)}, params)


def _matmul_rope_bind(c: Compiler, node: Node, kernel: BoundKernel, call: Call, way: Way) -> Bound:
    x, pos = node.inputs
    w, params = node.weights["w"], call.params
    k, n = w.shape
    laid = c.laid_out(kernel, w, params)
    rt = c.rt
    b = c.vector(node.weights["b"]) if "b" in node.weights else (rt.zeros(n) if rt.upload else None)
    key, nqk = rope_key(node), params["n_heads"] * params["head_dim"]
    pid, nid = c.q8_read(node, way, kernel), _rstd_of(c, node, way)
    kv = "kv_out_f16" in call.needs
    layer, nkv = node.params.get("kv_layer"), node.params.get("n_head_kv")

    def fn(vals, st):
        cos, sin = rt.rope(key)
        more = {} if pid is None else {"xq": st.aux[pid]}
        if nid is not None:
            more["rstd"] = st.aux[nid]
        if kv:
            ck, cv, li = rt.kv(layer)
            more.update(cache_k=ck, cache_v=cv, row_slots=st.inputs["row_slots"], layer=li, n_head_kv=nkv)
        y = kernel(x=vals[x], w=laid, b=b, positions=vals[pos], cos=cos, sin=sin, **params, **more)
        return rt.cols(y, 0, nqk), y

    return Bound(fn, [Launch(call, kernel)])


# ---------------------------------------------------------------------- fused norms
def _add_rms_norm_call(c: Compiler, node: Node) -> Call:
    d, eps = node.shape[-1], node.params["eps"]
    ws = ("w_y", "w") if "w_y" in node.weights else ("w",)  # NormAddRMSNorm: the post-norm's weight too
    return Call(str(node.op), {"x": "F32", "y": "F32", **dict.fromkeys(ws, "F32")},
                lambda r: {"x": (r, d), "y": (r, d), **dict.fromkeys(ws, (d,))}, {"eps": eps})


def _add_rms_norm_bind(c: Compiler, node: Node, kernel: BoundKernel, call: Call, way: Way) -> Bound:
    """(h, RMSNorm(h)), h = x + y (x + RMSNorm(y) for NormAddRMSNorm) written over x where the
    kernel works in place (the rule made sure nothing reads x after), else into a fresh buffer."""
    i, j = node.inputs
    ws = {r: c.vector(w) for r, w in node.weights.items()}
    eps, rt, in_place = node.params["eps"], c.rt, "residual_in_place" in kernel.contract.caps.also
    records = _q8_writer(c, node, way, node.shape[-1])

    def fn(vals, st):
        x = vals[i]
        h = x if in_place else rt.empty(x.shape)
        more = {} if records is None else {"q8": records(st, _rows(x))}
        return h, kernel(x=x, y=vals[j], **ws, eps=eps, sum_out=h, **more)

    return Bound(fn, [Launch(call, kernel)])


def _add_norm_call(c: Compiler, node: Node) -> Call | None:
    base = _qmatmul_call(c, node, "QMatMulAddNorm")
    if base is None:
        return None
    k, n = node.weights["w"].shape
    return Call("QMatMulAddNorm", {**base.dtypes, "res": "F32", "w_n": "F32"},
                lambda m: {"x": (m, k), "w": (n, k), "res": (m, n), "w_n": (n,)}, base.params)


def _add_norm_bind(c: Compiler, node: Node, kernel: BoundKernel, call: Call, way: Way) -> Bound:
    """A deferred RMSNorm (QMatMulAddNorm run whole: compile.py `rstd_link`): (h, h * w_n), h = res +
    x @ W^T written over res (the rule made sure nothing reads res after); the row tiles' sums of h^2
    and eps into state.aux for the matmuls that read h * w_n with rstd."""
    x, res = node.inputs
    params, rt, nid, eps = call.params, c.rt, node.id, node.params["eps"]
    laid = c.laid_out(kernel, node.weights["w"], params)
    w_n = c.vector(node.weights["w_n"])

    def fn(vals, st):  # (its x is f32: rstd_link runs it whole only there)
        h = vals[res]
        ss = rt.norm_sums(params["n"], params["k"], params["qtype"])
        out = kernel(x=vals[x], w=laid, res=h, w_n=w_n, **params, ss=ss)
        st.aux[nid] = (ss, eps)
        return h, out

    return Bound(fn, [Launch(call, kernel)])


# ---------------------------------------------------------------------- mixtures of experts
def _moe_route_call(c: Compiler, node: Node) -> Call:
    p, e = node.params, c.node_of(node.inputs[0]).shape[-1]
    params = {"n_used": p["n_used"], "gating": p["gating"], "norm": p["norm"], "scale": p["scale"]}
    return Call("MoERoute", {"logits": "F32", "bias": "F32"}, lambda r: {"logits": (r, e), "bias": (e,)}, params,
                _layouts(c, node, ("logits",)))


def _moe_route_bind(c: Compiler, node: Node, kernel: BoundKernel, call: Call, way: Way) -> Bound:
    """(weights, ids): the bias is the file's selection bias, or zeros (the same choice as none)."""
    (i,), params = node.inputs, call.params
    e = call.shapes(1)["bias"][0]
    rt = c.rt
    bias = c.vector(node.weights["b"]) if "b" in node.weights else (rt.zeros(e) if rt.upload else None)
    return Bound(lambda vals, st: kernel(logits=vals[i], bias=bias, **params), [Launch(call, kernel)])


def _moe_matmul_call(c: Compiler, node: Node) -> Call:
    w = node.weights["w"]
    k, n, e = w.shape
    t = c.type_of(w.name)
    x_shape = c.node_of(node.inputs[0]).shape
    used = node.shape[1]
    per_slot = len(x_shape) == 3
    params = {"n": n, "k": k, "qtype": t, "n_expert": e}
    needs = frozenset({"expert_bias"}) if "b" in node.weights else frozenset()  # gpt-oss: added in the epilogue
    return Call("MoEMatMul", {"x": "F32", "ids": "I32", "w": quant_info(t).contract_name},
                lambda r: {"x": (r, used, k) if per_slot else (r, k), "ids": (r, used), "w": (e * n, k)}, params,
                needs=needs)


def _moe_matmul_bind(c: Compiler, node: Node, kernel: BoundKernel, call: Call, way: Way) -> Bound:
    x, ids = node.inputs
    laid, params = c.laid_out(kernel, node.weights["w"], call.params), call.params
    if "b" in node.weights:  # each chosen expert's bias, [E, n] (GGUF (n, E)) as one f32 vector
        bias = c.vector(node.weights["b"])
        return Bound(lambda vals, st: kernel(x=vals[x], ids=vals[ids], w=laid, **params, bias=bias),
                     [Launch(call, kernel)])
    return Bound(lambda vals, st: kernel(x=vals[x], ids=vals[ids], w=laid, **params), [Launch(call, kernel)])


def _moe_glu_call(c: Compiler, node: Node) -> Call | None:
    """MoEMatMulGLU: the stacked gate + up expert weight (k, n, 2 E); None where the two tensors'
    types differ (the parts then run)."""
    w = node.weights["w"]
    k, n, e2 = w.shape
    t = c.matmul_type(w)
    if t is None:
        return None
    used = node.shape[1]
    p = node.params
    params = {"n": n, "k": k, "qtype": t, "n_expert": e2 // 2, "glu": p["glu"], "alpha": p["alpha"],
              "limit": p["limit"]}
    needs = frozenset({"expert_bias"}) if "b" in node.weights else frozenset()
    return Call("MoEMatMulGLU", {"x": "F32", "ids": "I32", "w": quant_info(t).contract_name},
                lambda r: {"x": (r, k), "ids": (r, used), "w": (e2 * n, k)}, params, needs=needs)


def _moe_sum_call(c: Compiler, node: Node) -> Call:
    t_used_n = c.node_of(node.inputs[0]).shape
    used, n = t_used_n[1], t_used_n[2]
    return Call("MoESum", {"y": "F32", "weights": "F32"}, lambda r: {"y": (r, used, n), "weights": (r, used)}, {})


def _moe_sum_bind(c: Compiler, node: Node, kernel: BoundKernel, call: Call, way: Way) -> Bound:
    y, w = node.inputs
    return Bound(lambda vals, st: kernel(y=vals[y], weights=vals[w]), [Launch(call, kernel)])


BINDINGS: dict[Op, Binding] = {
    Op.GET_ROWS: Binding(_get_rows_call, _get_rows_bind),
    Op.ROPE: Binding(_rope_call, _rope_bind),
    Op.ATTENTION: Binding(_attention_call, _attention_bind),
    Op.MATMUL: Binding(_qmatmul_call, _matmul_bind),
    Op.MATMUL_SWIGLU: Binding(_swiglu_call, _swiglu_bind),
    Op.MATMUL_GEGLU: Binding(_swiglu_call, _swiglu_bind),
    Op.MATMUL_ROPE: Binding(_matmul_rope_call, _matmul_rope_bind),
    Op.ADD_RMS_NORM: Binding(_add_rms_norm_call, _add_rms_norm_bind),
    Op.MOE_ROUTE: Binding(_moe_route_call, _moe_route_bind),
    Op.MOE_MATMUL: Binding(_moe_matmul_call, _moe_matmul_bind),
    Op.MOE_SUM: Binding(_moe_sum_call, _moe_sum_bind),
    Op.MOE_MATMUL_GLU: Binding(_moe_glu_call, _moe_matmul_bind),
    Op.NORM_ADD_RMS_NORM: Binding(_add_rms_norm_call, _add_rms_norm_bind),
    Op.NORM_ROPE: Binding(_norm_rope_call, _norm_rope_bind),
    Op.MATMUL_ADD_NORM: Binding(_add_norm_call, _add_norm_bind),
}
