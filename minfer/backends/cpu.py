"""The cpu backend: executes a Graph with torch; the numerical reference of minfer.

`load` prepares every weight once (cpu_weights.py: the VNNI form of the C kernels or torch's
int4 form for quantized types, the file's bytes or a float32 copy for float ones) and compiles
the graph into the shared plan (plan.py): one closure per node that reads its inputs from the
list of values by index. `allocate` makes the KV cache and the RoPE tables for the
context asked.

Batch invariance: a step's decode rows always take the decode path (compact weights, one SDPA
call per sequence), and its prefill rows the prefill path; a mixed step runs the two parts as
two passes over the plan. Every op computes a row independently of the others (cpu_ops.py,
cpu_weights.py), so a sequence's numbers do not depend on what else the batch carries.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch

from ..config import EngineConfig
from ..errors import InsufficientMemoryError, ModelError, UnsupportedError
from ..gguf.reader import GGUFReader
from ..graph.ir import Graph, Node, Op, WeightRef
from ..kernels import cpu_vnni
from . import cpu_ops
from .base import Batch
from .cpu_weights import EmbeddingTable, Matrix, dense_f32, pick_kernel, prepared_bytes
from .kv_cache import KVCache, kv_bytes
from .plan import Plan, Step

# A KV cache larger than this fraction of physical memory is refused.
KV_BUDGET = 0.5
# Memory left free beyond the weights: activations, the RoPE tables, torch and Python themselves.
HEADROOM = 512 << 20
TRIM_WEIGHTS = 1 << 24  # after packing a matrix of at least this many weights, trim the heap


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def physical_cores() -> int:
    """Cores this process may run on, hyper-threads counted once (/proc/cpuinfo's core ids)."""
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        allowed = set(range(os.cpu_count() or 1))
    try:
        cores, cpu, phys = set(), None, None
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "processor":
                    cpu = int(val)
                elif key == "physical id":
                    phys = val.strip()
                elif key == "core id" and cpu in allowed:
                    cores.add((phys, val.strip()))
        return max(1, len(cores)) if cores else max(1, len(allowed))
    except (OSError, ValueError):
        return max(1, len(allowed))


@functools.cache
def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def trim_heap() -> None:
    """Give the heap's free memory back to the system (glibc malloc_trim). Packing a weight frees
    tens of MB of temporaries of sizes glibc keeps on its heap (its mmap threshold grows to 32 MB),
    ~0.4 GiB for an 8B model: without this, resident memory stays that much above the weights."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def available_memory() -> int:
    """MemAvailable of /proc/meminfo (what can be allocated without swapping), else physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return physical_memory()


def plan_rows(graph: Graph, reader: GGUFReader, rows: int = 1, prefill: bool = False) -> list[dict]:
    """Per matmul node: the cpu kernel contract(s) its weight parts run on for a decode step of
    `rows` rows (or a prompt chunk of `rows` tokens, `prefill`; its output projection gets one
    row, the last token's) and the cost the picker predicts, in ns. Reads the header only:
    nothing is packed. The other ops run as plain torch calls with no contract: not listed."""
    out = []
    for node in graph.nodes:
        if node.op != Op.MATMUL:
            continue
        names, cost = [], 0.0
        n_rows = 1 if prefill and node.id == graph.output else rows  # a prompt's logits: its last row
        for t in node.weights["w"].tensors:
            info = reader.tensors[t.name]
            # the logits take the decode rows' kernel in prompts too (two activation passes on VNNI)
            c = pick_kernel(info.ggml_type, *info.torch_shape, rows=n_rows,
                            decode=not prefill or node.id == graph.output)
            names.append(c.kernel.name)
            cost += c.cost_ns
        out.append({"id": node.id, "name": node.name, "op": str(node.op), "layer": node.layer,
                    "kernel": "+".join(dict.fromkeys(names)), "cost_ns": cost, "measured": False})
    return out


class _State:
    """What one pass's nodes share: the batch, the cache, the path (decode or prefill), the step's
    RoPE rotations, and for decode the cache rows of every row's keys and values (one index_copy_
    per layer for all rows) and the cache views each sequence attends, made once for all
    layers (a tuple lookup per node instead of tensor selects): keys and values n_layer x
    [n_kv, L, hd]."""

    __slots__ = ("batch", "cache", "decode", "rope", "views", "at", "lens")

    def __init__(self, batch: Batch, cache: KVCache | None, decode: bool, c_attention: bool = False):
        self.batch, self.cache, self.decode, self.rope = batch, cache, decode, {}
        self.views, self.at, self.lens = [], None, None
        if decode and cache is not None:
            n_kv, n_ctx = cache.k.shape[2], cache.k.shape[3]
            # row b's head h goes to row (slot_b * n_kv + h) * n_ctx + pos_b of a layer's [-1, hd] view
            heads = torch.arange(n_kv) * n_ctx
            self.at = ((batch.row_slots.long() * (n_kv * n_ctx) + batch.positions.long()).unsqueeze(1)
                       + heads).view(-1)
            if c_attention:  # the C kernel reads the cache itself: each row's slot and length
                self.lens = batch.positions + 1
                return
            for s in batch.spans:
                end = s.start + 1
                self.views.append((cache.k[:, s.slot, :, :end].unsqueeze(1).unbind(0),  # n_layer x [1, n_kv, L, hd]
                                   cache.v[:, s.slot, :, :end].unsqueeze(1).unbind(0)))

    @property
    def n_rows(self) -> int:
        return self.batch.n_tokens


class _Describe:
    """A stand-in state for naming kernels outside a step (trace_graph: a one-token decode)."""

    decode, n_rows = True, 1


KV_DTYPES = {"auto": torch.float32, "f32": torch.float32}


def _add_into(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y written into x when x is the float32 sum (the same values as x + y)."""
    return x.add_(y) if x.dtype == torch.float32 else x + y


class CPUBackend:
    name = "cpu"
    kv_itemsize = 4
    prefill_seqs = 1  # one prompt per step: every row's numbers independent of the other requests

    def __init__(self, config: EngineConfig | None = None, comm=None):
        self.config = config or EngineConfig()
        self.comm = comm  # parallel/comm.py: the collectives of a tensor-parallel graph
        self._world = comm.world if comm is not None else 1  # ranks share the host's memory
        self._memory = physical_memory() // self._world
        self.threads = self.config.threads or physical_cores()
        torch.set_num_threads(self.threads)  # torch's setting is per process
        if self.config.kv_dtype not in KV_DTYPES:
            raise UnsupportedError(f"cpu backend: KV cache dtype {self.config.kv_dtype!r} is not supported "
                                   f"(supported: {', '.join(KV_DTYPES)})")
        self.graph: Graph | None = None
        self.plan: Plan | None = None
        self.cache: KVCache | None = None
        self._reader: GGUFReader | None = None
        self._vectors: dict[str, torch.Tensor] = {}
        self._matrices: dict[tuple[WeightRef, WeightRef | None], Matrix] = {}
        self._tables: dict[str, EmbeddingTable] = {}
        self._ropes: dict[tuple, torch.Tensor] = {}  # rope setting -> (cos, sin) [n_ctx, n_rot/2]
        self._readers: dict[int, list[Node]] | None = None  # node id -> the nodes reading its value
        self._last: dict[int, int] | None = None  # node id -> the last node reading its value
        self._flat: tuple = ((), ())  # the cache's per-layer [-1, hd] views (allocate)
        self._c_attention = False  # decode attention by the C kernel (allocate: where it runs, for these shapes)

    # ------------------------------------------------------------------ load
    def load(self, graph: Graph, reader: GGUFReader, progress: bool = True) -> None:
        """Prepare the weights the graph reads and compile the plan (tqdm bar if it takes > 0.5 s)."""
        self.graph, self._reader = graph, reader
        self.check_memory(graph, reader)
        # Packing is byte shuffling bound by memory, and one thread does it about as fast as two on
        # a quiet machine; on a busy one every 2-thread region waits for a descheduled thread
        # (8B: 26 s with 1 thread, 159 s with 2, bench/NOTES.md). So weights are packed on one.
        torch.set_num_threads(1)
        try:
            self.plan = Plan(graph, self._compile, progress=progress, comm=self.comm)
        finally:
            torch.set_num_threads(self.threads)
        trim_heap()

    def _vector(self, name: str) -> torch.Tensor:
        if name not in self._vectors:
            self._vectors[name] = dense_f32(self._reader, self._reader.tensors[name]).contiguous()
        return self._vectors[name]

    def _matrix(self, w: WeightRef, b: WeightRef | None) -> Matrix:
        key = (w, b)
        if key not in self._matrices:
            bias = torch.cat([self._vector(t.name) for t in b.tensors]) if b else None
            infos = [self._reader.tensors[t.name] for t in w.tensors]
            self._matrices[key] = m = Matrix(self._reader, infos, bias)
            if m.n * m.k >= TRIM_WEIGHTS:
                trim_heap()
        return self._matrices[key]

    @staticmethod
    def weight_bytes(graph: Graph, reader: GGUFReader) -> int:
        """Bytes the prepared matrices will take (the packed int4 forms, float copies of F16)."""
        return sum(prepared_bytes(reader.tensors[t.name]) for t in
                   {t for n in graph.nodes if n.op == Op.MATMUL for t in n.weights["w"].tensors})

    def check_memory(self, graph: Graph, reader: GGUFReader) -> None:
        """Refuse, before anything is prepared, a model whose weights do not fit the memory available."""
        need, have = self.weight_bytes(graph, reader) + HEADROOM, available_memory() // self._world
        if need > have:
            raise InsufficientMemoryError(f"the cpu backend's weights of {reader.path.name}", need, have,
                                          "close other programs or use a smaller quantization")

    @staticmethod
    def _rope_key(node: Node) -> tuple:
        """What a RoPE node's table depends on: every param but the head layout, and its factors."""
        p = {k: v for k, v in node.params.items() if k not in ("n_heads", "head_dim", "style")}
        return (*sorted(p.items()), *sorted((r, w.name) for r, w in node.weights.items()))

    # ------------------------------------------------------------------ compile
    def _compile(self, node: Node) -> Step:
        op, ins, p = node.op, node.inputs, node.params
        label = f"torch.{op.value}"
        if op == Op.INPUT:
            name = node.name
            return Step(lambda vals, st: getattr(st.batch, name), label)
        if op == Op.GET_ROWS:
            if "w" in node.weights:
                (i,), w = ins, node.weights["w"]
                table = self._tables.setdefault(w.name, EmbeddingTable(self._reader, self._reader.tensors[w.name]))
                return Step(lambda vals, st: table(vals[i]), label)
            i, r = ins
            return Step(lambda vals, st: vals[i].index_select(0, vals[r]), label)
        if op == Op.RMS_NORM:
            # bfloat16 straight away when only int4 matmuls read it (they would convert it first)
            dtype = torch.bfloat16 if self._int4_inputs(node) else torch.float32
            norm = cpu_ops.RMSNorm(self._vector(node.weights["w"].name), p["eps"], dtype, p.get("group"))
            (i,) = ins
            return Step(lambda vals, st: norm(vals[i]), label)
        if op == Op.MATMUL:
            m = self._matrix(node.weights["w"], node.weights.get("b"))
            (i,) = ins
            kernel = lambda st: m.kernel(st.decode)  # noqa: E731
            if node.id == self._logits_id():  # logits are float32 whatever the weight's path
                # and the VNNI kernels give them the decode rows' two activation passes in prompts too
                return Step(lambda vals, st: m(vals[i], st.decode, passes=2).float(), lambda st: m.kernel(True))
            direct = m.direct()
            if direct is not None:  # one quantized kernel, no bias: called as it is
                kind, mm = direct
                if kind == "vnni":  # two int8 passes of the activations, decode rows and prompts alike
                    return Step(lambda vals, st: mm(vals[i], 2), kernel)
                return Step(lambda vals, st: mm(vals[i]), kernel)
            return Step(lambda vals, st: m(vals[i], st.decode), kernel)
        if op == Op.ADD:
            i, j = ins
            if self._owned_last_use(node, i):  # the residual stream: added to in place
                return Step(lambda vals, st: _add_into(vals[i], vals[j]), label)
            return Step(lambda vals, st: vals[i] + vals[j], label)
        if op == Op.SLICE:
            (i,), a, b = ins, p["start"], p["stop"]
            return Step(lambda vals, st: vals[i][..., a:b], label)
        if op == Op.SWIGLU:
            i, j = ins
            return Step(lambda vals, st: cpu_ops.swiglu(vals[i], vals[j]), label)
        if op == Op.GEGLU:
            i, j = ins
            return Step(lambda vals, st: cpu_ops.geglu(vals[i], vals[j]), label)
        if op == Op.SCALE:
            (i,), c = ins, p["scale"]
            return Step(lambda vals, st: cpu_ops.scale(vals[i], c), label)
        if op == Op.SOFTCAP:
            (i,), c = ins, p["cap"]
            return Step(lambda vals, st: cpu_ops.softcap(vals[i], c), label)
        if op == Op.ROPE:
            return Step(self._compile_rope(node), label)
        if op == Op.ATTENTION:
            return Step(self._compile_attention(node), label)
        raise UnsupportedError(f"cpu backend: op {op} (node {node.name!r}) is not implemented")

    def _logits_id(self) -> int:
        """The matmul that makes the logits: the graph's output, or what a final SoftCap reads."""
        out = self.graph.nodes[self.graph.output]
        return out.inputs[0] if out.op == Op.SOFTCAP else out.id

    def _consumers(self, node: Node) -> list[Node]:
        if self._readers is None:
            self._readers = {}
            for n in self.graph.nodes:
                for i in n.inputs:
                    self._readers.setdefault(i, []).append(n)
        return self._readers.get(node.id, [])

    def _int4_inputs(self, node: Node) -> bool:
        """Whether every reader of the node's value is a matmul whose weights all run on torch's
        int4 kernels (which take bfloat16 activations; the VNNI kernel quantizes float32 ones)."""
        infos = self._reader.tensors
        readers = self._consumers(node)
        return bool(readers) and node.id != self._logits_id() and all(
            r.op == Op.MATMUL and all(
                pick_kernel(i.ggml_type, *i.torch_shape, decode=True).kernel.name.startswith("cpu_int4pack")
                for i in (infos[t.name] for t in r.weights["w"].tensors))
            for r in readers)

    def _owned_last_use(self, node: Node, i: int) -> bool:
        """Whether input i is a fresh float tensor of this step (an Add's sum, an embedding row)
        that nothing reads after this node: the node may overwrite it."""
        src = self.graph.nodes[i]
        if self._last is None:
            self._last = self.graph.consumers_last_use()
        return (self._last[i] == node.id and i != self.graph.output
                and (src.op in (Op.ADD, Op.SCALE) or (src.op == Op.GET_ROWS and "w" in src.weights)))

    def _compile_rope(self, node: Node):
        p = node.params
        key = self._rope_key(node)
        ropes = self._ropes
        i, pos = node.inputs
        n_heads, hd, n_rot, style = p["n_heads"], p["head_dim"], p["n_rot"], p["style"]

        def run(vals, st: _State) -> torch.Tensor:
            rot = st.rope.get(key)
            if rot is None:  # first RoPE node of the step: the tokens' rotations, for all layers
                cos, sin = ropes[key]
                positions = vals[pos]
                rot = st.rope[key] = cpu_ops.rope_rotation(cos[positions], sin[positions])
            return cpu_ops.apply_rope(vals[i], rot, n_heads, hd, n_rot, style)

        return run

    def _compile_attention(self, node: Node):
        p = node.params
        q_i, k_i, v_i, _ = node.inputs
        layer, n_head, n_kv, hd, scale = p["kv_layer"], p["n_head"], p["n_head_kv"], p["head_dim"], p["scale"]
        softcap = p.get("softcap", 0.0)

        def run(vals, st: _State) -> torch.Tensor:
            # a window only matters once some query of the step is `window` positions in (the
            # plain paths before that: SDPA, the C decode kernel)
            window = p.get("window", 0)
            if window and max(s.end for s in st.batch.spans) <= window:
                window = 0
            if st.decode:  # one query per sequence, over its own cache
                q, k, v = vals[q_i], vals[k_i], vals[v_i]
                rows = q.shape[0]
                kc, vc = self._flat[0][layer], self._flat[1][layer]  # [slot * n_kv * n_ctx, hd]
                kc.index_copy_(0, st.at, k.reshape(rows * n_kv, hd).to(kc.dtype))  # each row at its slot, position
                vc.index_copy_(0, st.at, v.reshape(rows * n_kv, hd).to(vc.dtype))
                if window or softcap:  # each row over its own window of its slot's cache
                    slots, pos = st.batch.row_slots.tolist(), st.batch.positions.tolist()
                    k_all, v_all = st.cache.k[layer], st.cache.v[layer]
                    if not softcap:  # one query sees a contiguous run of keys: SDPA over the window's slice
                        qd = q.view(rows, 1, n_head, 1, hd).unbind(0)
                        return torch.cat([cpu_ops.attention_decode(
                            qd[b], k_all[slots[b], :, max(0, pos[b] + 1 - window):pos[b] + 1].unsqueeze(0),
                            v_all[slots[b], :, max(0, pos[b] + 1 - window):pos[b] + 1].unsqueeze(0),
                            scale).view(1, -1) for b in range(rows)])
                    qs = q.view(rows, 1, n_head, hd).unbind(0)
                    return torch.cat([cpu_ops.attention_masked(qs[b], k_all[slots[b], :, :pos[b] + 1],
                                                               v_all[slots[b], :, :pos[b] + 1], pos[b], scale,
                                                               window, softcap) for b in range(rows)])
                if st.lens is not None:  # every row in one call (csrc/q4_vnni.c attn_decode)
                    return cpu_vnni.attention_decode(q, st.cache.k[layer], st.cache.v[layer], st.batch.row_slots,
                                                     st.lens, n_head, scale)
                if rows == 1:
                    keys, values = st.views[0]
                    out = cpu_ops.attention_decode(q.view(1, n_head, 1, hd), keys[layer], values[layer], scale)
                    return out.view(1, n_head * hd)
                qs = q.view(rows, 1, n_head, 1, hd).unbind(0)
                return torch.cat([cpu_ops.attention_decode(qs[b], keys[layer], values[layer], scale)
                                  for b, (keys, values) in enumerate(st.views)]).view(rows, n_head * hd)
            kc, vc = st.cache.k[layer], st.cache.v[layer]
            q = vals[q_i].unflatten(-1, (n_head, hd))
            k = vals[k_i].unflatten(-1, (n_kv, hd)).transpose(0, 1)
            v = vals[v_i].unflatten(-1, (n_kv, hd)).transpose(0, 1)
            out = torch.empty(q.shape[0], n_head * hd)
            for s in st.batch.spans:
                rows = slice(s.offset, s.offset + s.n_tokens)
                kc[s.slot, :, s.start:s.end] = k[:, rows]
                vc[s.slot, :, s.start:s.end] = v[:, rows]
                w = window if s.end > window else 0
                out[rows] = cpu_ops.attention(q[rows], kc[s.slot], vc[s.slot], s.start, scale, w, softcap)
            return out

        return run

    def decode_weight_bytes(self) -> int:
        """Bytes of weights one decode row reads: every prepared matrix once (its packed form)
        and one row of each embedding table."""
        rows = sum(t.raw.shape[1] for t in self._tables.values())
        return sum(m.nbytes for m in self._matrices.values()) + rows

    # ------------------------------------------------------------------ memory
    def kv_budget(self) -> int:
        """An eighth of physical memory (split over ranks: of this rank's share) for a cache whose
        size the engine chooses."""
        return self._memory // 8

    def allocate(self, n_slots: int, n_ctx: int) -> None:
        """The KV cache for n_slots sequences of n_ctx tokens, and RoPE tables for n_ctx positions."""
        if self.graph is None:
            raise ModelError("cpu backend: load() a graph before allocating its cache")
        m = self.graph.meta
        need = kv_bytes(m["n_layer"], n_slots, n_ctx, m["n_head_kv"], m["head_dim"], 4)
        old = self.cache.k.numel() * 8 if self.cache is not None else 0  # freed before the new one is made
        have = min(int(KV_BUDGET * self._memory), available_memory() // self._world + old - HEADROOM)
        if need > have:
            raise InsufficientMemoryError(f"a KV cache of {n_slots} x {n_ctx} tokens", need, max(have, 0),
                                          "use a smaller context (-c) or fewer slots")
        self.cache = None  # free the old cache before the new one is made
        self.cache = KVCache(m["n_layer"], n_slots, n_ctx, m["n_head_kv"], m["head_dim"])
        # per layer, every slot's positions as rows [slot * n_kv * n_ctx, hd]: decode writes by index
        self._flat = tuple(t.view(m["n_layer"], -1, m["head_dim"]).unbind(0) for t in (self.cache.k, self.cache.v))
        self._c_attention = cpu_vnni.available() and all(
            cpu_vnni.attention_fits(n.params["n_head"], n.params["n_head_kv"], n.params["head_dim"])
            for n in self.graph.nodes if n.op == Op.ATTENTION)
        self._ropes.clear()
        for node in self.graph.nodes:
            if node.op == Op.ROPE:
                key = self._rope_key(node)
                if key not in self._ropes:
                    p, ff = node.params, node.weights.get("freq_factors")
                    if "n_ctx_orig" in p and n_ctx > p["n_ctx_orig"]:  # LongRoPE: the long factors past it
                        ff = node.weights["freq_factors_long"]
                    factors = self._vector(ff.name) if ff else None
                    self._ropes[key] = cpu_ops.rope_table(n_ctx, p["n_rot"], p["base"], p["freq_scale"], factors,
                                                          p.get("attn_factor", 1.0), p.get("yarn"))

    # ------------------------------------------------------------------ run
    def forward(self, batch: Batch, recorder=None) -> torch.Tensor:
        """Logits [R, n_vocab] float32 of the batch's out_rows. Writes the step's keys/values."""
        cache = self.cache
        if cache is None:
            raise ModelError("cpu backend: allocate() the KV cache before running a step")
        batch.check(cache.n_slots, cache.n_ctx)
        with torch.inference_mode():  # no autograd bookkeeping: a third less per-op overhead
            parts = batch.split()
            c_attn = self._c_attention
            if len(parts) == 1:
                return self.plan.run(_State(batch, cache, batch.kind == "decode", c_attn), recorder)
            out = torch.empty(len(batch.out_rows), self.graph.meta["n_vocab"])
            for part, idx in parts:
                logits = self.plan.run(_State(part, cache, part.kind == "decode", c_attn), recorder)
                out[idx] = logits
            return out

    def trace_graph(self) -> list[dict]:
        """The graph's nodes for TraceRecorder.set_graph, each with its decode-step kernel."""
        return self.plan.trace_nodes(_Describe())
