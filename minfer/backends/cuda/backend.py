"""The cuda backend: a runtime for the contracts' kernels on an NVIDIA GPU.

What runs where is not decided here: graph/fuse.py's rules fuse what this backend's contracts
accept, and the shared compiler (compile.py, bindings.py) picks every node's kernel for each way
the backend runs it (`KINDS`: a decode row, decode batches of 2 and of 3-4 rows, of up to 64, a prompt
chunk).
This file is the runtime: the weights' GGUF bytes on the device (the compiler lays them out as
each kernel's contract says), the KV cache (f16 or Q8_0, one extra slot that padded graph rows
write into), the RoPE tables, and the launches: decode steps replay a CUDA graph captured once
per batch bucket, prompt chunks one per row bucket (graphs.py); what fits neither (more rows
or spans, every row's logits, tracing) runs the plan eagerly. A step that mixes decode rows with
a prompt chunk runs the two parts separately.

`decode_pick` launches a decode step whose tokens are picked on the device (the Argmax
contract, or the Sample contract for rows that sample) and returns at once; given the step
before it, it reads that step's picked tokens on the device, so the engine can queue step N+1
before it has read step N's tokens. Rows under a grammar pick the same way (`masked`): the
forward is launched first and the pick waits for the bitmasks the engine uploads once it has
read step N's tokens and advanced the grammars (the forward of N+1 runs meanwhile).

Under the Triton interpreter (TRITON_INTERPRET=1, CI) the same backend runs on CPU tensors,
without graphs: every GPU code path of it is exercised at small sizes without a GPU.
"""

from __future__ import annotations

import torch

from ...config import EngineConfig
from ...contracts.registry import Registry, default_registry
from ...errors import MinferError, ModelError
from ...gguf.reader import GGUFReader
from ...graph.fuse import fuse
from ...graph.ir import Graph, Op, WeightRef
from ...kernels.sample import KMAX, PARAM_ROWS, apply_bitmask, pack_params
from ...kernels.triton._common import configure_pdl, interpreting
from ...kernels.triton.attention import prefill_tiles, q8_row_bytes
from ...kernels.triton.gemv_fused import add_norm_sums
from ...quant.types import GGMLType
from ..base import Backend, Batch, read_vector
from ..compile import PLAN_CTX, Call, Compiler, fusion_support
from ..kv_cache import KVCache, kv_bytes, kv_type
from ..plan import Plan
from ..rope import rope_tables
from .graphs import BUCKETS, DECODE_KINDS, PREFILL_BUCKETS, CudaPicked, DecodeGraph, PrefillGraph, State, decode_kind

# ways of running -> the row count kernels are picked for (decode_kind: which a decode step takes)
KINDS = {**dict(DECODE_KINDS), "batch": 16, "chunk": 512}
KV_SUPPORTED = ("f16", "q8_0")


