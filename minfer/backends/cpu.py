"""The cpu backend: executes a Graph with torch; the numerical reference of minfer.

`load` prepares every weight once (cpu_weights.py: float32 for GEMM, int4/f16 for decode) and
compiles the graph into a plan: one closure per node that reads its inputs from a list of
values by index, so a decode step costs a list walk and the torch calls, nothing more. Values
are dropped after their last reader, so a long prefill does not keep every intermediate.

With a trace recorder, `forward` times each node and reports it; without, the same plan runs
with no per-node bookkeeping.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch
from tqdm import tqdm

from ..config import EngineConfig
from ..engine.kv_cache import KVCache
from ..errors import ContextOverflowError, MinferError, ModelError, UnsupportedError
from ..gguf.reader import GGUFReader
from ..graph.ir import Graph, Node, Op, WeightRef
from . import cpu_ops
from .base import Batch
from .cpu_weights import EmbeddingTable, Matrix, dense_f32

# Float32 copies of the matrices (the exact, fast GEMM path) are kept while they take at most
# this fraction of physical memory; beyond it each prefill matmul decodes its weight again.
# A KV cache larger than this fraction is refused.
DENSE_BUDGET = 0.5


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def _dense_bytes(graph: Graph) -> int:
    """Bytes of float32 copies of every matrix the graph multiplies by."""
    refs = {n.weights["w"] for n in graph.nodes if n.op == Op.MATMUL}
    return sum(4 * r.shape[0] * r.shape[1] for r in refs)


class _Step:
    """What one forward pass's nodes share: the batch, the cache, per-step rope matrices, and for
    a one-token step of one sequence (plain decode) views of its cache made once for all layers
    (unbound per layer: a tuple lookup per node instead of a tensor select): where this token's
    k/v go, n_layer x [n_kv, hd], and the keys/values it attends, n_layer x [n_kv, L, hd]."""

    __slots__ = ("batch", "cache", "rope", "one")

    def __init__(self, batch: Batch, cache: KVCache):
        self.batch, self.cache, self.rope = batch, cache, {}
        self.one = None
        if len(batch.spans) == 1 and batch.spans[0].n_tokens == 1:
            slot, pos = batch.spans[0].slot, batch.spans[0].start
            k, v = cache.k[:, slot], cache.v[:, slot]
            self.one = tuple(t.unbind(0) for t in (k[:, :, pos], v[:, :, pos], k[:, :, :pos + 1], v[:, :, :pos + 1]))


Values = list
StepFn = Callable[[Values, _Step], torch.Tensor]


class CPUBackend:
    name = "cpu"

    def __init__(self, config: EngineConfig | None = None):
        self.config = config or EngineConfig()
        self.graph: Graph | None = None
        self._plan: list[tuple[int, StepFn, tuple[int, ...]]] = []
        self._kernels: dict[int, Callable[[int], str]] = {}
        self._n_ctx_rope = 0

    # ------------------------------------------------------------------ load
    def load(self, graph: Graph, reader: GGUFReader, progress: bool = True) -> None:
        """Prepare the weights the graph reads and compile the plan (tqdm bar if it takes > 0.5 s)."""
        self.graph = graph
        self._reader = reader
        self._vectors: dict[str, torch.Tensor] = {}
        self._matrices: dict[tuple[WeightRef, WeightRef | None], Matrix] = {}
        self._tables: dict[str, EmbeddingTable] = {}
        self._ropes: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._n_ctx_rope = int(graph.meta.get("n_ctx_train", 4096))
        self._keep_dense = _dense_bytes(graph) <= DENSE_BUDGET * _physical_memory()
        self._matmul_weights = {n.weights["w"] for n in graph.nodes if n.op == Op.MATMUL and "b" not in n.weights}
        fns = []
        with tqdm(total=sum(1 for n in graph.nodes if n.weights), desc="preparing weights", unit="node",
                  delay=0.5, disable=not progress, leave=False) as bar:
            for node in graph.nodes:
                fns.append(self._compile(node))
                bar.update(bool(node.weights))
        last = graph.consumers_last_use()
        frees: dict[int, list[int]] = {}
        for vid, reader_id in last.items():
            if reader_id < len(graph.nodes) and graph.nodes[vid].op != Op.INPUT:
                frees.setdefault(reader_id, []).append(vid)
        # (node id, step function, values whose last reader it is: dropped right after it runs)
        self._plan = [(n.id, fn, tuple(frees.get(n.id, ()))) for n, fn in zip(graph.nodes, fns, strict=True)]

    def _vector(self, name: str) -> torch.Tensor:
        if name not in self._vectors:
            self._vectors[name] = dense_f32(self._reader, self._reader.tensors[name]).contiguous()
        return self._vectors[name]

    def _matrix(self, w: WeightRef, b: WeightRef | None) -> Matrix:
        key = (w, b)
        if key not in self._matrices:
            bias = torch.cat([self._vector(t.name) for t in b.tensors]) if b else None
            infos = [self._reader.tensors[t.name] for t in w.tensors]
            self._matrices[key] = Matrix(self._reader, infos, bias, self._keep_dense)
        return self._matrices[key]

    def _rope_key(self, node: Node) -> tuple:
        """Compute (once per distinct rope setting) the cos/sin table for n_ctx_rope positions."""
        p = node.params
        ff = node.weights.get("freq_factors")
        key = (p["n_rot"], p["base"], p["freq_scale"], ff.name if ff else None)
        if key not in self._ropes or self._ropes[key][0].shape[0] < self._n_ctx_rope:
            factors = self._vector(ff.name) if ff else None
            self._ropes[key] = cpu_ops.rope_table(self._n_ctx_rope, p["n_rot"], p["base"], p["freq_scale"],
                                                  factors)
        return key

    # ------------------------------------------------------------------ compile
    def _compile(self, node: Node) -> StepFn:
        op, ins, p = node.op, node.inputs, node.params
        kernel = f"torch.{op.value}"
        self._kernels[node.id] = lambda rows, k=kernel: k
        if op == Op.INPUT:
            name = node.name
            return lambda vals, st: getattr(st.batch, name)
        if op == Op.GET_ROWS:
            if "w" in node.weights:
                (i,), w = ins, node.weights["w"]
                if self._keep_dense and w in self._matmul_weights:  # tied: the output's exact float32 copy
                    dense = self._matrix(w, None).dense
                    return lambda vals, st: dense.index_select(0, vals[i])
                table = self._tables.setdefault(w.name, EmbeddingTable(self._reader, self._reader.tensors[w.name]))
                return lambda vals, st: table(vals[i])
            i, r = ins
            return lambda vals, st: vals[i].index_select(0, vals[r])
        if op == Op.RMS_NORM:
            (i,), norm = ins, cpu_ops.RMSNorm(self._vector(node.weights["w"].name), p["eps"])
            return lambda vals, st: norm(vals[i])
        if op == Op.MATMUL:
            m = self._matrix(node.weights["w"], node.weights.get("b"))
            self._kernels[node.id] = m.kernel
            (i,) = ins
            if node.id == self.graph.output:  # logits are float32 whatever the weight's path
                return lambda vals, st: m(vals[i]).float()
            return lambda vals, st: m(vals[i])
        if op == Op.ADD:
            i, j = ins
            return lambda vals, st: vals[i] + vals[j]
        if op == Op.SLICE:
            (i,), a, b = ins, p["start"], p["stop"]
            return lambda vals, st: vals[i][..., a:b]
        if op == Op.SWIGLU:
            i, j = ins
            return lambda vals, st: cpu_ops.swiglu(vals[i], vals[j])
        if op == Op.ROPE:
            return self._compile_rope(node)
        if op == Op.ATTENTION:
            return self._compile_attention(node)
        raise UnsupportedError(f"cpu backend: op {op} (node {node.name!r}) is not implemented")

    def _compile_rope(self, node: Node) -> StepFn:
        p = node.params
        key = self._rope_key(node)
        tables = self._ropes
        i, pos = node.inputs
        n_heads, hd, n_rot, style = p["n_heads"], p["head_dim"], p["n_rot"], p["style"]
        step_key = (*key, hd, style)

        def run(vals: Values, st: _Step) -> torch.Tensor:
            rot = st.rope.get(step_key)
            if rot is None:  # first RoPE node of the step: one rotation matrix per token, for all layers
                cos, sin = tables[key]
                positions = vals[pos]
                rot = cpu_ops.rope_matrix(cos[positions], sin[positions], hd, n_rot, style)
                rot = st.rope[step_key] = rot[0] if rot.shape[0] == 1 else rot
            return cpu_ops.apply_rope(vals[i], rot, n_heads, hd)

        return run

    def _compile_attention(self, node: Node) -> StepFn:
        p = node.params
        q_i, k_i, v_i, _ = node.inputs
        layer, n_head, n_kv, hd, scale = p["kv_layer"], p["n_head"], p["n_head_kv"], p["head_dim"], p["scale"]

        def run(vals: Values, st: _Step) -> torch.Tensor:
            if st.one is not None:
                k_at, v_at, keys, values = st.one
                k_at[layer].copy_(vals[k_i].view(n_kv, hd))
                v_at[layer].copy_(vals[v_i].view(n_kv, hd))
                return cpu_ops.attention_one(vals[q_i].view(n_head, hd), keys[layer], values[layer], scale)
            kc, vc = st.cache.k[layer], st.cache.v[layer]
            spans = st.batch.spans
            q = vals[q_i].unflatten(-1, (n_head, hd))
            k = vals[k_i].unflatten(-1, (n_kv, hd)).transpose(0, 1)
            v = vals[v_i].unflatten(-1, (n_kv, hd)).transpose(0, 1)
            out = torch.empty(q.shape[0], n_head * hd)
            for s in spans:
                rows = slice(s.offset, s.offset + s.n_tokens)
                kc[s.slot, :, s.start:s.start + s.n_tokens] = k[:, rows]
                vc[s.slot, :, s.start:s.start + s.n_tokens] = v[:, rows]
                out[rows] = cpu_ops.attention(q[rows], kc[s.slot], vc[s.slot], s.start, scale)
            return out

        return run

    # ------------------------------------------------------------------ run
    def new_cache(self, n_slots: int, n_ctx: int) -> KVCache:
        if self.graph is None:
            raise ModelError("cpu backend: load() a graph before allocating its cache")
        m = self.graph.meta
        need = 2 * 4 * m["n_layer"] * n_slots * m["n_head_kv"] * n_ctx * m["head_dim"]
        if need > DENSE_BUDGET * _physical_memory():
            raise MinferError(f"a KV cache of {n_slots} x {n_ctx} tokens needs {need / 2**30:.1f} GiB, "
                              f"more than {DENSE_BUDGET:.0%} of this machine's memory; use a smaller context")
        if n_ctx > self._n_ctx_rope:  # a context longer than training: extend the rope tables
            self._n_ctx_rope = n_ctx
            for node in self.graph.nodes:
                if node.op == Op.ROPE:
                    self._rope_key(node)
        return KVCache(m["n_layer"], n_slots, n_ctx, m["n_head_kv"], m["head_dim"])

    def forward(self, batch: Batch, cache: KVCache, recorder=None) -> torch.Tensor:
        """Logits [R, n_vocab] float32 of the batch's out_rows. Writes the step's keys/values."""
        for s in batch.spans:
            if s.start + s.n_tokens > cache.n_ctx:
                raise ContextOverflowError(f"positions {s.start}..{s.start + s.n_tokens - 1} do not fit "
                                           f"the context of {cache.n_ctx} tokens")
        with torch.inference_mode():  # no autograd bookkeeping: a third less per-op overhead
            return self._run(batch, cache, recorder)

    def _run(self, batch: Batch, cache: KVCache, recorder) -> torch.Tensor:
        vals: Values = [None] * len(self._plan)
        st = _Step(batch, cache)
        if recorder is None:
            for nid, fn, dead in self._plan:
                vals[nid] = fn(vals, st)
                for d in dead:
                    vals[d] = None
        else:
            for nid, fn, dead in self._plan:
                t0 = time.perf_counter()
                out = vals[nid] = fn(vals, st)
                recorder.node(nid, out, time.perf_counter() - t0, self._kernels[nid](out.shape[0]))
                for d in dead:
                    vals[d] = None
        return vals[self.graph.output]

    def trace_graph(self) -> list[dict]:
        """The graph's nodes for TraceRecorder.set_graph, each with its decode-step kernel."""
        return self.graph.trace_nodes({nid: k(1) for nid, k in self._kernels.items()})
