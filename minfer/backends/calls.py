"""How a compiled node calls its op, in the terms the picker needs: shared by the backends that
pick every node's kernel through the contracts (cuda, vulkan), so they build the same calls and
say the same thing when nothing accepts one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..contracts.picker import Candidate, candidates
from ..contracts.registry import Registry
from ..errors import NoKernelError, UnsupportedError
from ..graph.ir import Graph, Node, Op, WeightRef, extended_features

STRIDED = {"contiguous": False, "strided": True}  # an input that may be a row-strided view


@dataclass(frozen=True)
class Call:
    """How a node calls its op: everything the picker needs, as a function of the row count."""

    op: str
    dtypes: dict[str, str]
    shapes_of: Callable[[int], dict[str, tuple[int, ...]]]
    params: dict
    fixed_layouts: dict | None = None
    prefer_quantized: bool | None = None  # many-row matmuls: MINFER_MMQ's choice, None = by cost
    layouts_of: Callable[[int], dict | None] | None = None

    def shapes(self, rows: int) -> dict[str, tuple[int, ...]]:
        return self.shapes_of(rows)

    def layouts(self, rows: int) -> dict | None:
        return self.layouts_of(rows) if self.layouts_of is not None else self.fixed_layouts


def admissible(call: Call, rows: int, backend: str, registry: Registry, who: str, node: Node,
               keep: Callable[[list[Candidate]], list[Candidate]] | None = None) -> list[Candidate]:
    """The kernels that accept `call` at `rows` rows on `backend`, best first (`keep` may narrow
    them); NoKernelError naming the node, the call and the nearest contracts when there is none."""
    ok, rejected = candidates(call.op, call.dtypes, call.shapes(rows), call.params, backend,
                              layouts=call.layouts(rows), registry=registry)
    if keep is not None and ok:
        ok = keep(ok)
    if not ok:
        near = "; ".join(f"{k.name}: {', '.join(why)}" for k, why in rejected[:3]) or "no contract implements it"
        raise NoKernelError(f"{who} backend: node {node.name!r} ({call.op}): no kernel accepts dtypes "
                            f"{call.dtypes}, shapes {call.shapes(rows)}, params {call.params}. "
                            f"Nearest contracts: {near}")
    return ok


def require_base_features(graph: Graph, backend: str) -> None:
    """UnsupportedError naming what `graph` uses beyond the ops and params this backend's kernels
    implement (graph/ir.py EXTENDED_OPS / EXTENDED_PARAMS: gemma's GeGLU, sliding windows, YaRN
    ...), before any kernel is picked: a kernel that ignored a param would run the wrong math."""
    feats = extended_features(graph)
    if feats:
        arch = graph.meta.get("arch", "this model")
        raise UnsupportedError(f"{backend} backend: {arch} needs {', '.join(feats)}, not implemented on "
                               f"{backend} yet (pending; the cpu backend runs it: --device cpu)")


def add_norm_pairs(graph: Graph) -> dict[int, int]:
    """add node id -> the RMSNorm node it feeds, where the two can run as one fused kernel
    (`AddRMSNorm`): the norm reads the add's output, and the add's first operand (the residual) is
    a buffer of its own (an add's, the embedding's or an all-reduce's output) read by nothing after
    the add, so the fused kernel may write the sum over it (cuda does; vulkan writes it to a fresh
    buffer, wgsl_ops.add_rms_norm says why). One rule for every backend that fuses the pair."""
    last = graph.consumers_last_use()
    by_id = {n.id: n for n in graph.nodes}
    pairs = {}
    for n in graph.nodes:
        if n.op == Op.RMS_NORM:
            (src,) = n.inputs
            add = by_id[src]
            if add.op == Op.ADD and last[add.inputs[0]] == add.id and by_id[add.inputs[0]].op in (
                    Op.ADD, Op.GET_ROWS, Op.ALL_REDUCE) and add.inputs[0] != add.inputs[1]:
                pairs[add.id] = n.id
    return pairs


def fused_norm(pairs: dict[int, int], add: Node, graph: Graph, backend: str,
               registry: Registry) -> tuple[Node, Call] | None:
    """(the RMSNorm node, the `AddRMSNorm` call) when `add` runs fused with the norm after it: the
    pair is in `pairs` (`add_norm_pairs`) and a contract of `backend` takes the call (x the residual,
    y what is added to it, w the norm's weight; contiguous rows of d). Else None, the pair dropped
    from `pairs`: the add and the norm run apart."""
    norm_id = pairs.get(add.id)
    if norm_id is None:
        return None
    norm = graph.nodes[norm_id]
    d, eps = add.shape[-1], norm.params["eps"]
    call = Call("AddRMSNorm", {"x": "F32", "y": "F32", "w": "F32"}, lambda r: {"x": (r, d), "y": (r, d), "w": (d,)},
                {"eps": eps})
    ok, _ = candidates(call.op, call.dtypes, call.shapes(1), call.params, backend, registry=registry)
    if not ok:
        del pairs[add.id]
        return None
    return norm, call


def fused_by(pairs: dict[int, int], norm: Node) -> int | None:
    """The add node whose fused kernel computes this RMSNorm (`fused_norm`), or None."""
    return next((a for a, n in pairs.items() if n == norm.id), None)


def rope_key(node: Node) -> tuple:
    """What a RoPE node's cos/sin tables depend on (nodes with equal keys share one table)."""
    p, ff = node.params, node.weights.get("freq_factors")
    return (p["n_rot"], p["base"], p["freq_scale"], ff.name if ff else None)


def compile_rope(node: Node, picks: Callable[[Node, Call], dict], ropes: dict) -> tuple[Callable, dict]:
    """A RoPE node's step function and its kernels: `picks(node, call)` is the backend's picker,
    `ropes` its cos/sin tables by `rope_key` (filled when the cache is allocated)."""
    i, pos = node.inputs
    key = rope_key(node)
    call, params = rope_call(node)
    run = picks(node, call)

    def fn(vals, st):
        cos, sin = ropes[key]
        return run[st.kind](x=vals[i], positions=vals[pos], cos=cos, sin=sin, **params)

    return fn, run


def rope_call(node: Node) -> tuple[Call, dict]:
    """A RoPE node's call and its launch params (n_heads, head_dim, n_rot, neox)."""
    p = node.params
    n_heads, hd, n_rot, neox = p["n_heads"], p["head_dim"], p["n_rot"], p["style"] == "neox"
    params = {"n_heads": n_heads, "head_dim": hd, "n_rot": n_rot, "neox": neox}
    call = Call("RoPE", {"x": "F32", "positions": "I32", "cos": "F32", "sin": "F32"},
                lambda r: {"x": (r, n_heads * hd), "positions": (r,), "cos": (16, n_rot // 2),
                           "sin": (16, n_rot // 2)}, params, {"x": STRIDED})
    return call, params


def type_runs(w: WeightRef, type_of: Callable[[str], object]) -> list[tuple[WeightRef, object, int, int]]:
    """A (fused) weight's parts grouped into runs of one storage type (`type_of(tensor name)`), as
    (weight of the run, its type, first output column, end column): one run unless the parts differ
    in type (a Q4_K_M file's Q4_K q, k and Q6_K v), each run then multiplied into its columns."""
    runs: list[list] = []
    col = 0
    for part in w.tensors:
        t = type_of(part.name)
        if runs and runs[-1][0] == t:
            runs[-1][1].append(part)
        else:
            runs.append([t, [part], col])
        col += part.shape[1]
    out = []
    for t, parts, start in runs:
        cols = sum(p.shape[1] for p in parts)
        ref = parts[0] if len(parts) == 1 else WeightRef("+".join(p.name for p in parts), (w.shape[0], cols),
                                                         tuple(parts))
        out.append((ref, t, start, start + cols))
    return out
