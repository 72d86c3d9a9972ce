"""Graph passes: rewrite a Graph into an equivalent one with fewer, larger nodes. Every fusion of
minfer is here, as a rule over the graph; backends only run what the rules produced.

Structural passes (every backend takes them; stacking rows is valid for every ggml type):

- `stack_sibling_matmuls`: MatMuls that read the same input (q/k/v of a layer, gate/up of its
  FFN) become one MatMul over a stacked weight, followed by one Slice view per original output.
  One big matmul streams the weights once and costs one launch instead of several.
- `merge_rope_pairs`: RoPE of q and RoPE of k, when they rotate adjacent column ranges of the
  same tensor with the same settings, become one RoPE over both ranges (heads are independent).

Kernel fusions, each firing only where the backend can run the result (`supports(node, graph)`:
a contract of the backend accepts the fused node, or has the capability a node's params ask
for, in at least one way of running; the callback keeps graph/ below contracts/):

- `fuse_add_rms_norm`: a residual Add and the RMSNorm of its sum -> AddRMSNorm (exports the
  sum and the normed value).
- `fuse_norm_add_rms_norm`: gemma's post-norm of a block's output, the residual Add and the next
  RMSNorm -> NormAddRMSNorm (exports the sum and the normed value; before fuse_add_rms_norm,
  which takes the add and norm where this rule did not fire).
- `fuse_matmul_swiglu`: a stacked gate+up MatMul and the SwiGLU of its halves -> QMatMulSwiGLU
  (the GeGLU of its halves -> QMatMulGeGLU).
- `fuse_moe_glu`: an expert layer's gate and up MoEMatMuls (same x, same ids) and the SwiGLU
  (or gpt-oss's SwiGLUOAI) of their outputs -> MoEMatMulGLU over one weight stacking the gate
  experts, then the up experts (the two tensors' bytes one after the other: 2 E matrices).
- `fuse_matmul_rope`: a stacked q+k+v MatMul (with or without bias) and the RoPE of its q and k
  columns -> QMatMulRoPE (exports the rotated columns and the whole output).
- `fuse_norm_rope`: the per-head RMSNorms of q and k (qwen3, gemma3) and their RoPEs -> NormRoPE
  (exports the rotated q and k).
- `fuse_matmul_add_norm`: an AddRMSNorm whose y is a bias-free MatMul only it reads and whose
  normed value only matmuls read -> QMatMulAddNorm (the GEMV's store adds the residual and writes
  h * w and its tiles' sums of h^2), the readers marked `x_rstd` (each divides its sums by h's rms):
  the norm's kernel and its grid-wide wait gone (a deferred RMSNorm).
- `fuse_kv_write`: an Attention whose k and v come from one QMatMulRoPE: that node writes the
  row's keys and values into the layer's cache (param `kv_layer`) and the Attention skips its
  write (param `kv_written`).
- `fuse_int8_x`: a matmul whose input x comes from a node that can also write x's int8 records
  (an RMSNorm, AddRMSNorm, SwiGLU or Attention): that node writes them (param `q8_out`) and the
  matmul reads them (param `x_q8`) instead of quantizing x in a launch of its own.

A fused node keeps the nodes it replaced as its `parts` (graph/ir.py), so a backend runs the
parts wherever no kernel accepts the fused call: a decode row's GEMV computes the SwiGLU in its
store, a prompt chunk's matmul and SwiGLU run as two kernels. Passes keep node names (a fused
node gets a new one), so traces stay readable, and keep the graph's inputs, output and weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from .ir import Graph, Node, Op, WeightRef

Supports = Callable[[Node, Graph], bool]  # (a proposed node, the graph its inputs refer to)


class _Rewriter:
    """Re-emits nodes with fresh ids; `ref[old_id]` is the id that now computes old_id's value."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.nodes: list[Node] = []
        self.ref: dict[int, int] = {}

    def emit(self, node: Node, old_id: int | None = None, remap: bool = True) -> int:
        inputs = tuple(self.ref[i] for i in node.inputs) if remap else node.inputs
        new = node.renumbered(len(self.nodes), inputs)
        self.nodes.append(new)
        if old_id is not None:
            self.ref[old_id] = new.id
        return new.id

    def view(self, op: Op, src: int, like: Node, **params) -> int:
        """A Slice or Pick of new node `src` standing for old node `like` (same name, shape, layer)."""
        node = Node(0, like.name, op, (src,), like.shape, like.dtype, like.layer, {}, params)
        return self.emit(node, like.id, remap=False)

    def result(self) -> Graph:
        g = self.graph
        return Graph(tuple(self.nodes), {k: self.ref[v] for k, v in g.inputs.items()}, self.ref[g.output],
                     g.weights, g.meta)


