"""The cuda backend: the graph on the GPU, every node's kernel chosen through the contracts.

`load` uploads each weight's GGUF bytes once and compiles the graph into the shared plan
(plan.py). For every node it asks the picker (contracts/picker.py) which registered kernel
accepts the node's op, dtypes, shapes and layouts, for each way the node runs: a decode step of
one row, a decode batch (up to 64 rows), a prompt chunk. A kernel's load layout (repacked
nibbles, an f16 copy) is made once per (layout, weight) at load. This file never names a kernel;
a node nothing accepts is a NoKernelError at load naming the op, the dtypes and the shape.

A fused weight whose parts differ in type (a Q4_K_M file's Q4_K q, k and Q6_K v) has no one
quantized layout: batches and prompt chunks multiply by the f16 copy of its stacked rows, and a
decode row runs, for each run of parts of one type, the kernel the picker chooses for that run
(its own GEMV), each writing its columns of the one [1, n] output (`_mixed_row_parts`).

`allocate` makes the KV cache (f16, one extra slot that padded graph rows write into) and the
RoPE tables. `forward` runs a batch: decode steps replay a CUDA graph captured once per batch
bucket (1, 2, 4, ..., 64; rows padded up to the bucket); prompt chunks (every span of the step
at once, up to PREFILL_SPANS of them) replay a graph captured once per row bucket (64 ... 1024),
their spans read on the device from a tile table (`attention_prefill`); what fits neither (more
rows or spans, every row's logits, tracing) runs the plan eagerly. A step that mixes decode rows
with a prompt chunk runs the two parts separately.

`decode_pick` launches a decode step whose tokens are picked on the device (the Argmax
contract, or the Sample contract for rows that sample, inside the captured graph) and returns at
once; given the step before it, it reads that step's picked tokens on the device, so the engine
can queue step N+1 before it has read step N's tokens: the GPU never waits for the host between
decode steps.

Under the Triton interpreter (TRITON_INTERPRET=1, CI) the same backend runs on CPU tensors,
without graphs: every GPU code path of it is exercised at small sizes without a GPU.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config import EngineConfig
from ..contracts.picker import candidates
from ..contracts.registry import BoundKernel, Registry, default_registry
from ..errors import MinferError, ModelError, UnsupportedError
from ..gguf.reader import GGUFReader
from ..graph.ir import Graph, Node, Op, WeightRef
from ..kernels._common import as_in_graphs, interpreting
from ..kernels.attention import max_prefill_tiles, prefill_tiles, q8_row_bytes
from ..kernels.sample import KMAX, PARAM_ROWS, pack_params
from ..quant.types import GGMLType, quant_info
from . import cpu_ops
from .base import Batch
from .calls import (
    STRIDED,
    Call,
    add_norm_pairs,
    admissible,
    compile_rope,
    fused_by,
    fused_norm,
    require_base_features,
    rope_key,
    type_runs,
)
from .kv_cache import KVCache, kv_bytes
from .plan import Plan, Step

BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # decode batch sizes captured as CUDA graphs
PREFILL_BUCKETS = (64, 128, 192, 256, 384, 512, 768, 1024)  # prompt-chunk row counts captured as graphs
PREFILL_SPANS = 8  # prompts one captured prompt-chunk pass holds (the tile table's capacity)
PREFILL_OUT = 16  # logits rows one captured prompt-chunk pass returns
KV_DTYPES = {"auto": torch.float16, "f16": torch.float16, "q8_0": torch.int8}  # int8: the Q8_0 layout


@dataclass(frozen=True)
class Choice:
    """The kernel a node runs for one way of running (decode row, decode batch, prompt chunk)."""

    kernel: BoundKernel
    cost_ns: float


KINDS = {"row": 1, "batch": 16, "chunk": 512}  # ways of running -> the row count kernels are picked for
PLAN_CTX = 1024  # the context attention costs are predicted for


class _State:
    """One pass: the batch's device tensors, whether it is a decode step, and its row count."""

    __slots__ = ("inputs", "decode", "rows", "kind", "spans")

    def __init__(self, inputs: dict[str, torch.Tensor], decode: bool, rows: int, spans=None):
        self.inputs, self.decode, self.rows = inputs, decode, rows
        self.kind = ("row" if rows == 1 else "batch") if decode else "chunk"
        self.spans = spans  # host (first row, slot, start, rows) per sequence; None in graphs


class _Describe:
    """A stand-in state for naming kernels outside a step (one decode row)."""

    kind = "row"


class PickedStep:
    """A launched decode step (`CUDABackend.decode_pick`): its picked tokens, on the device, and
    (graphs) their pinned host copy with the event that says it has landed."""

    __slots__ = ("rows", "picked", "host", "done")

    def __init__(self, rows: int, picked: torch.Tensor, host: torch.Tensor | None = None, done=None):
        self.rows, self.picked, self.host, self.done = rows, picked, host, done

    def tokens(self) -> list[int]:
        """The picked token of every row, in row order (waits for the step)."""
        if self.done is None:
            return self.picked[:self.rows].tolist()
        self.done.synchronize()
        return self.host[:self.rows].tolist()


