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

from ...config import EngineConfig
from ...errors import InsufficientMemoryError, ModelError, UnsupportedError
from ...gguf.reader import GGUFReader
from ...graph.ir import Graph, Node, Op, WeightRef
from ...kernels.cbuild import use_cache_dir
from ...kernels.cpu import vnni as cpu_vnni
from ..base import Backend, Batch, HostPicked
from ..kv_cache import KVCache, kv_bytes, kv_type
from ..plan import Plan, Step
from ..rope import rope_tables
from .native import DecodeProgram, program_reason
from .steps import CPU_OPS, KINDS
from .weight_cache import WeightCache
from .weights import MOE_VNNI, EmbeddingTable, Experts, Matrix, dense_f32, expert_kernel, pick_kernel, prepared_bytes

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


def plan_rows(graph: Graph, reader: GGUFReader, rows: int = 1, prefill: bool = False, vnni: bool = True,
              prompt_passes: int = 1) -> list[dict]:
    """Per matmul node (an expert matmul: its kernel, the cost of one expert's matrix times the
    experts a row runs): the cpu kernel contract(s) its weight parts run on for a decode step of
    `rows` rows (or a prompt chunk of `rows` tokens, `prefill`; its output projection gets one
    row, the last token's) and the cost the picker predicts, in ns; `prompt_passes` 2: a prompt's
    VNNI kernels are the decode rows' two-pass ones (EngineConfig.cpu_prompt_passes). Reads the header only:
    nothing is packed. The other ops run as plain torch calls with no contract: not listed."""
    out = []
    for node in graph.nodes:
        if node.op not in (Op.MATMUL, Op.MOE_MATMUL):
            continue
        names, cost = [], 0.0
        n_rows = 1 if prefill and node.id == graph.logits_id else rows  # a prompt's logits: its last row
        for t in node.weights["w"].tensors:
            info = reader.tensors[t.name]
            if node.op == Op.MOE_MATMUL:  # the cost: one expert's matrix per expert a row runs
                e, n, k = info.torch_shape
                name = expert_kernel(info.ggml_type, n, k, e, vnni)
                c = pick_kernel(info.ggml_type, n, k, rows=n_rows, decode=True, vnni=vnni and name == MOE_VNNI)
                names.append(name)
                cost += c.cost_ns * node.shape[1]
                continue
            # the logits take the decode rows' kernel in prompts too (two activation passes on VNNI)
            c = pick_kernel(info.ggml_type, *info.torch_shape, rows=n_rows,
                            decode=not prefill or node.id == graph.logits_id or prompt_passes == 2, vnni=vnni)
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

    __slots__ = ("batch", "cache", "decode", "kind", "rope", "views", "at", "lens", "starts")

    def __init__(self, batch: Batch, cache: KVCache | None, decode: bool, c_attention: bool = False):
        self.batch, self.cache, self.decode, self.rope, self.starts = batch, cache, decode, {}, {}
        self.kind = "decode" if decode else "prefill"
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


KV_SUPPORTED = ("f32",)