def _common_name(names: list[str]) -> str:
    """'blk.0.attn_q', 'blk.0.attn_k' -> 'blk.0.attn_q+k'."""
    prefix = names[0]
    for n in names[1:]:
        while not n.startswith(prefix):
            prefix = prefix[:-1]
    return prefix + "+".join(n[len(prefix):] for n in names)


def readers_of(graph: Graph) -> dict[int, list[Node]]:
    """Node id -> the nodes that read its value, in graph order."""
    out: dict[int, list[Node]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            out.setdefault(i, []).append(n)
    return out


# ---------------------------------------------------------------------- structural passes
def stack_sibling_matmuls(graph: Graph) -> Graph:
    groups: dict[tuple, list[Node]] = {}
    for n in graph.nodes:
        if n.op == Op.MATMUL:
            groups.setdefault((n.inputs, "b" in n.weights), []).append(n)
    lead = {g[0].id: g for g in groups.values() if len(g) > 1}
    fused = {n.id for g in lead.values() for n in g}
    rw = _Rewriter(graph)
    for n in graph.nodes:
        if n.id in lead:
            members = lead[n.id]
            widths = [m.weights["w"].shape[1] for m in members]
            k = n.weights["w"].shape[0]
            weights = {"w": WeightRef(_common_name([m.weights["w"].name for m in members]), (k, sum(widths)),
                                      tuple(m.weights["w"] for m in members))}
            if "b" in n.weights:
                weights["b"] = WeightRef(_common_name([m.weights["b"].name for m in members]), (sum(widths),),
                                         tuple(m.weights["b"] for m in members))
            shape = (*n.shape[:-1], sum(widths))
            name = _common_name([m.name for m in members])
            mm = rw.emit(replace(n, name=name, shape=shape, weights=weights))
            start = 0
            for m, w in zip(members, widths, strict=True):
                rw.view(Op.SLICE, mm, m, start=start, stop=start + w)
                start += w
        elif n.id not in fused:
            rw.emit(n, n.id)
    return rw.result()


def merge_rope_pairs(graph: Graph) -> Graph:
    by_id = {n.id: n for n in graph.nodes}

    def key(n: Node) -> tuple | None:
        if n.op != Op.ROPE or by_id[n.inputs[0]].op != Op.SLICE:
            return None
        p = {k: v for k, v in n.params.items() if k != "n_heads"}
        return (by_id[n.inputs[0]].inputs[0], n.inputs[1], tuple(sorted(p.items())), tuple(n.weights.items()))

    groups: dict[tuple, list[Node]] = {}
    for n in graph.nodes:
        k = key(n)
        if k is not None:
            groups.setdefault(k, []).append(n)
    pairs: dict[int, tuple[Node, Node]] = {}
    for g in groups.values():
        if len(g) == 2:
            a, b = g
            sa, sb = by_id[a.inputs[0]], by_id[b.inputs[0]]
            if sa.params["stop"] == sb.params["start"]:
                pairs[a.id] = (a, b)
    second = {b.id for _, b in pairs.values()}
    rw = _Rewriter(graph)
    for n in graph.nodes:
        if n.id in pairs:
            a, b = pairs[n.id]
            sa, sb = by_id[a.inputs[0]], by_id[b.inputs[0]]
            start, mid, stop = sa.params["start"], sa.params["stop"], sb.params["stop"]
            src = Node(0, _common_name([sa.name, sb.name]), Op.SLICE, (rw.ref[sa.inputs[0]],),
                       (*sa.shape[:-1], stop - start), sa.dtype, sa.layer, {}, {"start": start, "stop": stop})
            s = rw.emit(src, remap=False)
            heads = a.params["n_heads"] + b.params["n_heads"]
            r = rw.emit(replace(a, name=_common_name([a.name, b.name]), inputs=(s, rw.ref[a.inputs[1]]),
                                shape=src.shape, params={**a.params, "n_heads": heads}), remap=False)
            rw.view(Op.SLICE, r, a, start=0, stop=mid - start)
            rw.view(Op.SLICE, r, b, start=mid - start, stop=stop - start)
        elif n.id not in second:
            rw.emit(n, n.id)
    return drop_unused(rw.result())


def drop_unused(graph: Graph) -> Graph:
    """Remove nodes nothing reads (e.g. slices a fused RoPE made redundant); inputs stay."""
    used = {graph.output, *graph.inputs.values()}
    for n in reversed(graph.nodes):
        if n.id in used:
            used.update(n.inputs)
    rw = _Rewriter(graph)
    for n in graph.nodes:
        if n.id in used:
            rw.emit(n, n.id)
    return rw.result()


STRUCTURAL: tuple[Callable[[Graph], Graph], ...] = (stack_sibling_matmuls, merge_rope_pairs)


def optimize(graph: Graph) -> Graph:
    """The structural passes: what every backend runs (the cpu backend no more)."""
    for p in STRUCTURAL:
        graph = p(graph)
    return graph


# ---------------------------------------------------------------------- kernel fusions
def _fused(group: list[Node], op: Op, name: str, inputs: tuple[int, ...], exports: tuple[int, ...],
           weights: dict[str, WeightRef], params: dict, shape) -> Node:
    """A fused node standing for `group` (nodes of the graph, in order): its parts renumbered
    locally (graph/ir.py: ids after the fused node's `inputs`), `exports` given as graph ids of
    group members, the fused node's id 0 until the rewriter emits it."""
    local = {g: i for i, g in enumerate(inputs)}
    parts = []
    for n in group:
        local[n.id] = len(inputs) + len(parts)
        parts.append(replace(n, id=local[n.id], inputs=tuple(local[i] for i in n.inputs)))
    first = group[0]
    return Node(0, name, op, inputs, shape, first.dtype, first.layer, weights, params, tuple(parts),
                tuple(local[e] for e in exports))


def _rewrite(graph: Graph, fusions: dict[int, tuple[Node, list[Node], tuple[Node, ...]]]) -> Graph:
    """Emit `graph` with each fusion in place of its group: fusions maps a group member id ->
    (fused node with graph-id inputs, the group, the members its exports stand for). The fused
    node goes where its group's first member was, or later, once every input it reads is emitted
    (readers of a member between the members then read it from the fused node). A fused node
    with one export takes that member's place; with several, a Pick per export does."""
    groups = {id(v[0]): v for v in fusions.values()}
    absorbed = {n.id: id(fused) for fused, group, _ in groups.values() for n in group}
    pending: list[tuple] = []
    rw = _Rewriter(graph)

    def ready(fused: Node) -> bool:
        return all(i in rw.ref for i in fused.inputs)

    def flush() -> None:
        for entry in [e for e in pending if ready(e[0])]:
            pending.remove(entry)
            fused, _, stands_for = entry
            if len(stands_for) == 1:
                rw.emit(fused, stands_for[0].id)
            else:
                f = rw.emit(fused)
                for i, member in enumerate(stands_for):
                    rw.view(Op.PICK, f, member, index=i)

    for n in graph.nodes:
        key = absorbed.get(n.id)
        if key is not None:
            entry = groups.pop(key, None)
            if entry is not None:  # the group's first member: its fused node from here on
                pending.append(entry)
        elif all(i in rw.ref for i in n.inputs):
            rw.emit(n, n.id)
        else:  # reads a member whose fused node waits for an input: never in a topological graph
            raise ValueError(f"graph/fuse: node {n.name!r} reads a fused value before it can exist")
        flush()
    if pending:
        raise ValueError(f"graph/fuse: fused node {pending[0][0].name!r} reads a value no node computes")
    return rw.result()


def _residual_add_norms(graph: Graph):
    """(add, norm) pairs where an RMSNorm of whole rows reads an Add's sum and the add's first
    operand (the residual) is a value of its own (an Add's, an embedding's or its Scale's, an
    all-reduce's or an earlier AddRMSNorm's sum) that nothing reads after the add: a fused kernel
    may write the sum over it (where its contract says `in_place`)."""
    last = graph.consumers_last_use()
    by_id = {n.id: n for n in graph.nodes}
    for n in graph.nodes:
        if n.op != Op.RMS_NORM or n.params.get("group"):
            continue
        (src,) = n.inputs
        add = by_id[src]
        if add.op != Op.ADD or add.inputs[0] == add.inputs[1] or last[add.inputs[0]] != add.id:
            continue
        if by_id[add.inputs[0]].op not in (Op.ADD, Op.GET_ROWS, Op.SCALE, Op.ALL_REDUCE, Op.PICK):
            continue
        yield add, n


def fuse_norm_add_rms_norm(graph: Graph, supports: Supports) -> Graph:
    """Gemma's post-norms: RMSNorm -> residual Add -> RMSNorm, where the first norm (whole rows,
    the same eps) is the add's second operand and read by nothing else -> NormAddRMSNorm
    (exports the sum and the normed value, as AddRMSNorm)."""
    readers = readers_of(graph)
    by_id = {n.id: n for n in graph.nodes}
    fusions = {}
    for add, n in _residual_add_norms(graph):
        post = by_id[add.inputs[1]]
        if (post.op != Op.RMS_NORM or post.params.get("group") or readers.get(post.id) != [add]
                or post.params["eps"] != n.params["eps"]):
            continue
        fused = _fused([post, add, n], Op.NORM_ADD_RMS_NORM, n.name, (add.inputs[0], post.inputs[0]), (add.id, n.id),
                       {"w_y": post.weights["w"], "w": n.weights["w"]}, dict(n.params), n.shape)
        if supports(fused, graph):
            fusions[n.id] = (fused, [post, add, n], (add, n))
    return _rewrite(graph, fusions) if fusions else graph


def fuse_add_rms_norm(graph: Graph, supports: Supports) -> Graph:
    """Add -> RMSNorm pairs as AddRMSNorm (`_residual_add_norms`: the residual a value of its own)."""
    fusions = {}
    for add, n in _residual_add_norms(graph):
        fused = _fused([add, n], Op.ADD_RMS_NORM, n.name, add.inputs, (add.id, n.id), dict(n.weights),
                       dict(n.params), n.shape)
        if supports(fused, graph):
            fusions[n.id] = (fused, [add, n], (add, n))
    return _rewrite(graph, fusions) if fusions else graph


def _slices(readers: dict[int, list[Node]], m: Node) -> list[Node] | None:
    rs = readers.get(m.id, [])
    return rs if rs and all(r.op == Op.SLICE for r in rs) else None


GLU_FUSED = {Op.SWIGLU: (Op.MATMUL_SWIGLU, "+swiglu"), Op.GEGLU: (Op.MATMUL_GEGLU, "+geglu")}


def fuse_matmul_swiglu(graph: Graph, supports: Supports) -> Graph:
    """A bias-free stacked gate+up MatMul (or one weight holding both, phi3's ffn_up) whose two
    halves only a SwiGLU (GeGLU) reads -> QMatMulSwiGLU (QMatMulGeGLU)."""
    readers = readers_of(graph)
    fusions = {}
    for m in graph.nodes:
        rs = _slices(readers, m) if m.op == Op.MATMUL else None
        if rs is None or len(rs) != 2 or "b" in m.weights:
            continue
        g, u = sorted(rs, key=lambda r: r.params["start"])
        n, f = m.weights["w"].shape[1], m.weights["w"].shape[1] // 2
        nxt = readers.get(g.id, [])
        if len(nxt) != 1 or readers.get(u.id, []) != nxt:
            continue
        sw = nxt[0]
        if (sw.op not in GLU_FUSED or sw.inputs != (g.id, u.id) or (g.params["start"], g.params["stop"]) != (0, f)
                or (u.params["start"], u.params["stop"]) != (f, n)):
            continue
        group = [m, g, u, sw]
        op, suffix = GLU_FUSED[sw.op]
        fused = _fused(group, op, m.name + suffix, m.inputs, (sw.id,), dict(m.weights), {}, sw.shape)
        if supports(fused, graph):
            fusions[sw.id] = (fused, group, (sw,))
    return _rewrite(graph, fusions) if fusions else graph


MOE_GLUS = {Op.SWIGLU: "swiglu", Op.SWIGLU_OAI: "swiglu_oai"}


def fuse_moe_glu(graph: Graph, supports: Supports) -> Graph:
    """Two MoEMatMuls on the same (x, ids) whose outputs only a SwiGLU / SwiGLUOAI reads (gate
    first), with weights of one shape and biases on both or neither -> MoEMatMulGLU: weight "w"
    stacks the gate tensor's experts, then the up tensor's (shape (k, n, 2 E)); "b" likewise."""
    readers = readers_of(graph)
    by_id = {n.id: n for n in graph.nodes}
    fusions = {}
    for sw in graph.nodes:
        if sw.op not in MOE_GLUS:
            continue
        g, u = (by_id[i] for i in sw.inputs)
        if (g.op != Op.MOE_MATMUL or u.op != Op.MOE_MATMUL or g.id == u.id or g.inputs != u.inputs
                or readers.get(g.id) != [sw] or readers.get(u.id) != [sw] or len(by_id[g.inputs[0]].shape) != 2):
            continue  # (x [T, k]: every chosen expert of a row reads its row)
        wg, wu = g.weights["w"], u.weights["w"]
        if wg.shape != wu.shape or ("b" in g.weights) != ("b" in u.weights):
            continue
        k, n, e = wg.shape
        weights = {"w": WeightRef(_common_name([wg.name, wu.name]), (k, n, 2 * e), (wg, wu))}
        if "b" in g.weights:
            bg, bu = g.weights["b"], u.weights["b"]
            weights["b"] = WeightRef(_common_name([bg.name, bu.name]), (n, 2 * e), (bg, bu))
        params = {"n_expert": e, "glu": MOE_GLUS[sw.op], "alpha": float(sw.params.get("alpha", 0.0)),
                  "limit": float(sw.params.get("limit", 0.0))}
        group = [g, u, sw]
        fused = _fused(group, Op.MOE_MATMUL_GLU, sw.name + "+experts", g.inputs, (sw.id,), weights, params, sw.shape)
        if supports(fused, graph):
            fusions[sw.id] = (fused, group, (sw,))
    return _rewrite(graph, fusions) if fusions else graph


def fuse_matmul_rope(graph: Graph, supports: Supports) -> Graph:
    """A stacked q+k+v MatMul (or one weight holding them, phi3's attn_qkv) whose columns from 0 a
    RoPE rotates (its other readers slices of the rest) -> QMatMulRoPE: exports the rotated columns
    (the RoPE's value) and the whole output."""
    readers = readers_of(graph)
    fusions = {}
    for m in graph.nodes:
        rs = _slices(readers, m) if m.op == Op.MATMUL else None
        if rs is None:
            continue
        for s in rs:
            after = readers.get(s.id, [])
            if s.params["start"] != 0 or len(after) != 1 or after[0].op != Op.ROPE or after[0].inputs[0] != s.id:
                continue
            rope = after[0]
            p = rope.params
            if p["n_heads"] * p["head_dim"] != s.params["stop"]:
                continue
            group = [m, s, rope]
            fused = _fused(group, Op.MATMUL_ROPE, m.name + "+rope", (m.inputs[0], rope.inputs[1]), (rope.id, m.id),
                           {**m.weights, **rope.weights}, dict(p), m.shape)
            if supports(fused, graph):
                fusions[rope.id] = (fused, group, (rope, m))
            break
    return _rewrite(graph, fusions) if fusions else graph


def fuse_norm_rope(graph: Graph, supports: Supports) -> Graph:
    """The per-head q and k norms of qwen3 / gemma3 and the RoPEs after them -> NormRoPE: where
    a MatMul's columns 0..nq (q) and nq..nq+nk (k) are sliced, each normed per head (a grouped
    RMSNorm of group head_dim, same eps) and rotated alike (RoPEs equal but for n_heads), and
    nothing else reads the slices, norms or RoPEs' inputs. Exports the rotated q and k."""
    readers = readers_of(graph)
    fusions = {}

    def only(nid: int, op: Op) -> Node | None:
        rs = readers.get(nid, [])
        return rs[0] if len(rs) == 1 and rs[0].op == op and rs[0].inputs[0] == nid else None

    for m in graph.nodes:
        rs = _slices(readers, m) if m.op == Op.MATMUL else None
        if rs is None:
            continue
        by_start = {r.params["start"]: r for r in rs}
        sq = by_start.get(0)
        sk = by_start.get(sq.params["stop"]) if sq is not None else None
        if sk is None:
            continue
        nq, nk = only(sq.id, Op.RMS_NORM), only(sk.id, Op.RMS_NORM)
        if nq is None or nk is None:
            continue
        rq, rk = only(nq.id, Op.ROPE), only(nk.id, Op.ROPE)
        if rq is None or rk is None or rq.inputs[1] != rk.inputs[1]:
            continue
        hd = rq.params["head_dim"]
        same_rope = ({k: v for k, v in rq.params.items() if k != "n_heads"}
                     == {k: v for k, v in rk.params.items() if k != "n_heads"} and rq.weights == rk.weights)
        groups = [n.params.get("group", n.shape[-1]) for n in (nq, nk)]  # (absent: the whole row, one head)
        if not (same_rope and groups == [hd, hd] and nq.params["eps"] == nk.params["eps"]):
            continue
        group = [sq, sk, nq, nk, rq, rk]
        params = {**rq.params, "n_heads_k": rk.params["n_heads"], "eps": nq.params["eps"]}
        weights = {"q_norm": nq.weights["w"], "k_norm": nk.weights["w"], **rq.weights}
        fused = _fused(group, Op.NORM_ROPE, _common_name([rq.name, rk.name]) + "+norm", (m.id, rq.inputs[1]),
                       (rq.id, rk.id), weights, params, (*rq.shape[:-1], rq.shape[-1] + rk.shape[-1]))
        if supports(fused, graph):
            fusions[rq.id] = (fused, group, (rq, rk))
    return _rewrite(graph, fusions) if fusions else graph


def fuse_matmul_add_norm(graph: Graph, supports: Supports) -> Graph:
    """A deferred RMSNorm: an AddRMSNorm whose y is a bias-free MatMul only it reads, and whose normed
    value only matmuls read (as their x) -> QMatMulAddNorm, each reader marked `x_rstd`. Its kernel
    (the GEMV's store) adds the residual and writes h * w and the row tiles' sums of h^2; each reader
    divides its sums by h's rms: the norm's own kernel, and the grid-wide wait before it, are gone.
    Inputs (the matmul's x, the residual), weights w (the matmul's) and w_n (the norm's); it exports
    the AddRMSNorm's two values through its parts (the matmul, the AddRMSNorm, a Pick of each value),
    which run wherever a way of running cannot take it whole (backends/compile.py `rstd_link`)."""
    readers = readers_of(graph)
    by_id = {n.id: n for n in graph.nodes}
    fusions, marks = {}, {}
    for an in graph.nodes:
        mm = by_id[an.inputs[1]] if an.op == Op.ADD_RMS_NORM else None
        if mm is None or mm.op != Op.MATMUL or "b" in mm.weights or readers.get(mm.id) != [an]:
            continue
        picks = {r.id for r in readers.get(an.id, []) if r.op == Op.PICK and r.params["index"] == 1}
        users = [u for p in picks for u in readers.get(p, [])]
        if not users or any(u.op not in RSTD_READERS or u.inputs[0] not in picks or picks & set(u.inputs[1:])
                            for u in users):
            continue
        marked = {u.id: {**u.params, "x_rstd": True} for u in users}
        if not all(supports(replace(u, params=marked[u.id]), graph) for u in users):
            continue
        fused = _fused([mm, an], Op.MATMUL_ADD_NORM, _common_name([mm.name, an.name]), (mm.inputs[0], an.inputs[0]),
                       (an.id,), {"w": mm.weights["w"], "w_n": an.weights["w"]}, dict(an.params), an.shape)
        (k,) = fused.exports
        values = tuple(Node(k + 1 + i, an.name, Op.PICK, (k,), an.shape, an.dtype, an.layer, {}, {"index": i})
                       for i in range(an.n_values))
        fused = replace(fused, parts=fused.parts + values, exports=tuple(p.id for p in values))
        if supports(fused, graph):
            fusions[an.id] = (fused, [mm, an], (an,))
            marks.update(marked)
    return _rewrite(_with_params(graph, marks), fusions) if fusions else graph


def _view_of(by_id: dict[int, Node], nid: int, op: Op) -> tuple[Node, Node] | None:
    """(the view node, the node it views) when node `nid` is a Slice of a Pick of an `op` node."""
    s = by_id[nid]
    if s.op != Op.SLICE:
        return None
    pick = by_id[s.inputs[0]]
    if pick.op != Op.PICK or by_id[pick.inputs[0]].op != op:
        return None
    return pick, by_id[pick.inputs[0]]


def fuse_kv_write(graph: Graph, supports: Supports) -> Graph:
    """An Attention whose q and k are slices of a QMatMulRoPE's rotated columns and whose v is the
    slice of its output right after them: the QMatMulRoPE writes the row's k and v into the
    Attention's cache layer (`kv_layer`, `n_head_kv`), the Attention skips its write (`kv_written`)."""
    by_id = {n.id: n for n in graph.nodes}
    marks: dict[int, dict] = {}
    for a in graph.nodes:
        if a.op != Op.ATTENTION:
            continue
        views = [_view_of(by_id, i, Op.MATMUL_ROPE) for i in a.inputs[:3]]
        if any(v is None for v in views):
            continue
        (pq, fq), (pk, fk), (pv, fv) = views
        f = fq
        if not (fq.id == fk.id == fv.id and pq.params["index"] == pk.params["index"] == 0
                and pv.params["index"] == 1 and f.id not in marks):
            continue
        v = by_id[a.inputs[2]]
        if v.params["start"] != f.params["n_heads"] * f.params["head_dim"]:
            continue
        fused = replace(f, params={**f.params, "kv_layer": a.params["kv_layer"], "n_head_kv": a.params["n_head_kv"]})
        attn = replace(a, params={**a.params, "kv_written": True})
        if supports(fused, graph) and supports(attn, graph):
            marks[f.id] = fused.params
            marks[a.id] = attn.params
    return _with_params(graph, marks)


def _with_params(graph: Graph, marks: dict[int, dict]) -> Graph:
    """graph with the nodes in `marks` given those params (the rules that only mark nodes)."""
    if not marks:
        return graph
    return replace(graph, nodes=tuple(replace(n, params=marks[n.id]) if n.id in marks else n for n in graph.nodes))


Q8_PRODUCERS = (Op.RMS_NORM, Op.ADD_RMS_NORM, Op.NORM_ADD_RMS_NORM, Op.SWIGLU, Op.MATMUL_SWIGLU, Op.ATTENTION)
Q8_CONSUMERS = (Op.MATMUL, Op.MATMUL_SWIGLU, Op.MATMUL_GEGLU, Op.MATMUL_ROPE)
RSTD_READERS = Q8_CONSUMERS  # the GEMVs that read x in a form made for them: int8 records, or a deferred norm's h * w


def fuse_int8_x(graph: Graph, supports: Supports) -> Graph:
    """Matmuls whose x is the output of a node that can write x's int8 records beside it: that
    node writes them (`q8_out`), the matmuls read them (`x_q8`). Through a Pick (an AddRMSNorm's
    normed value) the producer is the fused node."""
    by_id = {n.id: n for n in graph.nodes}
    marks: dict[int, dict] = {}
    for m in graph.nodes:
        if m.op not in Q8_CONSUMERS:
            continue
        x = by_id[m.inputs[0]]
        producer = by_id[x.inputs[0]] if x.op == Op.PICK and x.params["index"] == len(by_id[x.inputs[0]].exports) - 1 \
            else x
        if producer.op not in Q8_PRODUCERS:
            continue
        p = replace(producer, params={**marks.get(producer.id, producer.params), "q8_out": True})
        c = replace(m, params={**m.params, "x_q8": True})
        if supports(c, graph) and supports(p, graph):
            marks[producer.id] = p.params
            marks[m.id] = c.params
    return _with_params(graph, marks)


FUSIONS: tuple[Callable[[Graph, Supports], Graph], ...] = (
    fuse_norm_add_rms_norm, fuse_add_rms_norm, fuse_matmul_swiglu, fuse_moe_glu, fuse_matmul_rope, fuse_norm_rope,
    fuse_matmul_add_norm, fuse_kv_write, fuse_int8_x)


def fuse(graph: Graph, supports: Supports, rules: Iterable[Callable[[Graph, Supports], Graph]] | None = None) -> Graph:
    """The kernel fusions (`rules`, default FUSIONS), in order, each where `supports` says the
    backend runs its result."""
    for rule in FUSIONS if rules is None else rules:
        graph = rule(graph, supports)
    return graph
