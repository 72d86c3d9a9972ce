"""The vulkan backend: a runtime for the contracts' WGSL kernels on any GPU wgpu reaches (Vulkan,
Metal; lavapipe without a GPU).

Device `vulkan` takes a Vulkan adapter, `gpu` whatever adapter wgpu finds (Metal on macOS);
`EngineConfig.wgpu_adapter` picks one by name (`minfer devices` lists them). As on cuda, what runs
is decided elsewhere: graph/fuse.py fuses what this backend's contracts accept, the shared
compiler (compile.py, bindings.py) picks every node's kernel for a decode row (m = 1: the GEMVs)
and a prompt chunk (m > 1: the tiled matmuls). This file is the runtime: weights uploaded once as
their GGUF bytes (a fused weight's parts stacked into one buffer; a kernel's load layout, such as
the planes the int8 GEMVs read, is made from them on the device), a per-layer f32 KV cache in
device buffers, the RoPE tables, and the steps: every node's dispatches recorded into one compute
pass (kernels/wgpu/device.py) and only the logits rows asked for (or, in `decode_pick`, the argmax
tokens) read back. A decode step of B rows is captured once (the dispatches recorded with their
buffers and params) and replayed every step after: the host writes positions and slots, the
tokens come from the step before on the device, and no Python runs per kernel
(MINFER_NO_CUDA_GRAPH=1 records every step again). Sampled rows are drawn on the host from their
logits by the same sampling chain as the host sampler (kernels/sample.py: torch only, no Triton).
Every row is computed independently of the others, so a sequence's numbers do not depend on the
batch.
"""

from __future__ import annotations

import torch

from ...config import EngineConfig
from ...contracts.registry import Registry, default_registry
from ...errors import MinferError, ModelError, UnsupportedError
from ...gguf.reader import GGUFReader
from ...graph.fuse import fuse
from ...graph.ir import Graph, WeightRef
from ...kernels.cbuild import use_cache_dir
from ...kernels.sample import KMAX, PARAM_ROWS, sample_rows
from ...kernels.wgpu.device import Device, VkTensor
from ...kernels.wgsl import attention as vk_attention
from ...kernels.wgsl import matmul as vk_matmul
from ...kernels.wgsl import quantize as vk_quantize
from ..base import Backend, Batch, read_vector
from ..compile import PLAN_CTX, Call, Compiler, fusion_support
from ..kv_cache import kv_bytes, kv_type
from ..plan import Plan
from ..rope import rope_tables
from .replay import MAX_REPLAY_ROWS, Replay, State, VkPicked

KINDS = {"row": 1, "chunk": 64}  # ways of running -> the row count kernels are picked for
KV_SUPPORTED = ("f32",)