class CPUBackend(Backend):
    name = "cpu"
    kv_itemsize = 4
    prefill_seqs = 1  # one prompt per step: every row's numbers independent of the other requests
    kv_copy = True
    device_pick = True  # decode_pick: greedy rows picked inside the decode program (its last step)
    queues_ahead = False  # (nothing to overlap on the host: a step queued ahead would only delay each token)

    def __init__(self, config: EngineConfig | None = None, comm=None, plan_only: bool = False):
        """`plan_only`: `load` keeps the graph and the file's header for `plan_rows`, nothing more."""
        self.config = config or EngineConfig()
        self.plan_only = plan_only
        self.comm = comm  # parallel/comm.py: the collectives of a tensor-parallel graph
        self._world = comm.world if comm is not None else 1  # ranks share the host's memory
        self._memory = physical_memory() // self._world
        self.threads = self.config.threads or physical_cores()
        torch.set_num_threads(self.threads)  # torch's setting is per process
        kv_type("cpu", self.config.kv_dtype, KV_SUPPORTED)
        use_cache_dir(self.config.cache_path)  # where the VNNI kernels are built
        cpu_vnni.use_isa(self.config.cpu_isa)  # which build of them (avx512, avxvnni, avx2)
        self.vnni = self.config.cpu_vnni and cpu_vnni.available()
        # the quantized matmuls' path: the C kernels' build (avx512, avxvnni, avx2) or torch's int4 kernel
        self.cpu_isa = cpu_vnni.isa() if self.vnni else "torch"
        self.graph: Graph | None = None
        self.plan: Plan | None = None
        self.cache: KVCache | None = None
        self._reader: GGUFReader | None = None
        self._vectors: dict[str, torch.Tensor] = {}
        self._matrices: dict[tuple[WeightRef, WeightRef | None], Matrix] = {}
        self._tables: dict[str, EmbeddingTable] = {}
        self._experts: dict[str, Experts] = {}
        self._cache: WeightCache = WeightCache(None)  # the prepared weights on disk (load)
        self._ropes: dict[tuple, torch.Tensor] = {}  # rope setting -> (cos, sin) [n_ctx, n_rot/2]
        self.readers: dict[int, list[Node]] = {}  # node id -> the nodes reading its value
        self.last_use: dict[int, int] = {}  # node id -> the last node reading its value
        self._flat: tuple = ((), ())  # the cache's per-layer [-1, hd] views (allocate)
        self._c_attention = False  # decode attention by the C kernel (allocate: where it runs, for these shapes)
        self.native_reason: str | None = "not allocated"  # why decode steps are not one C call (None: they are)
        self._program: DecodeProgram | None = None  # the decode program (native.py), for up to its `rows` rows

    # ------------------------------------------------------------------ load
    def load(self, graph: Graph, reader: GGUFReader, progress: bool = True) -> None:
        """Prepare the weights the graph reads and compile the plan (a bar on a terminal if it takes > 0.5 s)."""
        self.graph, self._reader = graph, reader
        if self.plan_only:
            return
        self.check_memory(graph, reader)
        self.readers, self.last_use = {}, graph.consumers_last_use()
        for n in graph.nodes:
            for i in n.inputs:
                self.readers.setdefault(i, []).append(n)
        # Packing is byte shuffling bound by memory, and one thread does it about as fast as two on
        # a quiet machine; on a busy one every 2-thread region waits for a descheduled thread
        # (8B: 26 s with 1 thread, 159 s with 2, bench/NOTES.md). So weights are packed on one.
        torch.set_num_threads(1)
        self._cache = self._weight_cache(reader)
        try:
            self.plan = Plan(graph, self._compile, KINDS, progress=progress, comm=self.comm)
        except BaseException:
            self._cache.abandon()  # (the half-written cache file)
            raise
        finally:
            torch.set_num_threads(self.threads)
        self._cache.save()
        trim_heap()

    def _weight_cache(self, reader: GGUFReader) -> WeightCache:
        """The cache of this file's prepared weights (weight_cache.py) under the config's cache
        directory; none when turned off or for a tensor-parallel rank (its reader is a shard)."""
        if not self.config.weight_cache or self.comm is not None or not isinstance(reader, GGUFReader):
            return WeightCache(None)
        return WeightCache.for_file(reader.path, reader.data_offset, "vnni" if self.vnni else "int4",
                                    self.config.cache_path)

    def vector(self, name: str) -> torch.Tensor:
        if name not in self._vectors:
            self._vectors[name] = dense_f32(self._reader, self._reader.tensors[name]).contiguous()
        return self._vectors[name]

    def matrix(self, w: WeightRef, b: WeightRef | None) -> Matrix:
        key = (w, b)
        if key not in self._matrices:
            bias = torch.cat([self.vector(t.name) for t in b.tensors]) if b else None
            infos = [self._reader.tensors[t.name] for t in w.tensors]
            self._matrices[key] = m = Matrix(self._reader, infos, bias, vnni=self.vnni, cache=self._cache,
                                             prompt_passes=self.config.cpu_prompt_passes)
            if m.n * m.k >= TRIM_WEIGHTS:
                trim_heap()
        return self._matrices[key]

    def experts(self, name: str) -> Experts:
        """The prepared matrices of a 3-D expert tensor (ffn_{gate,up,down}_exps)."""
        if name not in self._experts:
            self._experts[name] = ex = Experts(self._reader, self._reader.tensors[name], vnni=self.vnni,
                                               cache=self._cache)
            if ex.e * ex.n * ex.k >= TRIM_WEIGHTS:
                trim_heap()
        return self._experts[name]

    def table(self, name: str) -> EmbeddingTable:
        if name not in self._tables:
            self._tables[name] = EmbeddingTable(self._reader, self._reader.tensors[name])
        return self._tables[name]

    def weight_bytes(self, graph: Graph, reader: GGUFReader) -> int:
        """Bytes the prepared matrices will take (the packed int4 forms, float copies of F16; every
        expert of an expert tensor)."""
        return sum(prepared_bytes(reader.tensors[t.name], vnni=self.vnni) for t in
                   {t for n in graph.nodes if n.op in (Op.MATMUL, Op.MOE_MATMUL) for t in n.weights["w"].tensors})

    def check_memory(self, graph: Graph, reader: GGUFReader) -> None:
        """Refuse, before anything is prepared, a model whose weights do not fit the memory available."""
        need, have = self.weight_bytes(graph, reader) + HEADROOM, available_memory() // self._world
        if need > have:
            raise InsufficientMemoryError(f"the cpu backend's weights of {reader.path.name}", need, have,
                                          "close other programs or use a smaller quantization")

    def _compile(self, node: Node) -> Step:
        compile_op = CPU_OPS.get(node.op)
        if compile_op is None:
            raise UnsupportedError(f"cpu backend: op {node.op} (node {node.name!r}) is not implemented")
        fns = compile_op(self, node)
        label = f"torch.{node.op.value}"
        if callable(fns):  # the same function for decode rows and prompt chunks
            return Step.same(fns, label, KINDS)
        fns, kernels = fns
        return Step(fns, kernels or dict.fromkeys(KINDS, label))

    def int4_inputs(self, node: Node) -> bool:
        """Whether every reader of the node's value is a matmul whose weights all run on torch's
        int4 kernels (which take bfloat16 activations; the VNNI kernel quantizes float32 ones)."""
        infos = self._reader.tensors
        readers = self.readers.get(node.id, [])
        return bool(readers) and node.id != self.graph.logits_id and all(
            r.op == Op.MATMUL and all(
                pick_kernel(i.ggml_type, *i.torch_shape, decode=True, vnni=self.vnni).kernel.name.startswith(
                    "cpu_int4pack")
                for i in (infos[t.name] for t in r.weights["w"].tensors))
            for r in readers)

    def owned_last_use(self, node: Node, i: int) -> bool:
        """Whether input i is a fresh float tensor of this step (an Add's sum, an embedding row)
        that nothing reads after this node: the node may overwrite it."""
        src = self.graph.nodes[i]
        return (self.last_use[i] == node.id and i != self.graph.output
                and (src.op in (Op.ADD, Op.SCALE) or (src.op == Op.GET_ROWS and "w" in src.weights)))

    def decode_weight_bytes(self) -> int:
        """Bytes of weights one decode row reads: every prepared matrix once (its packed form),
        k of the E experts of each expert tensor, and one row of each embedding table."""
        rows = sum(t.raw.shape[1] for t in self._tables.values())
        # an expert tensor: the k of its E experts a row runs
        experts = sum(self._experts[n.weights["w"].name].nbytes * n.shape[1] // n.params["n_expert"]
                      for n in self.graph.nodes if n.op == Op.MOE_MATMUL)
        return sum(m.nbytes for m in self._matrices.values()) + rows + experts

    # ------------------------------------------------------------------ memory
    def kv_budget(self) -> int:
        """An eighth of physical memory (split over ranks: of this rank's share) for a cache whose
        size the engine chooses."""
        return self._memory // 8

    def copy_kv(self, src: int, dst: int, n: int) -> None:
        if self.cache is None:
            raise ModelError("cpu backend: allocate() the KV cache before copying in it")
        self.cache.copy(src, dst, n)

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
        self._c_attention = self.vnni and all(
            cpu_vnni.attention_fits(n.params["n_head"], n.params["n_head_kv"], n.params["head_dim"])
            for n in self.graph.nodes if n.op == Op.ATTENTION)
        self._ropes = rope_tables(self.graph, n_ctx, lambda w: self.vector(w.name))
        self._program = None  # (its steps hold the old cache's addresses)
        self.native_reason = ("off (MINFER_CPU_NATIVE=0)" if not self.config.cpu_native
                              else program_reason(self) if self._c_attention else "attention off the C kernel")

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
            if recorder is None and self._on_program(batch):
                return self.decode_program(batch.n_tokens).run(batch)
            if len(parts) == 1:
                return self.plan.run(_State(batch, cache, batch.kind == "decode", c_attn), recorder)
            out = torch.empty(len(batch.out_rows), self.graph.meta["n_vocab"])
            for part, idx in parts:
                logits = self.plan.run(_State(part, cache, part.kind == "decode", c_attn), recorder)
                out[idx] = logits
            return out

    def decode_pick(self, batch: Batch, after=None, params: torch.Tensor | None = None) -> HostPicked:
        """Backend.decode_pick: greedy rows (no `params`) through the decode program with its pick, so the
        logits are read by the team that wrote them and never copied out (0.1-0.2 ms a token of a 152k
        vocabulary); anything else the default's way (forward, then the host's pick)."""
        if params is None and after is None and self.cache is not None and self._on_program(batch) \
                and batch.out_rows.tolist() == list(range(batch.n_tokens)):
            batch.check(self.cache.n_slots, self.cache.n_ctx)
            with torch.inference_mode():
                return HostPicked(self.decode_program(batch.n_tokens).pick(batch))
        return super().decode_pick(batch, after, params)

    def _on_program(self, batch: Batch) -> bool:
        """Whether `batch` runs as one decode program call: decode rows only (one part), a program for this graph."""
        return batch.kind == "decode" and self.native_reason is None

    def decode_program(self, rows: int) -> DecodeProgram:
        """The decode program that runs `rows` rows: one program runs any row count up to its own, so it is
        made again only for more rows than it has (a power of two: a few times; a slot's draft rows make
        a step of more rows than slots)."""
        prog = self._program
        if prog is None or prog.rows < rows:
            self._program = prog = None  # (the old one's buffers freed first)
            self._program = prog = DecodeProgram(self, 1 << (rows - 1).bit_length())
        return prog

    def greedy_tokens(self, logits: torch.Tensor) -> list[int]:
        """Backend.greedy_tokens in C (kernels/cpu/vnni.py argmax_rows: torch's over a 152k vocabulary took a
        few % of a small model's decode token) where the rows are float32 on the host; else torch's."""
        if self.vnni and logits.dim() == 2 and logits.dtype == torch.float32 and logits.device.type == "cpu" \
                and (logits.stride(1) == 1 or logits.shape[1] == 1) and logits.shape[1] > 0:
            return cpu_vnni.argmax_rows(logits).tolist()
        return super().greedy_tokens(logits)

    def hidden(self, batch: Batch) -> torch.Tensor:
        """Final hidden states [R, n_embd] float32 of the batch's out_rows (a prompt chunk: embeddings)."""
        if self.cache is None:
            raise ModelError("cpu backend: allocate() the KV cache before running a step")
        batch.check(self.cache.n_slots, self.cache.n_ctx)
        if len(batch.split()) != 1:
            raise ModelError("cpu backend: hidden states of a step mixing decode rows and prompts")
        with torch.inference_mode():
            return self.plan.run(_State(batch, self.cache, batch.kind == "decode", self._c_attention),
                                 until=self.graph.hidden_id).float()

    def trace_graph(self) -> list[dict]:
        """The graph's nodes for TraceRecorder.set_graph, each with its decode-step kernel."""
        return self.plan.trace_nodes("decode")

    def plan_rows(self, rows: int = 1, prefill: bool = False) -> list[dict]:
        return plan_rows(self.graph, self._reader, rows, prefill, self.vnni, self.config.cpu_prompt_passes)