def _capture(backend: CUDABackend, step: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph, object]:
    """`step` run twice eagerly on a side stream (Triton compiles and autotunes outside the
    capture), then captured into a graph on the backend's shared memory pool; (graph, what the
    captured call returned: its static outputs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), as_in_graphs():
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    if backend._pool is None:
        backend._pool = torch.cuda.graph_pool_handle()
    with torch.cuda.graph(graph, pool=backend._pool):
        out = step()
    return graph, out


class _DecodeGraph:
    """The decode step of `bucket` rows, captured once, picking tokens by argmax or (`sampling`)
    by the Sample contract. Inputs: one int32 [3, bucket] device buffer (tokens, positions, slots;
    [3 + 7, bucket] with each row's packed sampling parameters), filled from one of two pinned
    staging buffers by one copy per step (two, so the host stages step N+1 while step N's copy may
    still be queued); outputs: the logits and the picked tokens, copied to one of two pinned host
    buffers per step. Padded rows sample at temperature 0 (parameters all zero): the argmax."""

    def __init__(self, backend: CUDABackend, bucket: int, sampling: bool = False):
        dev = backend.device
        self.bucket, self.sampling = bucket, sampling
        width = 3 + (PARAM_ROWS if sampling else 0)
        self.io = torch.zeros(width, bucket, dtype=torch.int32, device=dev)
        self.io[2].fill_(backend.pad_slot)
        self.stages = [torch.zeros(width, bucket, dtype=torch.int32, pin_memory=True) for _ in range(2)]
        self.hosts = [torch.zeros(bucket, dtype=torch.int32, pin_memory=True) for _ in range(2)]
        self.copied = [torch.cuda.Event() for _ in range(2)]
        self.turn = 0
        self.static = {"tokens": self.io[0], "positions": self.io[1], "row_slots": self.io[2],
                       "out_rows": torch.arange(bucket, dtype=torch.int32, device=dev)}
        state = _State(self.static, True, bucket)
        def step():
            out = backend.plan.run(state)
            return out, self._picker(backend, out)

        self.graph, (self.out, self.picked) = _capture(backend, step)
        for e in self.copied:
            e.record()

    def _picker(self, backend: CUDABackend, logits: torch.Tensor) -> torch.Tensor:
        if self.sampling:
            return backend._sample(x=logits, params=self.io[3:])
        return backend._pick(x=logits)

    def launch(self, batch: Batch, pad_slot: int, after: PickedStep | None = None,
               params: torch.Tensor | None = None) -> int:
        """Stage the batch's inputs (tokens from `after`'s picked tokens, on the device, when
        given; `params`, int32 [7, B], the rows' sampling parameters for a sampling graph), replay;
        returns the turn whose host buffer `pick_to_host` fills."""
        b, turn = batch.n_tokens, self.turn
        self.turn ^= 1
        stage, copied = self.stages[turn], self.copied[turn]
        copied.synchronize()  # this buffer's previous copy has left it
        if after is None:
            stage[0, :b].copy_(batch.tokens)
        stage[1, :b].copy_(batch.positions)
        stage[2, :b].copy_(batch.row_slots)
        if self.sampling:
            stage[3:, :b].copy_(params)
        if b < self.bucket:  # padded rows: token 0 at position 0 of the spare slot
            stage[:2, b:].zero_()
            stage[2, b:].fill_(pad_slot)
            stage[3:, b:].zero_()
        if after is None:
            self.io.copy_(stage, non_blocking=True)  # one host-to-device copy of the step's inputs
        else:
            self.io[1:].copy_(stage[1:], non_blocking=True)
            self.io[0, :b].copy_(after.picked[:b])  # device to device: the host never saw them
        copied.record()
        self.graph.replay()
        return turn

    def pick_to_host(self, turn: int, rows: int) -> PickedStep:
        host = self.hosts[turn]
        host.copy_(self.picked, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return PickedStep(rows, self.picked, host, done)


class _PrefillGraph:
    """A prompt-chunk pass of `bucket` rows, captured once: up to PREFILL_SPANS spans, up to
    PREFILL_OUT logits rows. Its inputs are one int32 device buffer (tokens, positions, slots,
    the attention tile table, the output rows) filled from a pinned staging copy by one copy per
    step. Padded rows are token 0 at position 0 of the spare slot and in no tile; unused tiles
    hold 0 rows; padded output rows repeat row 0."""

    def __init__(self, backend: CUDABackend, bucket: int):
        dev = backend.device
        self.bucket = bucket
        self.n_tiles = max_prefill_tiles(bucket, PREFILL_SPANS)
        b, t = bucket, self.n_tiles
        self.io = torch.zeros(3 * b + 4 * t + PREFILL_OUT, dtype=torch.int32, device=dev)
        self.stage = torch.zeros(self.io.shape, dtype=torch.int32, pin_memory=True)
        self.stage[2 * b:3 * b] = backend.pad_slot
        self.io.copy_(self.stage)
        self.copied = torch.cuda.Event()
        self.static = {"tokens": self.io[:b], "positions": self.io[b:2 * b], "row_slots": self.io[2 * b:3 * b],
                       "tiles": self.io[3 * b:3 * b + 4 * t].view(t, 4), "out_rows": self.io[3 * b + 4 * t:]}
        state = _State(self.static, False, bucket)
        self.graph, self.out = _capture(backend, lambda: backend.plan.run(state))
        self.copied.record()

    @staticmethod
    def fits(batch: Batch) -> bool:
        return (batch.kind == "prefill" and batch.n_tokens <= PREFILL_BUCKETS[-1] and len(batch.spans) <= PREFILL_SPANS
                and len(batch.out_rows) <= PREFILL_OUT)

    def launch(self, batch: Batch, pad_slot: int) -> torch.Tensor:
        """Stage the batch, replay; the logits of its out_rows (the graph's own buffer: read it
        before this graph replays again)."""
        n, b, t, st = batch.n_tokens, self.bucket, self.n_tiles, self.stage
        self.copied.synchronize()  # the staging buffer's previous copy has left it
        st[:n].copy_(batch.tokens)
        st[n:b].zero_()
        st[b:b + n].copy_(batch.positions)
        st[b + n:2 * b].zero_()
        st[2 * b:2 * b + n].copy_(batch.row_slots)
        st[2 * b + n:3 * b].fill_(pad_slot)
        tiles = prefill_tiles([(s.offset, s.slot, s.start, s.n_tokens) for s in batch.spans])
        table = st[3 * b:3 * b + 4 * t].view(t, 4)
        table.zero_()
        table[:len(tiles)] = torch.tensor(tiles, dtype=torch.int32)
        rows = st[3 * b + 4 * t:]
        r = len(batch.out_rows)
        rows[:r].copy_(batch.out_rows)
        rows[r:].zero_()
        self.io.copy_(st, non_blocking=True)
        self.copied.record()
        self.graph.replay()
        return self.out[:r]


def _contract_name(t: GGMLType) -> str:
    return quant_info(t).contract_name


def _not_loaded(vals, st):
    raise ModelError("cuda backend: this plan was compiled without weights (minfer plan); it cannot run")


class CUDABackend:
    name = "cuda"
    prefill_seqs = 8  # prompts per step when many arrive at once (rows' numbers then depend on the batch)

    def __init__(self, config: EngineConfig | None = None, registry: Registry | None = None, plan_only: bool = False,
                 comm=None):
        """`plan_only`: only pick kernels (`load(..., upload=False)`), on a machine with no GPU.
        `comm` (parallel/comm.py): this rank's communicator, for a tensor-parallel graph (its
        all-reduces run on this process's GPU, inside the decode graphs)."""
        self.config = config or EngineConfig(device="cuda")
        self.comm = comm
        if self.config.kv_dtype not in KV_DTYPES:
            raise UnsupportedError(f"cuda backend: KV cache dtype {self.config.kv_dtype!r} is not supported yet "
                                   f"(supported: {', '.join(KV_DTYPES)})")
        self.interpreted = interpreting()
        if not self.interpreted and not plan_only and not torch.cuda.is_available():
            raise MinferError("cuda backend: no CUDA GPU is visible to torch")
        self.on_gpu = not self.interpreted and torch.cuda.is_available()
        self.device = torch.device("cuda" if self.on_gpu else "cpu")
        self.registry = registry or default_registry()
        self.graph: Graph | None = None
        self.plan: Plan | None = None
        self.cache: KVCache | None = None
        self.choices: dict[int, dict[str, Choice]] = {}  # node id -> way of running -> kernel
        self.calls: dict[int, Call] = {}  # node id -> how it calls its op (to re-cost any batch size)
        self.extra: dict[int, tuple[Call, Choice]] = {}  # node id -> a second kernel it runs (bias add)
        # node id -> the decode row's (call, kernel) per run of one type of a fused weight whose parts differ
        self.parts: dict[int, list[tuple[Call, Choice]]] = {}
        # decode-row epilogue fusion (kernels/gemv_fused.py): matmul node id -> its fused call, and
        # node id -> the matmul that computes it inside its epilogue (its SwiGLU or RoPE)
        self.fused_calls: dict[int, Call] = {}
        self.absorbed: dict[int, int] = {}
        self.plain_rows: dict[int, Choice] = {}  # such a matmul's plain GEMV (matmul_args)
        self.kv_fused: dict[int, int] = {}  # attention node id -> the q+k+v matmul that writes its row's k, v
        self.upload = True
        self._reader: GGUFReader | None = None
        self._bytes: dict[str, torch.Tensor] = {}  # tensor name -> its GGUF bytes on the device
        self._laid: dict[tuple[str, WeightRef], object] = {}  # (kernel, weight) -> its load layout
        self._vectors: dict[str, torch.Tensor] = {}
        self._ropes: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._graphs: dict[tuple, object] = {}  # (decode bucket, sampling) / ("prefill", bucket) -> its graph
        self._pool = None
        self.use_graphs = self.config.cuda_graph and self.on_gpu
        self.kv_q8 = KV_DTYPES[self.config.kv_dtype] == torch.int8
        self.kv_itemsize = 17 / 16 if self.kv_q8 else 2  # bytes per cached element

    # ------------------------------------------------------------------ load
    def load(self, graph: Graph, reader: GGUFReader, progress: bool = True, upload: bool = True) -> None:
        """Pick every node's kernels and (upload=True) put the weights on the device in their
        kernels' layouts. upload=False only picks: what `minfer plan` shows, with no GPU needed."""
        require_base_features(graph, "cuda")
        self.graph, self._reader, self.upload = graph, reader, upload
        self._fused_norms = add_norm_pairs(graph)
        self._epilogues = self._epilogue_pairs(graph) if self.config.fuse_epilogues else {}
        self._readers: dict[int, list[int]] = {}
        for n in graph.nodes:
            for i in n.inputs:
                self._readers.setdefault(i, []).append(n.id)
        # RMSNorm node id -> (codes, scales): its decode row also writes its output's int8 form, which
        # the one GEMV reading it takes instead of quantizing x itself (registered by that matmul)
        self.norm_q8: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        sync = torch.cuda.synchronize if self.on_gpu else None
        with torch.inference_mode():
            self.plan = Plan(graph, self._compile, progress=progress, sync=sync, comm=self.comm)
        n_vocab = graph.meta["n_vocab"]
        self.pick_call = Call("Argmax", {"x": "F32"}, lambda r: {"x": (r, n_vocab)}, {})
        self._pick = self._choose(graph.nodes[-1], self.pick_call, 1).kernel
        self.sample_call = Call("Sample", {"x": "F32", "params": "I32"},
                                lambda r: {"x": (r, n_vocab), "params": (PARAM_ROWS, r)}, {})
        self._sample = self._choose(graph.nodes[-1], self.sample_call, 1).kernel
        if self.on_gpu:
            torch.cuda.synchronize()

    def _raw(self, name: str) -> torch.Tensor:
        """The tensor's GGUF bytes on the device, uint8 [rows, row_bytes] (uploaded once)."""
        if name not in self._bytes:
            info = self._reader.tensors[name]
            host = torch.from_numpy(self._reader.tensor_bytes(name))
            rows = info.torch_shape[0] if len(info.shape) > 1 else 1
            self._bytes[name] = host.view(rows, -1).to(self.device)
        return self._bytes[name]

    def _vector(self, name: str) -> torch.Tensor:
        if name not in self._vectors:
            from ..quant.reference import dequantize

            info = self._reader.tensors[name]
            host = torch.from_numpy(self._reader.tensor_bytes(name))
            self._vectors[name] = dequantize(host, info.ggml_type, (info.shape[0],)).float().to(self.device)
        return self._vectors[name]

    def _types(self, w: WeightRef) -> GGMLType | None:
        """The storage type of a (fused) weight; None when its parts differ in type."""
        types = {self._reader.tensors[t.name].ggml_type for t in w.tensors}
        return types.pop() if len(types) == 1 else None

    def _matrix_bytes(self, w: WeightRef):
        """The bytes of W on the device, [n, row_bytes], a fused weight's parts stacked (a list of
        the parts when they differ in type: only a kernel that takes a dense copy can run them)."""
        parts = [self._raw(t.name) for t in w.tensors]
        if self._types(w) is None:
            return parts
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _choose(self, node: Node, call: Call, rows: int) -> Choice:
        def mmq(ok):  # MINFER_MMQ's choice among many-row matmuls, when it has one
            if call.prefer_quantized is None or rows <= 1 or len(ok) < 2:
                return ok
            return [c for c in ok if _reads_quantized(c.kernel) == call.prefer_quantized] or ok

        best = admissible(call, rows, "CUDA", self.registry, "cuda", node, mmq)[0]
        return Choice(best.kernel, best.cost_ns)

    def _picks(self, node: Node, call: Call) -> dict[str, BoundKernel]:
        """The kernel for each way of running (kept, with the call, for `minfer plan`)."""
        self.calls[node.id] = call
        picks = {kind: self._choose(node, call, rows) for kind, rows in KINDS.items()}
        self.choices[node.id] = picks
        return {kind: c.kernel for kind, c in picks.items()}

    def _laid_out(self, kernel: BoundKernel, w: WeightRef, n: int, k: int, extra: dict | None = None):
        """The weight in `kernel`'s load layout, made once per (layout, weight, `extra` params of
        the layout): kernels that share a layout (the Q4_0 GEMV and matmul) share the copy."""
        extra = extra or {}
        key = (tuple(c.load_layout for c in kernel.contract.inputs if c.load_layout), w, tuple(sorted(extra.items())))
        if key not in self._laid:
            raw, qtype = self._matrix_bytes(w), self._types(w)
            if qtype is None:  # parts of different types: one dense f16 copy of the stacked rows
                from ..kernels.torch_ops import f16_weight

                raw = torch.cat([f16_weight(r, part.shape[1], k, self._reader.tensors[part.name].ggml_type)
                                 for r, part in zip(raw, w.tensors, strict=True)])
                qtype = GGMLType.F16
            params = {"n": n, "k": k, "qtype": qtype, **extra}
            self._laid[key] = kernel.apply_load_layouts({"w": raw}, params)["w"] if kernel.load_layouts else raw
        return self._laid[key]

    # ------------------------------------------------------------------ compile
    def _compile(self, node: Node) -> Step:
        op, ins, p = node.op, node.inputs, node.params
        if op == Op.INPUT:
            name = node.name
            return Step(lambda vals, st: st.inputs[name], "input")
        if op == Op.SLICE:
            (i,), a, b = ins, p["start"], p["stop"]
            return Step(lambda vals, st: vals[i][..., a:b], "view")
        handler = {Op.GET_ROWS: self._compile_get_rows, Op.RMS_NORM: self._compile_norm,
                   Op.MATMUL: self._compile_matmul, Op.ADD: self._compile_add, Op.SWIGLU: self._compile_swiglu,
                   Op.ROPE: self._compile_rope,
                   Op.ATTENTION: self._compile_attention}.get(op)
        if handler is None:
            raise UnsupportedError(f"cuda backend: op {op} (node {node.name!r}) is not implemented")
        fn, run = handler(node)
        return Step(fn if self.upload else _not_loaded,
                    lambda st, nid=node.id, r=run: self._kernel_name(nid, st.kind, r))

    def _kernel_name(self, node_id: int, kind: str, run: dict | None = None) -> str:
        """What a node runs for `kind`: its kernel's name, or the per-type kernels of a mixed
        fused weight's decode row joined by '+'."""
        if kind == "row" and node_id in self.parts:
            return "+".join(c.kernel.name for _, c in self.parts[node_id])
        return (run[kind] if run is not None else self.choices[node_id][kind].kernel).name

    @staticmethod
    def _epilogue_pairs(graph: Graph) -> dict[int, tuple[str, int]]:
        """matmul node id -> ("swiglu" | "rope", the node its decode-row GEMV can compute in its
        epilogue): a bias-free stacked gate+up whose two halves only a SwiGLU reads, or a stacked
        q+k+v whose columns from 0 a RoPE rotates (its other readers slices of the rest)."""
        readers: dict[int, list[Node]] = {}
        for n in graph.nodes:
            for i in n.inputs:
                readers.setdefault(i, []).append(n)
        pairs = {}
        for m in graph.nodes:
            rs = readers.get(m.id, [])
            if m.op != Op.MATMUL or len(m.weights["w"].tensors) < 2 or not rs or any(r.op != Op.SLICE for r in rs):
                continue
            n = m.weights["w"].shape[1]
            nxt = [readers.get(r.id, []) for r in rs]
            if len(rs) == 2 and "b" not in m.weights and all(len(x) == 1 for x in nxt):
                (g, u), f = sorted(rs, key=lambda r: r.params["start"]), n // 2
                sw = nxt[rs.index(g)][0]
                if (sw.op == Op.SWIGLU and sw.inputs == (g.id, u.id) and (g.params["start"], g.params["stop"]) == (0, f)
                        and (u.params["start"], u.params["stop"]) == (f, n) and readers[u.id] == [sw]):
                    pairs[m.id] = ("swiglu", sw.id)
                continue
            for r, after in zip(rs, nxt, strict=True):
                if r.params["start"] == 0 and len(after) == 1 and after[0].op == Op.ROPE and after[0].inputs[0] == r.id:
                    rope = after[0]
                    if rope.params["n_heads"] * rope.params["head_dim"] == r.params["stop"]:
                        pairs[m.id] = ("rope", rope.id)
        return pairs

    @staticmethod
    def _kv_consumer(graph: Graph, matmul: Node, rope: Node) -> Node | None:
        """The Attention node whose q and k are slices of `rope`'s output and whose v is a slice of
        `matmul`'s (the q+k+v GEMV can then write the row's k and v into the cache itself)."""
        by_id = {n.id: n for n in graph.nodes}
        for n in graph.nodes:
            if n.op != Op.ATTENTION:
                continue
            q, k, v = (by_id[i] for i in n.inputs[:3])
            if (q.op == k.op == v.op == Op.SLICE and q.inputs == k.inputs == (rope.id,) and v.inputs == (matmul.id,)
                    and v.params["start"] == rope.params["n_heads"] * rope.params["head_dim"]):
                return n
        return None

    def _compile_norm(self, node: Node):
        d, eps = node.shape[-1], node.params["eps"]
        add_id = fused_by(self._fused_norms, node)
        if add_id is not None and add_id in self.choices:  # the add before it computed it
            self.choices[node.id] = self.choices[add_id]
            return (lambda vals, st: vals[node.id]), {k: c.kernel for k, c in self.choices[add_id].items()}
        run = self._picks(node, Call("RMSNorm", {"x": "F32", "w": "F32"}, lambda r: {"x": (r, d), "w": (d,)},
                                     {"eps": eps}, {"x": STRIDED}))
        w = self._vector(node.weights["w"].name) if self.upload else None
        (i,) = node.inputs

        def fn(vals, st):
            q8 = self.norm_q8.get(node.id) if st.kind == "row" else None
            return run[st.kind](x=vals[i], w=w, eps=eps, **({} if q8 is None else {"q8": q8}))

        return fn, run

    def _compile_add(self, node: Node):
        d = node.shape[-1]
        i, j = node.inputs
        pair = fused_norm(self._fused_norms, node, self.graph, "CUDA", self.registry)
        if pair is not None:  # the fused contract: h written over the residual x, the norm stashed for its node
            norm, call = pair
            norm_id, eps = norm.id, norm.params["eps"]
            run = self._picks(node, call)
            w = self._vector(norm.weights["w"].name) if self.upload else None

            def fused(vals, st):
                x = vals[i]
                q8 = self.norm_q8.get(norm_id) if st.kind == "row" else None
                vals[norm_id] = run[st.kind](x=x, y=vals[j], w=w, eps=eps, sum_out=x,
                                             **({} if q8 is None else {"q8": q8}))
                return x

            return fused, run
        run = self._picks(node, Call("Add", {"x": "F32", "y": "F32"}, lambda r: {"x": (r, d), "y": (r, d)}, {}))
        return (lambda vals, st: run[st.kind](x=vals[i], y=vals[j])), run

    def _compile_get_rows(self, node: Node):
        if "w" not in node.weights:  # the rows whose logits the step returns
            i, r = node.inputs
            d = node.shape[-1]
            run = self._picks(node, Call("RowSelect", {"x": "F32", "rows": "I32"},
                                         lambda n: {"x": (max(n, 1), d), "rows": (1,)}, {}, {"x": STRIDED}))
            return (lambda vals, st: run[st.kind](x=vals[i], rows=vals[r])), run
        (i,), w = node.inputs, node.weights["w"]
        info = self._reader.tensors[w.name]
        params = {"qtype": info.ggml_type, "n_embd": info.shape[0]}
        table_shape = (info.torch_shape[0], info.nbytes // info.torch_shape[0])
        run = self._picks(node, Call("GetRows", {"weight_u8": _contract_name(info.ggml_type), "ids": "I32"},
                                     lambda r: {"weight_u8": table_shape, "ids": (r,)}, params))
        table = self._raw(w.name) if self.upload else None
        return (lambda vals, st: run[st.kind](weight_u8=table, ids=vals[i], **params)), run

    def _matmul_type(self, w: WeightRef) -> GGMLType:
        """The type a matmul kernel reads W as: its storage type, or F16 for mixed parts (their
        dense f16 copy)."""
        qtype = self._types(w)
        return qtype if qtype is not None else GGMLType.F16

    def matmul_args(self, node: Node, kind: str = "row") -> tuple[BoundKernel, dict]:
        """The kernel a MatMul node runs for `kind` and its arguments but x, the weight in the
        kernel's layout: `kernel(x=x, **args)` is the compiled step's call (for benchmarks that
        time one projection alone)."""
        w = node.weights["w"]
        k, n = w.shape
        if kind == "row" and node.id in self.parts:
            raise UnsupportedError(f"matmul_args: node {node.name!r} runs one kernel per type of its parts for a "
                                   "decode row; time the parts alone")
        # a decode row whose GEMV runs a fused epilogue: the plain GEMV of the weight (laid out now)
        choice = self.plain_rows.get(node.id) if kind == "row" else None
        kernel = (choice or self.choices[node.id][kind]).kernel
        return kernel, {"w": self._laid_out(kernel, w, n, k), "n": n, "k": k, "qtype": self._matmul_type(w)}

    def _type_runs(self, w: WeightRef) -> list[tuple[WeightRef, GGMLType, int, int]]:
        """calls.type_runs over this file's storage types."""
        return type_runs(w, lambda name: self._reader.tensors[name].ggml_type)

    def _matmul_call(self, w: WeightRef) -> Call:
        k, n = w.shape
        wq = self._matmul_type(w)
        return Call("QMatMul", {"x": "F32", "w": _contract_name(wq)}, lambda m: {"x": (m, k), "w": (n, k)},
                    {"n": n, "k": k, "qtype": wq}, prefer_quantized=self.config.mmq)

    def _compile_matmul(self, node: Node):
        w = node.weights["w"]
        k, n = w.shape
        wq = self._matmul_type(w)
        run = self._picks(node, self._matmul_call(w))
        bias = add_bias = None
        if "b" in node.weights:
            add_bias = self._picks_aside(node, Call("AddBias", {"y": "F32", "b": "F32"},
                                                    lambda m: {"y": (m, n), "b": (n,)}, {"n_rows": 2}))
            if self.upload:
                bias = torch.cat([self._vector(t.name) for t in node.weights["b"].tensors])
        (i,) = node.inputs
        parts = self._mixed_row_parts(node, w) if wq == GGMLType.F16 and len(w.tensors) > 1 else None
        fused = self._fused_row(node, run, bias) if parts is None else None
        laid = {kind: self._laid_out(kernel, w, n, k) for kind, kernel in run.items()
                if self.upload and not (kind == "row" and (parts is not None or fused is not None))}
        if "row" in laid:
            self._norm_int8(node, self.choices[node.id]["row"].kernel, laid["row"])

        def fn(vals, st):
            if fused is not None and st.kind == "row":
                return fused(vals, st)
            if parts is not None and st.kind == "row":
                x = vals[i]
                y = torch.empty(1, n, dtype=torch.float32, device=x.device)
                for kernel, wp, a, b, t in parts:  # each writes its columns: [1, n] slices are contiguous
                    kernel(x=x, w=wp, n=b - a, k=k, qtype=t, out=y[:, a:b])
            else:
                more = self._xq(i) if st.kind == "row" else {}
                y = run[st.kind](x=vals[i], w=laid[st.kind], n=n, k=k, qtype=wq, **more)
            if bias is not None:  # (a fused decode row added it in its epilogue)
                add_bias(y=y, b=bias, n_rows=y.shape[0])
            return y

        return fn, run

    def _fused_row(self, node: Node, run: dict, bias: torch.Tensor | None):
        """The decode row's step of a matmul whose epilogue computes the node after it
        (`_epilogue_pairs`), when a kernel accepts the fused call; None otherwise. Records the
        fused call (for `minfer plan`) and the absorbed node, whose decode row then only passes on
        the value this step computed (a SwiGLU's is stashed in its slot of `vals`)."""
        if node.id not in self._epilogues:
            return None
        how, nid = self._epilogues[node.id]
        w, (i,) = node.weights["w"], node.inputs
        k, n = w.shape
        wq = self._matmul_type(w)
        shapes = {"x": (1, k), "w": (n, k)}
        params = {"n": n, "k": k, "qtype": wq}
        dtypes = {"x": "F32", "w": _contract_name(wq)}
        if how == "rope":
            rope = self.graph.nodes[nid]
            p = rope.params
            extra = {"n_heads": p["n_heads"], "head_dim": p["head_dim"], "n_rot": p["n_rot"],
                     "neox": p["style"] == "neox"}
            half = p["n_rot"] // 2
            call = Call("QMatMulRoPE", {**dtypes, "b": "F32", "positions": "I32", "cos": "F32", "sin": "F32"},
                        lambda r: {**shapes, "b": (n,), "positions": (1,), "cos": (16, half), "sin": (16, half)},
                        {**params, **extra})
        else:
            extra = {}
            call = Call("QMatMulSwiGLU", dtypes, lambda r: shapes, params)
        ok, _ = candidates(call.op, call.dtypes, call.shapes(1), call.params, "CUDA", registry=self.registry)
        if not ok:
            return None
        choice = Choice(ok[0].kernel, ok[0].cost_ns)
        kernel = choice.kernel
        self.fused_calls[node.id] = call
        self.absorbed[nid] = node.id
        self.plain_rows[node.id] = self.choices[node.id]["row"]
        run["row"] = kernel
        self.choices[node.id]["row"] = choice
        laid = self._laid_out(kernel, w, n, k, extra) if self.upload else None
        self._norm_int8(node, kernel, laid)
        if how == "swiglu":
            def fused(vals, st):
                y = vals[nid] = kernel(x=vals[i], w=laid, n=n, k=k, qtype=wq, **self._xq(i))
                return y
        else:
            b = bias if bias is not None else (torch.zeros(n, device=self.device) if self.upload else None)
            pos, key = rope.inputs[1], rope_key(rope)
            attn = None if self.kv_q8 else self._kv_consumer(self.graph, node, rope)
            if attn is not None:  # the row's k and v go into the (f16) cache from this GEMV's epilogue
                self.kv_fused[attn.id] = node.id
                layer, nkv = attn.params["kv_layer"], attn.params["n_head_kv"]

            def fused(vals, st):
                cos, sin = self._ropes[key]
                cache = {} if attn is None else {"cache_k": self.cache.k, "cache_v": self.cache.v, "layer": layer,
                                                 "row_slots": st.inputs["row_slots"], "n_head_kv": nkv}
                return kernel(x=vals[i], w=laid, b=b, positions=vals[pos], cos=cos, sin=sin, n=n, k=k, qtype=wq,
                              **extra, **cache, **self._xq(i))
        return fused

    def _xq(self, i: int) -> dict:
        """The decode-row GEMV's `xq=` argument when its x, node i, is written in int8 too."""
        q8 = self.norm_q8.get(i)
        return {} if q8 is None else {"xq": q8}

    def _norm_int8(self, node: Node, kernel: BoundKernel, laid) -> None:
        """When this matmul's decode-row GEMV takes int8 activations and its x is an RMSNorm's
        output read by nothing else, registers buffers (`norm_q8`) into which the norm's row writes
        x's int8 form, and from which the GEMV reads it instead of quantizing x itself."""
        from ..kernels.gemv_fused import input_q8_passes

        (i,) = node.inputs
        src = self.graph.nodes[i]
        if src.op != Op.RMS_NORM or self._readers.get(i) != [node.id] or laid is None:
            return
        norm_kernel = self.choices.get(i, {}).get("row")
        passes = input_q8_passes(laid)
        if (not passes or norm_kernel is None or "q8" not in inspect.signature(norm_kernel.kernel.launcher).parameters
                or "xq" not in inspect.signature(kernel.launcher).parameters):
            return
        k = node.weights["w"].shape[0]
        bufs = (torch.zeros(1, k // 32, 8 * passes, dtype=torch.int32, device=self.device),
                torch.zeros(1, k // 32, 4, dtype=torch.float32, device=self.device))
        self.norm_q8[i] = bufs

    def _mixed_row_parts(self, node: Node, w: WeightRef) -> list[tuple] | None:
        """For a fused weight whose parts differ in type: the decode row's kernel of each run of
        one type (picked like any matmul's), with the run's weight in that kernel's layout and its
        output columns; kept in `self.parts` for `minfer plan`. None when every part has one type."""
        runs = self._type_runs(w)
        if len(runs) < 2:
            return None
        k = w.shape[0]
        out, picked = [], []
        for ref, _, a, b in runs:
            call = self._matmul_call(ref)
            choice = self._choose(node, call, KINDS["row"])
            picked.append((call, choice))
            laid = self._laid_out(choice.kernel, ref, b - a, k) if self.upload else None
            out.append((choice.kernel, laid, a, b, call.params["qtype"]))
        self.parts[node.id] = picked
        return out

    def _picks_aside(self, node: Node, call: Call) -> BoundKernel:
        """A second kernel a node runs (its bias add), costed into the plan under the node."""
        c = self._choose(node, call, 1)
        self.extra[node.id] = (call, c)
        return c.kernel

    def _compile_swiglu(self, node: Node):
        i, j = node.inputs
        d = node.shape[-1]
        # the gate and up columns of a fused matmul: contiguous for one row, row-strided for more
        call = Call("SwiGLU", {"gate": "F32", "up": "F32"}, lambda r: {"gate": (r, d), "up": (r, d)}, {},
                    layouts_of=lambda r: {"gate": STRIDED, "up": STRIDED} if r > 1 else None)
        run = self._picks(node, call)
        fn = lambda vals, st: run[st.kind](gate=vals[i], up=vals[j])  # noqa: E731
        if node.id in self.absorbed:  # a decode row's SwiGLU ran in the gate+up GEMV, which stashed it
            return self._absorb(node, run, lambda vals: vals[node.id], fn)
        return fn, run

    def _compile_rope(self, node: Node):
        fn, run = compile_rope(node, self._picks, self._ropes)
        if node.id in self.absorbed:  # a decode row's RoPE ran in the q+k+v GEMV: its input is rotated
            i = node.inputs[0]
            return self._absorb(node, run, lambda vals: vals[i], fn)
        return fn, run

    def _absorb(self, node: Node, run: dict, row_value: Callable, fn: Callable):
        """The step of a node a matmul's epilogue computes for a decode row: `row_value(vals)`
        for a row, its own step `fn` otherwise; its decode row names the matmul's fused kernel."""
        run["row"] = self.choices[self.absorbed[node.id]]["row"].kernel
        return (lambda vals, st: row_value(vals) if st.kind == "row" else fn(vals, st)), run

    def _compile_attention(self, node: Node):
        p = node.params
        q_i, k_i, v_i, pos = node.inputs
        nh, nkv, hd = p["n_head"], p["n_head_kv"], p["head_dim"]
        params = {"layer": p["kv_layer"], "n_head": nh, "n_head_kv": nkv, "head_dim": hd, "scale": p["scale"]}
        cache_dtype = "I8" if self.kv_q8 else "F16"
        dtypes = {"q": "F32", "k": "F32", "v": "F32", "cache_k": cache_dtype, "cache_v": cache_dtype,
                  "row_slots": "I32", "positions": "I32"}
        cache = (self.graph.meta["n_layer"], 2, nkv, PLAN_CTX, q8_row_bytes(hd) if self.kv_q8 else hd)

        def shapes(rows):
            return {"q": (rows, nh * hd), "k": (rows, nkv * hd), "v": (rows, nkv * hd), "cache_k": cache,
                    "cache_v": cache, "row_slots": (rows,), "positions": (rows,)}

        run = self._picks(node, Call("Attention", dtypes, shapes, params, {"q": STRIDED, "k": STRIDED, "v": STRIDED}))
        # a decode row whose q+k+v GEMV wrote k and v into the cache: the row kernel skips its write
        # (a kernel without the switch writes the same values again)
        written = node.id in self.kv_fused and "kv_written" in inspect.signature(run["row"].launcher).parameters

        def fn(vals, st):
            kc = self.cache
            more = {"kv_written": True} if written and st.kind == "row" else {}
            return run[st.kind](q=vals[q_i], k=vals[k_i], v=vals[v_i], cache_k=kc.k, cache_v=kc.v,
                                row_slots=st.inputs["row_slots"], positions=vals[pos], spans=st.spans,
                                tiles=st.inputs.get("tiles"), **params, **more)

        return fn, run

    # ------------------------------------------------------------------ memory
    def kv_budget(self) -> int:
        """Half the GPU's free memory (after the weights) for a cache whose size the engine chooses."""
        if not self.on_gpu:
            return 1 << 30
        free, _ = torch.cuda.mem_get_info()
        return free // 2

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
        self._graphs.clear()
        self.cache = None
        self.cache = KVCache(m["n_layer"], n_slots + 1, n_ctx, m["n_head_kv"], m["head_dim"], KV_DTYPES[
            self.config.kv_dtype], self.device, row_width=q8_row_bytes(m["head_dim"]) if self.kv_q8 else None)
        self.n_slots, self.pad_slot = n_slots, n_slots
        for node in self.graph.nodes:
            if node.op == Op.ROPE:
                key = rope_key(node)
                p, ff = node.params, node.weights.get("freq_factors")
                factors = self._vector(ff.name).cpu() if ff else None
                cos, sin = cpu_ops.rope_table(n_ctx, p["n_rot"], p["base"], p["freq_scale"], factors)
                self._ropes[key] = (cos.to(self.device), sin.to(self.device))

    # ------------------------------------------------------------------ run
    def _device_inputs(self, batch: Batch) -> dict[str, torch.Tensor]:
        return {name: getattr(batch, name).to(self.device, non_blocking=True)
                for name in ("tokens", "positions", "row_slots", "out_rows")}

    def forward(self, batch: Batch, recorder=None) -> torch.Tensor:
        """float32 logits [R, n_vocab] (on the device) of the batch's out_rows."""
        cache = self.cache
        if cache is None:
            raise ModelError("cuda backend: allocate() the KV cache before running a step")
        batch.check(self.n_slots, cache.n_ctx)
        with torch.inference_mode():
            parts = batch.split()
            if len(parts) == 1:
                return self._run(batch, recorder)
            out = torch.empty(len(batch.out_rows), self.graph.meta["n_vocab"], device=self.device)
            for part, idx in parts:
                out[torch.tensor(idx, device=self.device)] = self._run(part, recorder)
            return out

    def _run(self, batch: Batch, recorder) -> torch.Tensor:
        decode = batch.kind == "decode"
        rows = batch.n_tokens
        if decode and self.use_graphs and recorder is None and rows <= BUCKETS[-1]:
            return self._replay(batch)
        if not decode and self.use_graphs and recorder is None and _PrefillGraph.fits(batch):
            return self._prefill_graph(rows).launch(batch, self.pad_slot)
        spans = [(s.offset, s.slot, s.start, s.n_tokens) for s in batch.spans]
        inputs = self._device_inputs(batch)
        if not decode:  # the attention tile table, built once for every layer
            inputs["tiles"] = torch.tensor(prefill_tiles(spans), dtype=torch.int32).to(self.device, non_blocking=True)
        return self.plan.run(_State(inputs, decode, rows, spans), recorder)

    def _prefill_graph(self, rows: int) -> _PrefillGraph:
        bucket = next(x for x in PREFILL_BUCKETS if x >= rows)
        if ("prefill", bucket) not in self._graphs:
            self._graphs["prefill", bucket] = _PrefillGraph(self, bucket)
        return self._graphs["prefill", bucket]

    def _graph(self, rows: int, sampling: bool = False) -> _DecodeGraph:
        bucket = next(x for x in BUCKETS if x >= rows)
        if (bucket, sampling) not in self._graphs:
            self._graphs[bucket, sampling] = _DecodeGraph(self, bucket, sampling)
        return self._graphs[bucket, sampling]

    def _replay(self, batch: Batch) -> torch.Tensor:
        g = self._graph(batch.n_tokens)
        g.launch(batch, self.pad_slot)
        return g.out[:batch.n_tokens]

    def decode_pick(self, batch: Batch, after: PickedStep | None = None,
                    params: torch.Tensor | None = None) -> PickedStep:
        """Launch a decode step of `batch` (one token per sequence, out_rows 0..B-1 in order) whose
        next tokens are picked on the device: the argmax of each row's logits, or with `params`
        (int32 [7, B], kernels.sample.pack_params; rows with top_k in 1..KMAX) each row's draw
        under its sampling parameters; return without waiting. `after`: the launched step before
        it, of the same sequences in the same rows: this step's input tokens are that step's
        picked tokens, read on the device (batch.tokens is ignored)."""
        cache = self.cache
        if cache is None:
            raise ModelError("cuda backend: allocate() the KV cache before running a step")
        batch.check(self.n_slots, cache.n_ctx)
        b = batch.n_tokens
        if batch.kind != "decode" or not torch.equal(batch.out_rows, torch.arange(b, dtype=torch.int32,
                                                                                   device=batch.out_rows.device)):
            raise MinferError("decode_pick: the batch must be decode rows only, returning rows 0..B-1 in order")
        if after is not None and after.rows != b:
            raise MinferError(f"decode_pick: the step before had {after.rows} rows, this one {b}")
        if params is not None and (params.dtype != torch.int32 or tuple(params.shape) != (PARAM_ROWS, b)
                                   or not bool(((params[0] >= 1) & (params[0] <= KMAX)).all())):
            raise MinferError(f"decode_pick: params must be int32 [{PARAM_ROWS}, {b}] with top_k in 1..{KMAX}")
        with torch.inference_mode():
            if self.use_graphs and b <= BUCKETS[-1]:
                g = self._graph(b, params is not None)
                return g.pick_to_host(g.launch(batch, self.pad_slot, after, params), b)
            inputs = self._device_inputs(batch)
            if after is not None:
                inputs["tokens"] = after.picked[:b]
            spans = [(s.offset, s.slot, s.start, s.n_tokens) for s in batch.spans]
            logits = self.plan.run(_State(inputs, True, b, spans))
            if params is not None:
                return PickedStep(b, self._sample(x=logits, params=params.to(self.device)))
            return PickedStep(b, self._pick(x=logits))

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

    def trace_graph(self) -> list[dict]:
        nodes = self.plan.trace_nodes(_Describe())
        for n in nodes:
            picks = self.choices.get(n["id"])
            if picks:
                n["contract"] = {kind: self._kernel_name(n["id"], kind) for kind in picks}
        return nodes

    def plan_rows(self, rows: int = 1, prefill: bool = False) -> list[dict]:
        """Per node with a kernel: what it runs for a step of `rows` rows (a decode batch, or a
        prompt chunk when `prefill`) and the cost the picker predicts for it, in ns. A decode
        row's SwiGLU / RoPE computed in its matmul's epilogue (gemv_swiglu, gemv_rope) is no row."""
        out = []
        for node in self.graph.nodes:
            call = self.calls.get(node.id)
            if call is None:
                continue
            kind = "chunk" if prefill else ("row" if rows == 1 else "batch")
            chosen = self.choices[node.id][kind].kernel
            fused = kind == "row" and node.id in self.fused_calls
            if kind == "row" and node.id in self.absorbed:  # no kernel of its own: its matmul's epilogue
                continue
            if fused:
                call = self.fused_calls[node.id]
            if kind == "row" and node.id in self.parts:  # a mixed fused weight: one kernel per type run
                cost = sum(c.cost_ns for _, c in self.parts[node.id])
                chosen = self.parts[node.id][0][1].kernel
            else:
                ok, _ = candidates(call.op, call.dtypes, call.shapes(rows), call.params, "CUDA",
                                   layouts=call.layouts(rows), registry=self.registry)
                cost = next((c.cost_ns for c in ok if c.kernel is chosen), ok[0].cost_ns if ok else float("nan"))
            names = [self._kernel_name(node.id, kind)]
            if node.id in self.extra and not fused:
                xcall, xc = self.extra[node.id]
                xok, _ = candidates(xcall.op, xcall.dtypes, xcall.shapes(rows), {**xcall.params, "n_rows": rows},
                                    "CUDA", registry=self.registry)
                cost += xok[0].cost_ns if xok else 0.0
                names.append(xc.kernel.name)
            out.append({"id": node.id, "name": node.name, "op": str(node.op), "layer": node.layer,
                        "kernel": "+".join(names), "cost_ns": cost,
                        "measured": self.registry.measured_overhead_ns(chosen) is not None})
        return out


def _reads_quantized(k: BoundKernel) -> bool:
    """Whether a matmul kernel reads the weight in its quantized form (not a dense copy)."""
    return not any(layout.__name__ == "f16_weight" for layout in k.load_layouts.values())