class CUDABackend(Backend):
    name = "cuda"
    prefill_seqs = 8  # prompts per step when many arrive at once (rows' numbers then depend on the batch)
    device_pick = True
    masked_pick = True
    kv_copy = True
    contract_backend = "CUDA"
    kinds = KINDS
    column_outputs = False  # [m, n] column slices are contiguous only for one row
    max_weight_bytes = None  # a weight binds whole, whatever its size

    def __init__(self, config: EngineConfig | None = None, registry: Registry | None = None, plan_only: bool = False,
                 comm=None):
        """`plan_only`: only pick kernels (`minfer plan`), on a machine with no GPU. `comm`
        (parallel/comm.py): this rank's communicator (its all-reduces run inside the graphs)."""
        self.config = config or EngineConfig(device="cuda")
        self.comm = comm
        self.kv_type = kv_type("cuda", self.config.kv_dtype, KV_SUPPORTED)
        self.kv_dtype, self.kv_itemsize = self.kv_type.contract, self.kv_type.itemsize
        self.interpreted = interpreting()
        if not self.interpreted and not plan_only and not torch.cuda.is_available():
            raise MinferError("cuda backend: no CUDA GPU is visible to torch")
        self.on_gpu = not self.interpreted and torch.cuda.is_available()
        self.device = torch.device("cuda" if self.on_gpu else "cpu")
        configure_pdl(self.config.pdl and self.on_gpu)
        self.registry = registry or default_registry(self.config.judge_report)
        self.settings = {"act_q8": self.config.gemv_q8}  # what the load layouts and caps.q8_passes read
        self.upload = not plan_only
        self.graph: Graph | None = None
        self.plan: Plan | None = None
        self.compiler: Compiler | None = None
        self.cache: KVCache | None = None
        self._reader: GGUFReader | None = None
        self._bytes: dict[str, torch.Tensor] = {}  # tensor name -> its GGUF bytes on the device
        self._vectors: dict[WeightRef, torch.Tensor] = {}
        self._ropes: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self.graphs: dict[tuple, object] = {}  # (decode bucket, sampling) / ("prefill", bucket) -> its graph
        self.pool = None
        self.use_graphs = self.config.cuda_graph and self.on_gpu
        self.n_slots = self.pad_slot = 0

    # ------------------------------------------------------------------ load
    def load(self, graph: Graph, reader: GGUFReader, progress: bool = True) -> None:
        """Fuse what the contracts accept, pick every node's kernels and put the weights on the
        device in their kernels' layouts (plan_only: pick only, what `minfer plan` shows)."""
        self._reader = reader
        type_of = self._type_of
        if self.config.fuse:
            graph = fuse(graph, fusion_support(self, self.registry, type_of, self.settings, self.config.mmq))
        self.graph = graph
        self.compiler = Compiler(graph, self, self.registry, type_of, self.settings, self.config.mmq)
        sync = torch.cuda.synchronize if self.on_gpu else None
        with torch.inference_mode():
            self.plan = Plan(graph, self.compiler.compile, KINDS, progress=progress, sync=sync, comm=self.comm)
        n_vocab, last = graph.meta["n_vocab"], graph.nodes[graph.output]
        self.argmax = self.compiler.choose(last, Call("Argmax", {"x": "F32"}, lambda r: {"x": (r, n_vocab)}, {}),
                                           1).kernel
        self.sample = self.compiler.choose(last, Call("Sample", {"x": "F32", "params": "I32"},
                                                      lambda r: {"x": (r, n_vocab), "params": (PARAM_ROWS, r)}, {}),
                                           1).kernel
        if self.on_gpu:
            torch.cuda.synchronize()

    def _type_of(self, name: str):
        return self._reader.tensors[name].ggml_type

    # ------------------------------------------------------------------ the compiler's runtime
    def kv_shape(self, n_layer: int, n_head_kv: int, head_dim: int) -> tuple[int, ...]:
        row = q8_row_bytes(head_dim) if self.kv_type.name == "q8_0" else head_dim
        return (n_layer, 2, n_head_kv, PLAN_CTX, row)

    def kv(self, layer: int):
        return self.cache.k, self.cache.v, layer

    def _raw(self, name: str) -> torch.Tensor:
        """The tensor's GGUF bytes on the device, uint8 [rows, row_bytes] (uploaded once)."""
        if name not in self._bytes:
            info = self._reader.tensors[name]
            host = torch.from_numpy(self._reader.tensor_bytes(name))
            rows = info.torch_shape[0] if len(info.shape) > 1 else 1
            self._bytes[name] = host.view(rows, -1).to(self.device)
        return self._bytes[name]

    def table(self, name: str) -> torch.Tensor:
        return self._raw(name)

    def weight_bytes(self, w: WeightRef) -> torch.Tensor:
        parts = [self._raw(t.name) for t in w.tensors]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def dense_f16(self, w: WeightRef) -> torch.Tensor:
        from ...kernels.triton.torch_ops import f16_weight

        k = w.shape[0]
        return torch.cat([f16_weight(self._raw(t.name), t.shape[1], k, self._type_of(t.name)) for t in w.tensors])

    def vector(self, w: WeightRef) -> torch.Tensor:
        if w not in self._vectors:
            self._vectors[w] = read_vector(self._reader, w).to(self.device)
        return self._vectors[w]

    def empty(self, shape) -> torch.Tensor:
        return torch.empty(shape, dtype=torch.float32, device=self.device)

    def zeros(self, n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.float32, device=self.device)

    @staticmethod
    def cols(t: torch.Tensor, a: int, b: int) -> torch.Tensor:
        return t[..., a:b]

    def rope(self, key: tuple):
        return self._ropes[key]

    def q8_records(self, rows: int, k: int, passes: int):
        """x's int8 records as quantize_act_q8 writes them: (codes, scales)."""
        return (torch.empty(rows, k // 32, 8 * passes, dtype=torch.int32, device=self.device),
                torch.empty(rows, k // 32, 4, dtype=torch.float32, device=self.device))

    def norm_sums(self, n: int, k: int, qtype: GGMLType):
        """A deferred RMSNorm's buffer: one f32 per row tile gemv_add_norm's [n, k] GEMV of qtype writes."""
        return torch.empty(add_norm_sums(n, k, qtype), dtype=torch.float32, device=self.device)

    # ------------------------------------------------------------------ memory
    def kv_budget(self) -> int:
        """Half the GPU's free memory (after the weights) for a cache whose size the engine chooses."""
        if not self.on_gpu:
            return 1 << 30
        free, _ = torch.cuda.mem_get_info()
        return free // 2

    def copy_kv(self, src: int, dst: int, n: int) -> None:
        if self.cache is None:
            raise ModelError("cuda backend: allocate() the KV cache before copying in it")
        self.cache.copy(src, dst, n)

    def allocate(self, n_slots: int, n_ctx: int) -> None:
        """The KV cache (n_slots + 1 slots: the last takes the padded rows of graph buckets) and the
        RoPE tables for n_ctx positions, on the device."""
        if self.graph is None:
            raise ModelError("cuda backend: load() a graph before allocating its cache")
        m = self.graph.meta
        need = kv_bytes(m["n_layer"], n_slots + 1, n_ctx, m["n_head_kv"], m["head_dim"], self.kv_itemsize)
        if self.on_gpu:
            free, total = torch.cuda.mem_get_info()
            if need > free * 0.9:
                raise MinferError(f"a KV cache of {n_slots} x {n_ctx} tokens needs {need / 2**30:.1f} GiB; the GPU has "
                                  f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f}; use a smaller context or fewer "
                                  "slots")
        self.graphs.clear()
        self.cache = None
        q8 = self.kv_type.name == "q8_0"
        self.cache = KVCache(m["n_layer"], n_slots + 1, n_ctx, m["n_head_kv"], m["head_dim"], self.kv_type.dtype,
                             self.device, row_width=q8_row_bytes(m["head_dim"]) if q8 else None)
        self.n_slots, self.pad_slot = n_slots, n_slots
        tables = rope_tables(self.graph, n_ctx, lambda w: self.vector(w).cpu())
        self._ropes = {key: (cos.to(self.device), sin.to(self.device)) for key, (cos, sin) in tables.items()}

    # ------------------------------------------------------------------ run
    def _check(self, batch: Batch) -> None:
        if self.cache is None:
            raise ModelError("cuda backend: allocate() the KV cache before running a step")
        batch.check(self.n_slots, self.cache.n_ctx)

    def _inputs(self, batch: Batch) -> dict[str, torch.Tensor]:
        return {"tokens": batch.tokens.to(self.device, non_blocking=True),
                "positions": batch.positions.to(self.device, non_blocking=True),
                "row_slots": batch.row_slots.to(self.device, non_blocking=True),
                "out_rows": batch.out_rows.to(self.device, non_blocking=True)}

    def _state(self, batch: Batch, inputs: dict) -> State:
        spans = [(s.offset, s.slot, s.start, s.n_tokens) for s in batch.spans]
        decode = batch.kind == "decode"
        tiles = None
        if not decode:  # the attention tile table, built once for every layer
            tiles = torch.tensor(prefill_tiles(spans), dtype=torch.int32).to(self.device, non_blocking=True)
        return State(inputs, decode, batch.n_tokens, spans, tiles)

    def forward(self, batch: Batch, recorder=None) -> torch.Tensor:
        """float32 logits [R, n_vocab] (on the device) of the batch's out_rows."""
        self._check(batch)
        with torch.inference_mode():
            parts = batch.split()
            if len(parts) == 1:
                return self._run(batch, recorder)
            out = torch.empty(len(batch.out_rows), self.graph.meta["n_vocab"], device=self.device)
            for part, idx in parts:
                logits = self._run(part, recorder)  # (a prompt chunk that is not its prompt's last has no rows)
                if idx:
                    out[torch.tensor(idx, dtype=torch.long, device=self.device)] = logits
            return out

    def hidden(self, batch: Batch) -> torch.Tensor:
        """Final hidden states [R, n_embd] float32 (on the device) of the batch's out_rows, run
        eagerly (embeddings: a prompt chunk)."""
        self._check(batch)
        if len(batch.split()) != 1:
            raise MinferError("cuda backend: hidden states of a step mixing decode rows and prompts")
        with torch.inference_mode():
            return self.plan.run(self._state(batch, self._inputs(batch)), until=self.graph.hidden_id).float()

    def _run(self, batch: Batch, recorder) -> torch.Tensor:
        decode, rows = batch.kind == "decode", batch.n_tokens
        if decode and self.use_graphs and recorder is None and rows <= BUCKETS[-1]:
            g = self._decode_graph(rows)
            g.launch(batch, self.pad_slot)
            return g.out[:rows]
        if not decode and self.use_graphs and recorder is None and PrefillGraph.fits(batch):
            return self._prefill_graph(rows).launch(batch, self.pad_slot)
        return self.plan.run(self._state(batch, self._inputs(batch)), recorder)

    def _prefill_graph(self, rows: int) -> PrefillGraph:
        bucket = next(x for x in PREFILL_BUCKETS if x >= rows)
        if ("prefill", bucket) not in self.graphs:
            self.graphs["prefill", bucket] = PrefillGraph(self, bucket)
        return self.graphs["prefill", bucket]

    def _decode_graph(self, rows: int, sampling: bool = False, masked: bool = False) -> DecodeGraph:
        bucket = next(x for x in BUCKETS if x >= rows)
        if (bucket, sampling, masked) not in self.graphs:
            self.graphs[bucket, sampling, masked] = DecodeGraph(self, bucket, sampling, masked)
        return self.graphs[bucket, sampling, masked]

    def pick(self, logits: torch.Tensor, params: torch.Tensor | None) -> torch.Tensor:
        """The rows' tokens picked on the device: argmax, or the Sample contract under `params`."""
        return self.argmax(x=logits) if params is None else self.sample(x=logits, params=params)

    def decode_pick(self, batch: Batch, after: CudaPicked | None = None,
                    params: torch.Tensor | None = None, masked: bool = False) -> CudaPicked:
        """Launch a decode step of `batch` (one token per sequence, out_rows 0..B-1 in order) whose
        next tokens are picked on the device: the argmax of each row's logits, or with `params`
        (int32 [7, B], kernels.sample.pack_params; rows with top_k in 1..KMAX) each row's draw
        under its sampling parameters; return without waiting. `after`: the launched step before
        it, of the same sequences in the same rows: this step's input tokens are that step's
        picked tokens, read on the device (batch.tokens is ignored). `masked`: launch the forward
        only; the returned step's `pick(bits)` queues the pick from the logits masked by the rows'
        grammar bitmasks (the engine computes them while the forward runs)."""
        self._check(batch)
        b = batch.n_tokens
        if batch.kind != "decode" or not torch.equal(batch.out_rows, torch.arange(b, dtype=torch.int32,
                                                                                   device=batch.out_rows.device)):
            raise MinferError("decode_pick: the batch must be decode rows only, returning rows 0..B-1 in order")
        if after is not None and after.rows != b:
            raise MinferError(f"decode_pick: the step before had {after.rows} rows, this one {b}")
        if after is not None and after.pending:
            raise MinferError("decode_pick: the step before was launched masked and not picked yet")
        if params is not None and (params.dtype != torch.int32 or tuple(params.shape) != (PARAM_ROWS, b)
                                   or not bool(((params[0] >= 1) & (params[0] <= KMAX)).all())):
            raise MinferError(f"decode_pick: params must be int32 [{PARAM_ROWS}, {b}] with top_k in 1..{KMAX}")
        with torch.inference_mode():
            if self.use_graphs and b <= BUCKETS[-1]:
                g = self._decode_graph(b, params is not None, masked)
                return g.pick_to_host(g.launch(batch, self.pad_slot, after, params), b)
            inputs = self._inputs(batch)
            if after is not None:
                inputs["tokens"] = after.picked[:b]
            logits = self.plan.run(self._state(batch, inputs))
            dev_params = None if params is None else params.to(self.device)
            if not masked:
                return CudaPicked(b, self.pick(logits, dev_params))

            def finish(bits: torch.Tensor) -> None:
                with torch.inference_mode():
                    out.picked = self.pick(apply_bitmask(logits, bits.to(self.device)), dev_params)

            out = CudaPicked(b, None, finish=finish)  # (`finish` fills it in)
            return out

    def warmup(self) -> None:
        """Compile and capture now what the first requests would otherwise wait for: the decode
        graph of every bucket the slots can fill (greedy and sampling), the prompt-chunk graph of
        every row bucket a step can fill (n_slots + prefill_chunk rows, or max_batch_tokens), and
        the Triton variants of eager prompt chunks (row counts specialize kernels: 1, a multiple
        of 16, any other). Writes only into the free cache (slot contents are the scheduler's:
        nothing is cached yet) and the spare slot."""
        if self.cache is None:
            raise ModelError("cuda backend: allocate() the KV cache before warming up")
        with torch.inference_mode():
            for rows in (1, 16, 17):
                if rows <= self.cache.n_ctx:
                    self.forward(Batch.single([0] * rows, 0, slot=0))
            if self.use_graphs:
                most = self.config.max_batch_tokens or self.n_slots + self.config.prefill_chunk
                for bucket in PREFILL_BUCKETS:
                    self._prefill_graph(bucket)
                    if bucket >= most:
                        break
            for bucket in BUCKETS:
                b = min(bucket, self.n_slots)
                batch = Batch.build([(s, 0, [0]) for s in range(b)], list(range(b)), n_decode=b)
                self.decode_pick(batch).tokens()
                params = pack_params([(40, 0.8, 0.95, 0.05, 1, 0)] * b)
                self.decode_pick(batch, params=params).tokens()
                if b < bucket:
                    break
        if self.on_gpu:
            torch.cuda.synchronize()

    # ------------------------------------------------------------------ what runs
    def trace_graph(self) -> list[dict]:
        nodes = self.plan.trace_nodes("row")
        for n in nodes:
            picks = self.compiler.contracts(n["id"])
            if picks:
                n["contract"] = picks
        return nodes

    def plan_rows(self, rows: int = 1, prefill: bool = False) -> list[dict]:
        """Per node with a kernel: what it runs for a step of `rows` rows (a decode batch, or a
        prompt chunk when `prefill`) and the cost the picker predicts for it, in ns."""
        kind = "chunk" if prefill else decode_kind(rows)
        return self.compiler.plan_rows(kind, rows)

    def matmul_args(self, name: str, kind: str = "row"):
        """The kernel the matmul named `name` runs for `kind` and its arguments but x, the weight in
        the kernel's layout: `kernel(x=x, **args)` is its launch (benchmarks time one projection
        alone). A fused node's matmul (the q+k+v of a QMatMulRoPE) is its plain matmul. A fused
        weight whose parts differ in type runs one kernel per part: time those alone."""
        c, way = self.compiler, next(w for w in self.compiler.ways() if w.kind == kind)
        for node in self.graph.nodes:
            if node.op == Op.MATMUL and node.name == name:
                bound = c.bound[node.id][kind]
                break
            part = next((p for p in node.parts if p.op == Op.MATMUL and p.name == name), None)
            if part is not None:
                bound, node = c.bind_part(node, part, way), part
                break
        else:
            raise MinferError(f"matmul_args: no matmul node {name!r}")
        if len(bound.launches) != 1 + ("b" in node.weights):
            raise MinferError(f"matmul_args: {name!r} runs {len(bound.launches)} kernels for {kind}; time its parts")
        launch = bound.launches[0]
        return launch.kernel, {"w": c.laid_out(launch.kernel, node.weights["w"], launch.call.params),
                               **launch.call.params}