class WGPUBackend(Backend):
    prefill_seqs = 4  # prompts per step: a row's numbers do not depend on the rest of the batch
    device_pick = True
    kv_copy = True
    contract_backend = "Vulkan"
    kinds = KINDS
    column_outputs = True  # the matmuls write into column views of a wider output
    upload = True

    def __init__(self, config: EngineConfig | None = None, registry: Registry | None = None, comm=None):
        self.config = config or EngineConfig(device="vulkan")
        if comm is not None:
            raise UnsupportedError("vulkan backend: tensor parallelism is not supported (use cuda)")
        kv = kv_type("vulkan", self.config.kv_dtype, KV_SUPPORTED)
        self.kv_dtype, self.kv_itemsize = kv.contract, kv.itemsize
        self.name = self.config.device
        use_cache_dir(self.config.cache_path)  # where the replay encoder (C) is built
        self.registry = registry or default_registry(self.config.judge_report)
        c = self.config
        self.dev = Device("gpu" if c.device == "gpu" else "vulkan", subgroups=c.wgpu_subgroups, adapter=c.wgpu_adapter,
                          checks=c.wgpu_checks, gemv=vk_matmul.gemv_variant(c.vk_gemv, c.vk_q8),
                          attn=vk_attention.attn_variant(c.vk_attn))
        self.settings = {"variant": self.dev.gemv}  # what the load layouts and caps.q8_passes read
        self.max_weight_bytes = self.dev.max_binding  # larger weights run in chunks of rows (calls.type_runs)
        self.graph: Graph | None = None
        self.plan: Plan | None = None
        self.compiler: Compiler | None = None
        self.cache: tuple[list[VkTensor], list[VkTensor]] | None = None
        self._reader: GGUFReader | None = None
        self._bytes: dict[str, VkTensor] = {}  # weight name -> its GGUF bytes on the device
        self._vectors: dict[WeightRef, VkTensor] = {}
        self._ropes: dict[tuple, tuple[VkTensor, VkTensor]] = {}
        self.n_slots = self.n_ctx = 0
        self.use_replay = self.config.cuda_graph  # MINFER_NO_CUDA_GRAPH=1: decode steps recorded every time
        self.replays: dict[int, Replay] = {}  # decode rows -> the captured step

    def close(self) -> None:
        """Release the device (Engine.close): its buffers and pipelines at once rather than when the
        garbage collector finds them, and its wgpu device back to the spares (kernels/wgpu/device.py)
        for the next backend. A process that loads model after model (a server's restarts, the load
        fuzzer) would otherwise run the driver out of memory (lavapipe: "Not enough memory left" after
        ~130 loads). Idempotent."""
        dev = self.__dict__.pop("dev", None)
        if dev is None:
            return
        self.plan, self.compiler, self.cache, self.replays = None, None, None, {}
        self._bytes, self._vectors, self._ropes = {}, {}, {}
        dev.close()

    # ------------------------------------------------------------------ load
    def load(self, graph: Graph, reader: GGUFReader, progress: bool = True) -> None:
        """Fuse what the contracts accept, pick every node's kernels, upload the weights (once)."""
        self._reader = reader
        type_of = self._type_of
        if self.config.fuse:
            graph = fuse(graph, fusion_support(self, self.registry, type_of, self.settings))
        self.graph = graph
        self.compiler = Compiler(graph, self, self.registry, type_of, self.settings)
        self.plan = Plan(graph, self.compiler.compile, KINDS, progress=progress, sync=self.dev.sync)
        n_vocab = graph.meta["n_vocab"]
        self.argmax = self.compiler.choose(graph.nodes[graph.output], Call("Argmax", {"x": "F32"},
                                                                           lambda r: {"x": (r, n_vocab)}, {}), 1).kernel
        self._release_raw()
        self.dev.flush()

    def _type_of(self, name: str):
        return self._reader.tensors[name].ggml_type

    def _release_raw(self) -> None:
        """Drop the GGUF bytes no step reads (a weight every kernel took in another layout)."""
        used = {id(v) for v in self.compiler.laid_values()}
        for name in [n for n, t in self._bytes.items() if id(t) not in used and not n.startswith("table:")]:
            del self._bytes[name]

    # ------------------------------------------------------------------ the compiler's runtime
    def kv_shape(self, n_layer: int, n_head_kv: int, head_dim: int) -> tuple[int, ...]:
        return (1, 2, n_head_kv, PLAN_CTX, head_dim)

    def kv(self, layer: int):
        ks, vs = self.cache  # the layer's own buffers: layer 0 of a one-layer [1, slots, ...] tensor
        return ks[layer], vs[layer], 0

    def _host_bytes(self, name: str) -> torch.Tensor:
        info = self._reader.tensors[name]
        rows = info.torch_shape[0] if len(info.shape) > 1 else 1
        return torch.from_numpy(self._reader.tensor_bytes(name)).view(rows, -1)

    def weight_bytes(self, w: WeightRef) -> VkTensor:
        """W's GGUF bytes on the device [n, row_bytes], a fused weight's parts stacked, a chunk's rows
        (WeightRef.rows) alone (uploaded once)."""
        if w.name not in self._bytes:
            parts = [self._host_bytes(t.name) for t in w.tensors]
            if w.rows is not None:
                parts = [parts[0][w.rows[0]:w.rows[1]]]
            self._bytes[w.name] = self.dev.upload(parts[0] if len(parts) == 1 else torch.cat(parts))
        return self._bytes[w.name]

    def table(self, name: str) -> VkTensor:
        key = "table:" + name
        if key not in self._bytes:
            self._bytes[key] = self._bytes.get(name) or self.dev.upload(self._host_bytes(name))
        return self._bytes[key]

    def dense_f16(self, w: WeightRef):
        raise UnsupportedError("vulkan backend: a fused weight whose parts differ in type runs one matmul per type")

    def vector(self, w: WeightRef) -> VkTensor:
        if w not in self._vectors:
            self._vectors[w] = self.dev.upload(read_vector(self._reader, w))
        return self._vectors[w]

    def empty(self, shape) -> VkTensor:
        return self.dev.empty(tuple(shape))

    def zeros(self, n: int) -> VkTensor:
        return self.dev.upload(torch.zeros(n))

    @staticmethod
    def cols(t: VkTensor, a: int, b: int) -> VkTensor:
        return t.cols(a, b)

    def rope(self, key: tuple):
        return self._ropes[key]

    def q8_records(self, rows: int, k: int, passes: int) -> VkTensor:
        return vk_quantize.q8_records(self.dev, rows, k, passes)

    def norm_sums(self, n: int, k: int, qtype):
        raise UnsupportedError("vulkan backend: no deferred RMSNorm (QMatMulAddNorm) kernel")

    # ------------------------------------------------------------------ memory
    def kv_budget(self) -> int:
        """What the engine may give the cache when it chooses the slot count: 1 GiB (wgpu does not
        report an adapter's free memory)."""
        return 1 << 30

    def allocate(self, n_slots: int, n_ctx: int) -> None:
        """The KV cache (per layer, f32) and the RoPE tables for n_ctx positions, on the device."""
        if self.graph is None:
            raise ModelError("vulkan backend: load() a graph before allocating its cache")
        m = self.graph.meta
        per_layer = kv_bytes(1, n_slots, n_ctx, m["n_head_kv"], m["head_dim"], 4) // 2
        if per_layer > self.dev.max_binding:
            raise MinferError(f"a KV cache of {n_slots} x {n_ctx} tokens needs {per_layer / 2**20:.0f} MiB per layer "
                              f"for keys, more than the adapter binds at once ({self.dev.max_binding / 2**20:.0f} "
                              "MiB); use a smaller context or fewer slots")
        self.cache = None
        self.replays.clear()
        shape = (1, n_slots, m["n_head_kv"], n_ctx, m["head_dim"])
        self.cache = ([self.dev.empty(shape) for _ in range(m["n_layer"])],
                      [self.dev.empty(shape) for _ in range(m["n_layer"])])
        self.n_slots, self.n_ctx = n_slots, n_ctx
        tables = rope_tables(self.graph, n_ctx, lambda w: self.vector(w).cpu())
        self._ropes = {key: (self.dev.upload(cos), self.dev.upload(sin)) for key, (cos, sin) in tables.items()}

    def copy_kv(self, src: int, dst: int, n: int) -> None:
        """Positions 0..n of slot `src` into slot `dst`: one device copy per layer, keys and values,
        and kv head (a head's positions are contiguous in a slot), in one command encoder."""
        if self.cache is None:
            raise ModelError("vulkan backend: allocate() the KV cache before copying in it")
        if not (0 <= src < self.n_slots and 0 <= dst < self.n_slots and 0 < n <= self.n_ctx):
            raise MinferError(f"KV copy of {n} positions from slot {src} to slot {dst}: expected slots in "
                              f"0..{self.n_slots - 1} and 1..{self.n_ctx} positions")
        _, _, heads, ctx, hd = self.cache[0][0].shape
        spans = [(t, ((src * heads + h) * ctx) * hd, t, ((dst * heads + h) * ctx) * hd, n * hd)
                 for layers in self.cache for t in layers for h in range(heads)]
        self.dev.copy_spans(spans)

    # ------------------------------------------------------------------ run
    def _inputs(self, batch: Batch, tokens: VkTensor | None = None) -> dict[str, VkTensor]:
        up = {name: self.dev.upload(getattr(batch, name).to(torch.int32)) for name in ("positions", "row_slots",
                                                                                      "out_rows")}
        up["tokens"] = tokens if tokens is not None else self.dev.upload(batch.tokens.to(torch.int32))
        return up

    def _check(self, batch: Batch) -> None:
        if self.cache is None:
            raise ModelError("vulkan backend: allocate() the KV cache before running a step")
        batch.check(self.n_slots, self.n_ctx)

    def _logits(self, batch: Batch, tokens: VkTensor | None = None, recorder=None) -> VkTensor:
        self._check(batch)
        return self.plan.run(State(self._inputs(batch, tokens), batch.n_tokens), recorder)

    def _replay(self, batch: Batch, recorder=None) -> Replay | None:
        """The captured step for this batch, when it is a decode step returning rows 0..B-1 in order
        (what the engine's decode steps are) and nothing traces it; None: run the plan eagerly."""
        b = batch.n_tokens
        if not self.use_replay or recorder is not None or batch.kind != "decode" or b > MAX_REPLAY_ROWS:
            return None
        if batch.out_rows.tolist() != list(range(b)):
            return None
        self._check(batch)
        if b not in self.replays:
            self.replays[b] = Replay(self, b)
        return self.replays[b]

    def forward(self, batch: Batch, recorder=None) -> torch.Tensor:
        """float32 logits [R, n_vocab] (on the host) of the batch's out_rows."""
        rep = self._replay(batch, recorder)
        if rep is not None:
            rep.launch(batch)
            return rep.logits.cpu()
        return self._logits(batch, recorder=recorder).cpu()

    def decode_pick(self, batch: Batch, after: VkPicked | None = None,
                    params: torch.Tensor | None = None) -> VkPicked:
        """Launch a decode step whose tokens are picked on the device (argmax), or with `params`
        (int32 [7, B], kernels.sample.pack_params) drawn on the host from the rows' logits under
        the same sampling chain; only the picked tokens are read back. `after`: the step before,
        whose picked tokens are this step's inputs (on the device: the host never saw them)."""
        b = batch.n_tokens
        if batch.kind != "decode" or batch.out_rows.tolist() != list(range(b)):
            raise MinferError("decode_pick: the batch must be decode rows only, returning rows 0..B-1 in order")
        if after is not None and after.rows != b:
            raise MinferError(f"decode_pick: the step before had {after.rows} rows, this one {b}")
        if params is not None and (params.dtype != torch.int32 or tuple(params.shape) != (PARAM_ROWS, b) or not bool(
                ((params[0] >= 1) & (params[0] <= KMAX)).all())):
            raise MinferError(f"decode_pick: params must be int32 [{PARAM_ROWS}, {b}] with top_k in 1..{KMAX}")
        rep = self._replay(batch) if params is None else None
        if rep is not None:
            return rep.launch(batch, after)
        tokens = None
        if after is not None:
            tokens = after.picked if after.host is None else self.dev.upload(torch.tensor(after.host,
                                                                                          dtype=torch.int32))
        logits = self._logits(batch, tokens)
        if params is None:
            return VkPicked(b, self.argmax(x=logits))
        return VkPicked(b, None, sample_rows(logits.cpu(), params.cpu()).tolist())

    def warmup(self) -> None:
        """Compile now what the first requests would otherwise wait for: the pipelines of a prompt
        chunk, and the captured decode step of every row count the slots can fill. Writes only
        into the free cache (nothing is cached yet)."""
        if self.cache is None:
            raise ModelError("vulkan backend: allocate() the KV cache before warming up")
        self.forward(Batch.single([0] * min(17, self.n_ctx), 0, slot=0))
        for b in range(1, min(self.n_slots, MAX_REPLAY_ROWS) + 1):
            self.decode_pick(Batch.build([(s, 0, [0]) for s in range(b)], list(range(b)), n_decode=b)).tokens()

    def copy_bandwidth(self) -> float:
        return self.dev.copy_bandwidth()

    # ------------------------------------------------------------------ what runs
    def trace_graph(self) -> list[dict]:
        return self.plan.trace_nodes("row")

    def plan_rows(self, rows: int = 1, prefill: bool = False) -> list[dict]:
        """Per node with a kernel: what it runs for a step of `rows` rows."""
        return self.compiler.plan_rows("row" if rows == 1 and not prefill else "chunk", rows)
