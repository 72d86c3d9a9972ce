"""The contract-driven compiler the GPU backends share: every node of a graph into one step per
way of running, each kernel chosen through the contracts.

A backend that picks its kernels through the contracts (cuda, vulkan) is a `Runtime`: memory
(weights on the device, buffers, views, the KV cache, RoPE tables) and a name for its contracts.
`Compiler` does the rest, the same for both: for every node and every way the backend runs it
(`Runtime.kinds`: a decode row, a decode batch, a prompt chunk, each with the row count kernels
are picked for) it builds the node's `Call` (op, dtypes, shapes, params, layouts), asks the
picker for the cheapest kernel that accepts it, lays the node's weight out as that kernel's
contract says (once per layout and weight) and binds the launch. A fused node (graph/fuse.py)
runs as its fused kernel where a contract accepts the fused call, and as its parts where none
does. What a kernel can also do is asked of its contract (`caps.also`, contracts/ops.py
CAPABILITIES): write its output's int8 records (`q8_out`), read them (`q8_in`), write the KV
cache from a GEMV's epilogue (`kv_out_f16`), skip an attention's own KV write (`kv_skip`), read a
deferred RMSNorm's h * w and divide by its rms (`rstd_in`). A pairing of two nodes (the records'
writer and reader, the KV writer and the attention) is used in a way of running only where both
ends' kernels have their half; a deferred norm (QMatMulAddNorm) runs whole in a way only where
every reader of its normed value takes rstd there (`rstd_link`), else as its parts.

The compiler keeps, per node and way of running, the launches it bound: `plan_rows` (what
`minfer plan` shows) and the trace name what runs. A node nothing accepts is a NoKernelError at
load naming the node, its call and the nearest contracts.

Ops are bound through one table (`BINDINGS`, backends/bindings.py). An op whose contract inputs
are the node's inputs and 1-D weights, and whose params are the node's, needs no entry there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

from ..contracts.picker import Candidate, candidates
from ..contracts.registry import BoundKernel, Registry
from ..errors import NoKernelError, UnsupportedError
from ..graph.ir import FUSED_OPS, Graph, Node, Op, WeightRef
from ..quant.types import GGMLType
from .bindings import BINDINGS, generic
from .calls import STRIDED, Binding, Bound, Call, Launch, Way, type_runs  # noqa: F401  (re-exported)
from .plan import Step

PLAN_CTX = 1024  # the context attention costs are predicted for
VIEW_OPS = (Op.SLICE, Op.PICK)


class Runtime(Protocol):
    """What a backend gives the compiler: device memory and facts about it."""

    contract_backend: str  # the contracts' backend name ("CUDA", "Vulkan")
    kinds: dict[str, int]  # way of running -> the row count its kernels are picked for
    column_outputs: bool  # matmul kernels may write the columns of a wider row-strided output
    kv_dtype: str  # the KV cache's contract dtype
    max_weight_bytes: int | None  # the most bytes one kernel operand may bind (None: no limit below memory)
    upload: bool  # False: only pick kernels (`minfer plan`); nothing touches the device

    def kv_shape(self, n_layer: int, n_head_kv: int, head_dim: int) -> tuple[int, ...]: ...  # the cache operand
    def kv(self, layer: int) -> tuple[Any, Any, int]: ...  # (cache_k, cache_v, the layer index the kernel takes)
    def weight_bytes(self, w: WeightRef) -> Any: ...  # a (fused) weight's GGUF bytes, parts stacked
    def dense_f16(self, w: WeightRef) -> Any: ...  # the f16 copy of a fused weight whose parts differ in type
    def table(self, name: str) -> Any: ...  # an embedding table's GGUF bytes
    def vector(self, w: WeightRef) -> Any: ...  # a 1-D weight as f32 (a fused one's parts concatenated)
    def empty(self, shape: tuple[int, ...]) -> Any: ...
    def zeros(self, n: int) -> Any: ...
    def cols(self, t: Any, a: int, b: int) -> Any: ...  # columns a:b of a [rows, n] tensor (a view)
    def rope(self, key: tuple) -> tuple[Any, Any]: ...  # (cos, sin) tables, made at allocate
    def q8_records(self, rows: int, k: int, passes: int) -> Any: ...  # x's int8 records, to be filled
    def norm_sums(self, n: int, k: int, qtype: GGMLType) -> Any: ...  # a deferred norm's tile sums, to be filled


def _frozen(v: Any) -> Any:
    """`v` as a hashable value that equals another's only where the picker cannot tell them apart
    (each scalar with its type: True, 1 and 1.0 stay apart); TypeError for anything but plain data."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return type(v).__name__, v
    if isinstance(v, dict):
        return "dict", tuple(sorted((str(k), _frozen(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple, frozenset, set)):
        items = [_frozen(x) for x in v]
        return type(v).__name__, tuple(sorted(items) if isinstance(v, (frozenset, set)) else items)
    raise TypeError(type(v).__name__)


def _call_key(call: Call, rows: int) -> tuple | None:
    """What the picker sees of `call` at `rows` rows, hashable; None where a value is not plain data
    (such a call is picked afresh every time)."""
    try:
        return _frozen((call.op, call.dtypes, call.shapes(rows), call.params, call.layouts(rows),
                        call.prefer_quantized, call.needs, rows))
    except TypeError:
        return None


class Compiler:
    """Compiles a graph's nodes for `rt` through `registry`'s contracts of `rt.contract_backend`.
    `type_of(name)`: a file tensor's storage type; `settings`: kernel settings (the load layouts
    and `caps.q8_passes` take the ones they name); `mmq`: MINFER_MMQ's choice for many-row matmuls."""

    def __init__(self, graph: Graph, rt: Runtime, registry: Registry, type_of: Callable[[str], GGMLType],
                 settings: dict | None = None, mmq: bool | None = None):
        self.graph, self.rt, self.registry, self.type_of = graph, rt, registry, type_of
        self.settings = dict(settings or {})
        self.mmq = mmq
        self.who = rt.contract_backend.lower()
        self.bound: dict[int, dict[str, Bound]] = {}  # node id -> way of running -> what it runs
        self.by_id = {n.id: n for n in graph.nodes}
        self.readers: dict[int, list[Node]] = {}
        for n in graph.nodes:
            for i in n.inputs:
                self.readers.setdefault(i, []).append(n)
        self._bindings, self._generic = BINDINGS, generic
        self._laid: dict[tuple, Any] = {}
        self._memo: dict[tuple, Any] = {}
        self._picked: dict[tuple, Candidate | None] = {}  # choose's answers by _call_key
        self._scope: list[dict[int, Node]] = []  # while binding a fused node's parts: local id -> node

    def node_of(self, nid: int) -> Node | None:
        """The node that computes value `nid` where the node being bound reads it (a fused node's
        part reads local ids: graph/ir.py)."""
        return self._scope[-1].get(nid) if self._scope else self.by_id.get(nid)

    def binding(self, node: Node) -> Binding:
        return self._bindings.get(node.op, self._generic)

    def call(self, node: Node) -> Call:
        call = self.binding(node).call(self, node)
        if call is None:
            raise UnsupportedError(f"{self.who} backend: op {node.op} (node {node.name!r}) is not implemented")
        return call

    # ------------------------------------------------------------------ picking
    def choose(self, node: Node, call: Call, rows: int, required: bool = True) -> Candidate | None:
        """The best kernel for `call` at `rows` rows with the capabilities it needs (None, or a
        NoKernelError naming the node and the nearest contracts when `required`). A call the picker
        has seen in this compile is answered from memory: a model's layers repeat the same calls, and
        the picker's contract checks were most of a load's compile (a qwen2.5-7b plan: 2.1 s -> 0.55 s)."""
        key = _call_key(call, rows)
        if key is not None and self._picked.get(key) is not None:  # (none: asked again, to raise if required)
            return self._picked[key]
        choice = self._choose(node, call, rows, required)
        if key is not None:
            self._picked[key] = choice
        return choice

    def _choose(self, node: Node, call: Call, rows: int, required: bool) -> Candidate | None:
        ok, rejected = candidates(call.op, call.dtypes, call.shapes(rows), call.params, self.rt.contract_backend,
                                  layouts=call.layouts(rows), registry=self.registry)
        ok = [c for c in ok if call.needs <= c.kernel.contract.caps.also]
        if ok and call.prefer_quantized is not None and rows > 1 and len(ok) > 1:
            ok = [c for c in ok if _reads_quantized(c.kernel) == call.prefer_quantized] or ok
        if ok or not required:
            return ok[0] if ok else None
        near = "; ".join(f"{k.name}: {', '.join(why)}" for k, why in rejected[:3]) or "no contract implements it"
        need = f", with {sorted(call.needs)}" if call.needs else ""
        raise NoKernelError(f"{self.who} backend: node {node.name!r} ({call.op}): no kernel accepts dtypes "
                            f"{call.dtypes}, shapes {call.shapes(rows)}, params {call.params}{need}. "
                            f"Nearest contracts: {near}")

    def can(self, node: Node, way: Way, *caps: str) -> BoundKernel | None:
        """The kernel that runs `node` whole in `way` with `caps`, or None."""
        try:
            call = self.call(node).needing(*caps)
        except (KeyError, UnsupportedError):
            return None
        choice = self.choose(node, call, way.rows, required=False)
        return choice.kernel if choice else None

    def ways(self) -> list[Way]:
        return [Way(kind, rows) for kind, rows in self.rt.kinds.items()]

    def supports(self, node: Node) -> bool:
        """graph/fuse.py's callback: whether some way of running runs `node` whole with what its
        params ask for (a fused op's kernel; an int8-record or KV pairing's half)."""
        asked = asked_caps(node)
        for way in self.ways():
            kernel = self.can(node, way, *asked)
            if kernel is None:
                continue
            # int8-record readers must read int8 x; deferred norms and their readers must read f32 x
            f32_only = "rstd_in" in asked or node.op == Op.MATMUL_ADD_NORM
            if "q8_in" in asked or f32_only:
                passes = self.q8_passes(node, kernel)
                if ("q8_in" in asked and passes == 0) or (f32_only and passes > 0):
                    continue
            return True
        return False

    # ------------------------------------------------------------------ pairings, decided per way of running
    def q8_passes(self, node: Node, kernel: BoundKernel) -> int:
        """The int8-record passes matmul `node`'s `kernel` reads x in for its weight (0: f32 x)."""
        fn = kernel.q8_passes
        w = node.weights["w"]
        qtype = self.matmul_type(w)
        if fn is None or qtype is None:
            return 0
        k, n = w.shape
        return fn(n=n, k=k, qtype=qtype, **self.settings)

    def q8_link(self, producer: Node, way: Way) -> int:
        """The passes `producer` writes x's int8 records in for the matmuls marked to read them
        (0: none in this way): its kernel can write them and theirs read them, in one passes count."""
        key = ("q8", producer.id, way.kind)
        if key not in self._memo:
            passes = set()
            if producer.params.get("q8_out") and self.can(producer, way, "q8_out") is not None:
                for m in self.q8_readers(producer):
                    kernel = self.can(m, way, "q8_in")
                    if kernel is not None:
                        passes.add(self.q8_passes(m, kernel))
            passes.discard(0)
            if len(passes) > 1:
                raise UnsupportedError(f"{self.who} backend: node {producer.name!r} feeds matmuls that read int8 x "
                                       f"in different passes {sorted(passes)}")
            self._memo[key] = passes.pop() if passes else 0
        return self._memo[key]

    def q8_readers(self, producer: Node) -> list[Node]:
        """The matmuls marked to read `producer`'s int8 records (through a Pick of a fused node)."""
        out = []
        for r in self.readers.get(producer.id, []):
            out += self.readers.get(r.id, []) if r.op == Op.PICK else [r]
        return [m for m in out if m.params.get("x_q8")]

    def q8_producer(self, matmul: Node) -> Node | None:
        x = self.node_of(matmul.inputs[0])
        if x is not None and x.op == Op.PICK:
            x = self.node_of(x.inputs[0])
        return x if x is not None and x.params.get("q8_out") else None

    def q8_read(self, matmul: Node, way: Way, kernel: BoundKernel) -> int | None:
        """The producer id whose records `matmul` reads in `way` (its kernel `kernel`), or None."""
        if not matmul.params.get("x_q8"):
            return None
        p = self.q8_producer(matmul)
        if p is None or self.q8_link(p, way) == 0 or self.q8_passes(matmul, kernel) != self.q8_link(p, way):
            return None
        return p.id

    def rstd_link(self, producer: Node, way: Way) -> bool:
        """Whether QMatMulAddNorm `producer` runs whole in `way` (its value then h * w, the rms
        deferred): its kernel accepts the call there and reads x as f32, and every matmul reading the
        normed value (marked `x_rstd`) has a kernel that takes rstd and reads x as f32. An int8-x GEMV
        on either side would quantize x in a launch of its own (the kernel saved, spent again; the
        fused node is no int8-record reader: graph/fuse.py Q8_CONSUMERS). Else it runs as parts."""
        key = ("rstd", producer.id, way.kind)
        if key not in self._memo:
            readers, kernel = self.rstd_readers(producer), self.can(producer, way)
            ok = bool(readers) and kernel is not None and self.q8_passes(producer, kernel) == 0
            for r in readers if ok else ():
                kernel = self.can(r, way, *self._paired_caps(r, way), "rstd_in")
                ok = ok and kernel is not None and self.q8_passes(r, kernel) == 0
            self._memo[key] = ok
        return self._memo[key]

    def rstd_readers(self, producer: Node) -> list[Node]:
        """The nodes reading `producer`'s normed value (its second Pick): all marked x_rstd by the rule."""
        out = []
        for pick in self.readers.get(producer.id, []):
            if pick.op == Op.PICK and pick.params["index"] == 1:
                out += self.readers.get(pick.id, [])
        return out

    def rstd_read(self, reader: Node, way: Way) -> Node | None:
        """The QMatMulAddNorm whose deferred value `reader` reads in `way` (then with rstd), or None."""
        if not reader.params.get("x_rstd"):
            return None
        pick = self.node_of(reader.inputs[0])
        p = self.node_of(pick.inputs[0]) if pick is not None and pick.op == Op.PICK else None
        return p if p is not None and p.op == Op.MATMUL_ADD_NORM and self.rstd_link(p, way) else None

    def kv_written(self, rope_node: Node, way: Way) -> bool:
        """Whether QMatMulRoPE `rope_node` writes its attention's keys and values in `way`: it runs
        whole with a kernel that can (`kv_out_f16`, an f16 cache) and the attention's can skip
        its own write (`kv_skip`)."""
        key = ("kv", rope_node.id, way.kind)
        if key not in self._memo:
            attn = self.kv_reader(rope_node)
            self._memo[key] = bool(
                "kv_layer" in rope_node.params and attn is not None and self.rt.kv_dtype == "F16"
                and self.can(rope_node, way, "kv_out_f16") is not None and self.can(attn, way, "kv_skip") is not None)
        return self._memo[key]

    def kv_reader(self, rope_node: Node) -> Node | None:
        for pick in self.readers.get(rope_node.id, []):
            for s in self.readers.get(pick.id, []):
                for a in self.readers.get(s.id, []):
                    if a.op == Op.ATTENTION and a.params.get("kv_written"):
                        return a
        return None

    def kv_source(self, attn: Node) -> Node | None:
        """The QMatMulRoPE that may write `attn`'s keys and values (graph/fuse.py fuse_kv_write)."""
        s = self.by_id[attn.inputs[1]]
        pick = self.by_id.get(s.inputs[0]) if s.op == Op.SLICE else None
        src = self.by_id.get(pick.inputs[0]) if pick is not None and pick.op == Op.PICK else None
        return src if src is not None and src.op == Op.MATMUL_ROPE else None

    def caps_in(self, node: Node, way: Way) -> tuple[str, ...]:
        """The capabilities `node`'s kernel needs in `way`: the halves of the pairings used there."""
        return self._paired_caps(node, way) + (("rstd_in",) if self.rstd_read(node, way) is not None else ())

    def _paired_caps(self, node: Node, way: Way) -> tuple[str, ...]:
        """caps_in's int8-record and KV halves (what a deferred norm's reader needs beside rstd_in)."""
        caps = []
        if node.params.get("q8_out") and self.q8_link(node, way):
            caps.append("q8_out")
        if node.op == Op.MATMUL_ROPE and self.kv_written(node, way):
            caps.append("kv_out_f16")
        if node.op == Op.ATTENTION and node.params.get("kv_written"):
            src = self.kv_source(node)
            if src is not None and self.kv_written(src, way):
                caps.append("kv_skip")
        return tuple(caps)

    # ------------------------------------------------------------------ compile
    def compile(self, node: Node) -> Step:
        """The node's step: a function per way of running, and the kernels each launches."""
        if node.op in VIEW_OPS or node.op == Op.INPUT:
            return Step.same(self._view(node), "input" if node.op == Op.INPUT else "view", self.rt.kinds)
        per_way = {way.kind: self.bind(node, way) for way in self.ways()}
        self.bound[node.id] = per_way
        fns = {kind: (b.fn if self.rt.upload else _not_loaded) for kind, b in per_way.items()}
        return Step(fns, {kind: b.name for kind, b in per_way.items()})

    def _view(self, node: Node) -> Callable:
        if node.op == Op.INPUT:
            name = node.name
            return lambda vals, st: st.inputs[name]
        (i,) = node.inputs
        if node.op == Op.PICK:
            j = node.params["index"]
            return lambda vals, st: vals[i][j]
        a, b, cols = node.params["start"], node.params["stop"], self.rt.cols
        return lambda vals, st: cols(vals[i], a, b)

    def bind(self, node: Node, way: Way) -> Bound:
        """`node` compiled for `way`: its kernel's launch, or a fused node's parts where no kernel
        takes it whole."""
        if node.op == Op.MATMUL_ADD_NORM and not self.rstd_link(node, way):
            return self._parts(node, way)
        call = self.call(node).needing(*self.caps_in(node, way))
        choice = self.choose(node, call, way.rows, required=node.op not in FUSED_OPS)
        if choice is None:
            return self._parts(node, way)
        return self.binding(node).bind(self, node, choice.kernel, call, way)

    def bind_part(self, node: Node, part: Node, way: Way) -> Bound:
        """One part of fused node `node` compiled alone for `way` (what benchmarks time)."""
        self._scope.append({j: self.node_of(i) for j, i in enumerate(node.inputs)} | {p.id: p for p in node.parts})
        try:
            return self.bind(part, way)
        finally:
            self._scope.pop()

    def _parts(self, node: Node, way: Way) -> Bound:
        """A fused node run as its parts (its own little graph, local ids: graph/ir.py)."""
        steps, launches = [], []
        scope = {j: self.node_of(i) for j, i in enumerate(node.inputs)} | {p.id: p for p in node.parts}
        self._scope.append(scope)
        try:
            for part in node.parts:
                if part.op in VIEW_OPS:
                    steps.append((part.id, self._view(part)))
                    continue
                b = self.bind(part, way)
                steps.append((part.id, b.fn))
                launches += b.launches
        finally:
            self._scope.pop()
        inputs, exports = node.inputs, node.exports
        one = exports[0] if len(exports) == 1 else None

        def fn(vals, st):
            local = [vals[i] for i in inputs] + [None] * len(steps)
            for pid, f in steps:
                local[pid] = f(local, st)
            return local[one] if one is not None else tuple(local[e] for e in exports)

        return Bound(fn, launches)

    # ------------------------------------------------------------------ weights
    def matmul_type(self, w: WeightRef) -> GGMLType | None:
        """The storage type of a (fused) weight; None when its parts differ in type."""
        types = {self.type_of(t.name) for t in w.tensors}
        return types.pop() if len(types) == 1 else None

    def laid_out(self, kernel: BoundKernel, w: WeightRef, params: dict) -> Any:
        """`w` in `kernel`'s load layout, made once per (layout, weight, the call's params): kernels
        that share a layout share the copy. A fused weight whose parts differ in type is read as
        its f16 copy (params qtype F16). None when nothing is uploaded."""
        if not self.rt.upload:
            return None
        layouts = tuple(c.load_layout for c in kernel.contract.inputs if c.load_layout)
        key = (layouts, w, tuple(sorted(params.items())))
        if key not in self._laid:
            mixed = params["qtype"] == GGMLType.F16 and self.matmul_type(w) != GGMLType.F16
            raw = self.rt.dense_f16(w) if mixed else self.rt.weight_bytes(w)
            self._laid[key] = kernel.apply_load_layouts({"w": raw}, {**params, **self.settings})["w"] \
                if kernel.load_layouts else raw
        return self._laid[key]

    def layouts_made(self) -> set[str]:
        """The load layouts (entry points) some weight was laid out in."""
        return {layout for key in self._laid for layout in key[0]}

    def laid_values(self) -> list:
        """Every weight in the layout some kernel reads (what the device must keep)."""
        return list(self._laid.values())

    def vector(self, w: WeightRef):
        """A 1-D weight (a fused one's parts concatenated) as f32 on the device; None when nothing
        is uploaded."""
        return self.rt.vector(w) if self.rt.upload else None

    # ------------------------------------------------------------------ what runs
    def kernel_names(self, kind: str) -> dict[int, str]:
        return {nid: b[kind].name for nid, b in self.bound.items()}

    def contracts(self, nid: int) -> dict[str, str]:
        return {kind: b.name for kind, b in self.bound.get(nid, {}).items()}

    def plan_rows(self, kind: str, rows: int) -> list[dict]:
        """Per node with a kernel: what it launches in way `kind` at `rows` rows, and the cost the
        picker predicts (summed over its launches), in ns."""
        out = []
        for node in self.graph.nodes:
            b = self.bound.get(node.id, {}).get(kind)
            if b is None or not b.launches:
                continue
            cost, measured = 0.0, True
            for launch in b.launches:
                call = launch.call
                ok, _ = candidates(call.op, call.dtypes, call.shapes(rows), call.params, self.rt.contract_backend,
                                   layouts=call.layouts(rows), registry=self.registry)
                cost += next((c.cost_ns for c in ok if c.kernel is launch.kernel), ok[0].cost_ns if ok else math.nan)
                measured = measured and self.registry.measured_overhead_ns(launch.kernel) is not None
            out.append({"id": node.id, "name": node.name, "op": str(node.op), "layer": node.layer, "kernel": b.name,
                        "cost_ns": cost, "measured": measured})
        return out


def asked_caps(node: Node) -> tuple[str, ...]:
    """The capabilities a node's params (set by graph/fuse.py's rules) ask its kernel for."""
    p = node.params
    caps = []
    if p.get("q8_out"):
        caps.append("q8_out")
    if p.get("x_q8"):
        caps.append("q8_in")
    if "kv_layer" in p and node.op == Op.MATMUL_ROPE:
        caps.append("kv_out_f16")
    if p.get("kv_written"):
        caps.append("kv_skip")
    if p.get("x_rstd"):
        caps.append("rstd_in")
    return tuple(caps)


def _not_loaded(vals, st):
    raise UnsupportedError("this plan was compiled without weights (minfer plan); it cannot run")


def _reads_quantized(k: BoundKernel) -> bool:
    """Whether a matmul kernel reads the weight in its quantized form (not a dense copy)."""
    return not any(layout.__name__ == "f16_weight" for layout in k.load_layouts.values())


def fusion_support(rt: Runtime, registry: Registry, type_of: Callable[[str], GGMLType], settings: dict | None = None,
                   mmq: bool | None = None) -> Callable[[Node, Graph], bool]:
    """graph/fuse.py's `supports(node, graph)` for a runtime: a compiler over the graph the rule
    is looking at (made once per graph) answers `Compiler.supports`."""
    made: dict[int, Compiler] = {}

    def supports(node: Node, graph: Graph) -> bool:
        c = made.get(id(graph))
        if c is None or c.graph is not graph:
            c = made[id(graph)] = Compiler(graph, rt, registry, type_of, settings, mmq)
        return c.supports(node)

    return supports
