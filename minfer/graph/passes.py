"""Graph passes: rewrite a Graph into an equivalent one with fewer, larger nodes.

`fuse_sibling_matmuls`: MatMuls that read the same input (q/k/v of a layer, gate/up of its
FFN) become one MatMul over a stacked weight, followed by one Slice view per original
output. One big matmul streams the weights once and costs one dispatch instead of several.
Stacking rows is valid for every ggml type (each row is its own run of blocks).

`fuse_rope_pairs`: RoPE of q and RoPE of k, when they rotate adjacent column ranges of the
same tensor with the same settings, become one RoPE over both ranges (heads are independent).

Passes keep node names (a fused node gets a new one), so traces stay readable, and keep the
graph's inputs, output and weight list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from .ir import Graph, Node, Op, WeightRef


class _Rewriter:
    """Re-emits nodes with fresh ids; `ref[old_id]` is the id that now computes old_id's value."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.nodes: list[Node] = []
        self.ref: dict[int, int] = {}

    def emit(self, node: Node, old_id: int | None = None, remap: bool = True) -> int:
        inputs = tuple(self.ref[i] for i in node.inputs) if remap else node.inputs
        new = replace(node, id=len(self.nodes), inputs=inputs)
        self.nodes.append(new)
        if old_id is not None:
            self.ref[old_id] = new.id
        return new.id

    def slice(self, src: int, start: int, stop: int, like: Node) -> int:
        """A Slice of new node `src` standing for old node `like` (same name, shape, layer)."""
        node = Node(0, like.name, Op.SLICE, (src,), like.shape, like.dtype, like.layer, {},
                    {"start": start, "stop": stop})
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


def fuse_sibling_matmuls(graph: Graph) -> Graph:
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
                rw.slice(mm, start, start + w, m)
                start += w
        elif n.id not in fused:
            rw.emit(n, n.id)
    return rw.result()


def fuse_rope_pairs(graph: Graph) -> Graph:
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
            rw.slice(r, 0, mid - start, a)
            rw.slice(r, mid - start, stop - start, b)
        elif n.id not in second:
            rw.emit(n, n.id)
    return _drop_unused(rw.result())


def _drop_unused(graph: Graph) -> Graph:
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


DEFAULT_PASSES: tuple[Callable[[Graph], Graph], ...] = (fuse_sibling_matmuls, fuse_rope_pairs)


def optimize(graph: Graph, passes=DEFAULT_PASSES) -> Graph:
    for p in passes:
        graph = p(graph)
    return graph
