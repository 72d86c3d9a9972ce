"""The vulkan backend: the graph on any GPU wgpu reaches (Vulkan, Metal; lavapipe without a GPU),
every node's WGSL kernel chosen through the contracts.

Device `vulkan` takes a Vulkan adapter, `gpu` whatever adapter wgpu finds (Metal on macOS);
MINFER_WGPU_ADAPTER picks one by name (`minfer devices` lists them). `load` uploads each weight's
GGUF bytes once (a fused weight's parts stacked into one buffer) and compiles the graph into the
shared plan (plan.py): for every node the picker (contracts/picker.py) chooses the Vulkan-backend
kernel that accepts its op, dtypes, shapes and layouts, for a decode row (m = 1: the GEMVs) and a
prompt chunk (m > 1: the tiled matmuls). This file never names a kernel; a node nothing accepts is
a NoKernelError at load naming the op, the dtypes and the shape. A residual add and the RMSNorm
after it (calls.add_norm_pairs, cuda's rule) run as one `AddRMSNorm` call where a contract takes it.

`allocate` makes the KV cache (f32, one device buffer per layer for keys and one for values, so
a layer's cache is one binding whatever the model's size) and the RoPE tables on the device.
`forward` uploads the step's token ids, positions, slots and output rows, records every node's
dispatches into one compute pass (wgpu_device.py) and reads back only the logits rows asked for;
`decode_pick` reads back only the picked tokens (argmax on the device; sampling rows are drawn
on the host from their logits by the Sample op's torch code). A decode step of B rows is captured
once (the dispatches recorded with their buffers and params) and replayed every step after: the
host writes positions and slots, the tokens come from the step before on the device, and no
Python runs per kernel (MINFER_NO_CUDA_GRAPH=1 records every step again). Every row is computed independently
of the others (the tiled matmul accumulates a row exactly as the GEMV does), so a sequence's
numbers do not depend on the batch.
"""

from __future__ import annotations

import torch

from ..config import EngineConfig
from ..contracts.registry import BoundKernel, Registry, default_registry
from ..errors import MinferError, ModelError, UnsupportedError
from ..gguf.reader import GGUFReader
from ..graph.ir import Graph, Node, Op, WeightRef
from ..kernels import wgsl_ops
from ..kernels.sample import KMAX, PARAM_ROWS, sample_rows
from ..kernels.wgpu_device import Device, VkTensor
from ..quant.reference import dequantize
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
from .kv_cache import kv_bytes
from .plan import Plan, Step

BACKEND = "Vulkan"  # the contracts' backend name
KINDS = {"row": 1, "chunk": 64}  # ways of running -> the row count kernels are picked for
PLAN_CTX = 1024  # the context attention costs are predicted for
MAX_REPLAY_ROWS = 64  # decode steps of up to this many rows are captured once and replayed
KV_DTYPES = ("auto", "f32")


class _State:
    __slots__ = ("inputs", "kind", "rows")

    def __init__(self, inputs: dict[str, VkTensor], rows: int):
        self.inputs, self.rows = inputs, rows
        self.kind = "row" if rows == 1 else "chunk"


class _Describe:
    kind = "row"


class PickedStep:
    """A launched decode step (`WGPUBackend.decode_pick`): its picked tokens on the device (or,
    for sampled rows, on the host)."""

    __slots__ = ("rows", "picked", "host")

    def __init__(self, rows: int, picked: VkTensor | None, host: list[int] | None = None):
        self.rows, self.picked, self.host = rows, picked, host

    def tokens(self) -> list[int]:
        """The picked token of every row, in row order (waits for the step)."""
        if self.host is None:  # read before the deferred next step is submitted: no wait for it
            self.host = self.picked.dev.download(self.picked, now=True)[:self.rows].tolist()
        return self.host


class _Replay:
    """The decode step of `rows` rows, captured once (wgpu_device.Device.capture) and replayed:
    the host writes the step's positions and slots (and tokens, unless they come on the device
    from the step before), and the recorded dispatches are submitted as they are. The picked
    tokens are copied out to one of two staging buffers, so the step after may run before the
    host reads them (the engine keeps at most one step in flight). A launched step is encoded at
    once and submitted at the next device call; reading the step before's tokens submits it right
    after their read, so the host encodes step N+1 while the device runs step N, and the read of
    N's tokens does not wait for N+1 (a read waits for everything submitted before it)."""

    def __init__(self, be: WGPUBackend, rows: int):
        dev = self.dev = be.dev
        self.rows = rows
        self.io = {n: dev.empty((rows,), "I32") for n in ("tokens", "positions", "row_slots", "out_rows")}
        dev.write(self.io["out_rows"], torch.arange(rows, dtype=torch.int32))

        def step():
            logits = be.plan.run(_State(self.io, rows))
            return logits, be._pick(x=logits)

        self.rec, (self.logits, self.picked) = dev.capture(step)
        self.stages = [dev.empty((rows,), "I32") for _ in range(2)]
        self.turn = 0

    def launch(self, batch: Batch, after: PickedStep | None = None) -> PickedStep:
        dev, io = self.dev, self.io
        dev.write(io["positions"], batch.positions.to(torch.int32))
        dev.write(io["row_slots"], batch.row_slots.to(torch.int32))
        before = ()
        if after is None or after.picked is None:
            toks = batch.tokens if after is None else torch.tensor(after.host, dtype=torch.int32)
            dev.write(io["tokens"], toks.to(torch.int32))
        else:
            before = ((after.picked, io["tokens"]),)  # device to device: the host never saw them
        stage = self.stages[self.turn]
        self.turn ^= 1
        dev.replay(self.rec, before, ((self.picked, stage),), defer=True)
        return PickedStep(self.rows, stage)


class WGPUBackend:
    prefill_seqs = 4  # prompts per step: a row's numbers do not depend on the rest of the batch
    kv_itemsize = 4

    def __init__(self, config: EngineConfig | None = None, registry: Registry | None = None, comm=None):
        self.config = config or EngineConfig(device="vulkan")
        if comm is not None:
            raise UnsupportedError("vulkan backend: tensor parallelism is not supported (use cuda)")
        if self.config.kv_dtype not in KV_DTYPES:
            raise UnsupportedError(f"vulkan backend: KV cache dtype {self.config.kv_dtype!r} is not supported "
                                   f"(supported: {', '.join(KV_DTYPES)})")
        self.name = self.config.device
        self.registry = registry or default_registry()
        self.dev = Device("gpu" if self.config.device == "gpu" else "vulkan")
        self.graph: Graph | None = None
        self.plan: Plan | None = None
        self.cache: tuple[list[VkTensor], list[VkTensor]] | None = None
        self.choices: dict[int, dict[str, BoundKernel | str]] = {}  # node id -> way of running -> kernel (name)
        self._reader: GGUFReader | None = None
        self._bytes: dict[str, VkTensor] = {}  # weight name -> its GGUF bytes on the device
        self._vectors: dict[str, VkTensor] = {}
        self._ropes: dict[tuple, tuple[VkTensor, VkTensor]] = {}
        self.n_slots = self.n_ctx = 0
        self.use_replay = self.config.cuda_graph  # MINFER_NO_CUDA_GRAPH=1: decode steps recorded every time
        self._replays: dict[int, _Replay] = {}  # decode rows -> the captured step
        self._q8: tuple[int, set[int]] = (0, set())  # (activation passes, nodes writing int8 records)
        self._fused_norms: dict[int, int] = {}  # add node id -> the RMSNorm it runs fused with (calls.add_norm_pairs)

    # ------------------------------------------------------------------ load
    def load(self, graph: Graph, reader: GGUFReader, progress: bool = True) -> None:
        """Pick every node's kernels and upload the weights (once)."""
        require_base_features(graph, self.name)
        self.graph, self._reader = graph, reader
        self._q8 = self._q8_feeds(graph)
        self._fused_norms = add_norm_pairs(graph)
        self.plan = Plan(graph, self._compile, progress=progress, sync=self.dev.sync)
        n_vocab = graph.meta["n_vocab"]
        self._pick = self._choose(graph.nodes[-1], Call("Argmax", {"x": "F32"}, lambda r: {"x": (r, n_vocab)}, {}),
                                  1)
        self.dev.flush()

    def _q8_feeds(self, graph: Graph) -> tuple[int, set[int]]:
        """(activation passes, ids of the RMSNorm / SwiGLU / Attention nodes whose output a qmv8
        matmul reads): those write x's int8 records beside their output, so the GEMV has no
        quantize dispatch of its own (wgsl_ops.GEMV's kernel qmv8; MINFER_VK_Q8=0: none)."""
        passes = wgsl_ops.q8_passes()
        if not passes:
            return 0, set()
        producers = {n.id: n for n in graph.nodes if n.op in (Op.RMS_NORM, Op.SWIGLU, Op.ATTENTION)}
        feeds = set()
        for node in graph.nodes:
            if node.op == Op.MATMUL and node.inputs[0] in producers and any(
                    qtype in wgsl_ops.QMV8_TYPES for _, qtype, _, _ in self._type_runs(node.weights["w"])):
                feeds.add(node.inputs[0])
        return passes, feeds

    def _host_bytes(self, name: str) -> torch.Tensor:
        info = self._reader.tensors[name]
        rows = info.torch_shape[0] if len(info.shape) > 1 else 1
        return torch.from_numpy(self._reader.tensor_bytes(name)).view(rows, -1)

    def _matrix(self, w: WeightRef) -> VkTensor:
        """W's GGUF bytes on the device [n, row_bytes], a fused weight's parts stacked (uploaded once)."""
        if w.name not in self._bytes:
            parts = [self._host_bytes(t.name) for t in w.tensors]
            self._bytes[w.name] = self.dev.upload(parts[0] if len(parts) == 1 else torch.cat(parts))
        return self._bytes[w.name]

    def _matmul_weight(self, w: WeightRef, qtype: GGMLType, k: int) -> VkTensor:
        """A matmul's weight on the device: its GGUF bytes, or for Q4_0 under the qmv4 / qmv8 GEMVs
        and Q4_1 under qmv8 (wgsl_ops.GEMV) the planes they read, repacked once here (the raw bytes
        kept only where another node, a tied embedding's gather, uploaded them too)."""
        kernel = wgsl_ops.GEMV["kernel"]
        if not ((qtype == GGMLType.Q4_0 and kernel in ("qmv4", "qmv8"))
                or (qtype in wgsl_ops.QMV8_TYPES and kernel == "qmv8")):
            return self._matrix(w)
        key = w.name + "#planes"
        if key not in self._bytes:
            shared = w.name in self._bytes
            raw = self._matrix(w)
            self._bytes[key] = wgsl_ops.planes(raw, raw.shape[0], k, qtype)
            if not shared:
                del self._bytes[w.name]
        return self._bytes[key]

    def _vector(self, name: str) -> VkTensor:
        if name not in self._vectors:
            info = self._reader.tensors[name]
            host = torch.from_numpy(self._reader.tensor_bytes(name))
            self._vectors[name] = self.dev.upload(dequantize(host, info.ggml_type, (info.shape[0],)).float())
        return self._vectors[name]

    def _choose(self, node: Node, call: Call, rows: int) -> BoundKernel:
        return admissible(call, rows, BACKEND, self.registry, "vulkan", node)[0].kernel

    def _picks(self, node: Node, call: Call) -> dict[str, BoundKernel]:
        picks = {kind: self._choose(node, call, rows) for kind, rows in KINDS.items()}
        self.choices[node.id] = picks
        return picks

    # ------------------------------------------------------------------ compile
    def _compile(self, node: Node) -> Step:
        op, ins, p = node.op, node.inputs, node.params
        if op == Op.INPUT:
            name = node.name
            return Step(lambda vals, st: st.inputs[name], "input")
        if op == Op.SLICE:
            (i,), a, b = ins, p["start"], p["stop"]
            return Step(lambda vals, st: vals[i].cols(a, b), "view")
        handler = {Op.GET_ROWS: self._compile_get_rows, Op.RMS_NORM: self._compile_norm,
                   Op.MATMUL: self._compile_matmul, Op.ADD: self._compile_add, Op.SWIGLU: self._compile_swiglu,
                   Op.ROPE: self._compile_rope, Op.ATTENTION: self._compile_attention}.get(op)
        if handler is None:
            raise UnsupportedError(f"vulkan backend: op {op} (node {node.name!r}) is not implemented")
        fn, run = handler(node)
        return Step(fn, lambda st, r=run: _name(r[st.kind]))

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
        run = self._picks(node, Call("GetRows", {"weight_u8": quant_info(info.ggml_type).contract_name, "ids": "I32"},
                                     lambda r: {"weight_u8": table_shape, "ids": (r,)}, params))
        table = self._matrix(w)
        return (lambda vals, st: run[st.kind](weight_u8=table, ids=vals[i], **params)), run

    def _compile_norm(self, node: Node):
        add_id = fused_by(self._fused_norms, node)
        if add_id is not None:  # the add before it computed it (_compile_add)
            self.choices[node.id] = self.choices[add_id]
            return (lambda vals, st: vals[node.id]), self.choices[add_id]
        d, eps = node.shape[-1], node.params["eps"]
        run = self._picks(node, Call("RMSNorm", {"x": "F32", "w": "F32"}, lambda r: {"x": (r, d), "w": (d,)},
                                     {"eps": eps}, {"x": STRIDED}))
        w = self._vector(node.weights["w"].name)
        (i,) = node.inputs
        passes, feeds = self._q8
        if node.id in feeds:  # a qmv8 matmul reads it: x's int8 records too (wgsl_ops.rms_norm q8)
            return (lambda vals, st: run[st.kind](x=vals[i], w=w, eps=eps, q8=passes)), run
        return (lambda vals, st: run[st.kind](x=vals[i], w=w, eps=eps)), run

    def _compile_add(self, node: Node):
        d = node.shape[-1]
        i, j = node.inputs
        pair = fused_norm(self._fused_norms, node, self.graph, BACKEND, self.registry)
        if pair is not None:  # one dispatch: h = x + y into a fresh buffer (the add's value), the norm stashed
            norm, call = pair
            norm_id, eps = norm.id, norm.params["eps"]
            run = self._picks(node, call)
            w = self._vector(norm.weights["w"].name)
            passes, feeds = self._q8
            q8 = {"q8": passes} if norm_id in feeds else {}  # a qmv8 matmul reads the norm: its int8 records too

            def fused(vals, st):
                x = vals[i]
                h = self.dev.empty(x.shape)  # not over x: wgsl_ops.add_rms_norm says why
                vals[norm_id] = run[st.kind](x=x, y=vals[j], w=w, eps=eps, sum_out=h, **q8)
                return h

            return fused, run
        run = self._picks(node, Call("Add", {"x": "F32", "y": "F32"}, lambda r: {"x": (r, d), "y": (r, d)}, {}))
        return (lambda vals, st: run[st.kind](x=vals[i], y=vals[j])), run

    def _compile_swiglu(self, node: Node):
        i, j = node.inputs
        d = node.shape[-1]
        run = self._picks(node, Call("SwiGLU", {"gate": "F32", "up": "F32"}, lambda r: {"gate": (r, d), "up": (r, d)},
                                     {}, {"gate": STRIDED, "up": STRIDED}))
        passes, feeds = self._q8
        if node.id in feeds:
            return (lambda vals, st: run[st.kind](gate=vals[i], up=vals[j], q8=passes)), run
        return (lambda vals, st: run[st.kind](gate=vals[i], up=vals[j])), run

    def _type_runs(self, w: WeightRef) -> list[tuple[WeightRef, GGMLType, int, int]]:
        """calls.type_runs over this file's storage types."""
        return type_runs(w, lambda name: self._reader.tensors[name].ggml_type)

    def _compile_matmul(self, node: Node):
        w = node.weights["w"]
        k, n = w.shape
        parts, names = [], []
        for ref, qtype, a, b in self._type_runs(w):
            call = Call("QMatMul", {"x": "F32", "w": quant_info(qtype).contract_name},
                        lambda m, cols=b - a: {"x": (m, k), "w": (cols, k)}, {"n": b - a, "k": k, "qtype": qtype},
                        {"x": STRIDED})
            run = {kind: self._choose(node, call, rows) for kind, rows in KINDS.items()}
            parts.append((run, self._matmul_weight(ref, qtype, k), a, b, qtype))
            names.append(run)
        picks = {kind: "+".join(r[kind].name for r in names) for kind in KINDS}
        self.choices[node.id] = picks
        add_bias = bias = None
        if "b" in node.weights:
            add_bias = self._choose(node, Call("AddBias", {"y": "F32", "b": "F32"},
                                               lambda m: {"y": (m, n), "b": (n,)}, {"n_rows": 1}), 1)
            bias = self.dev.upload(torch.cat([self._vector(t.name).cpu() for t in node.weights["b"].tensors]))
            self.choices[node.id] = {kind: f"{name}+{add_bias.name}" for kind, name in picks.items()}
        (i,) = node.inputs

        def fn(vals, st):
            x = vals[i]
            if len(parts) == 1:
                run, wt, _, _, qtype = parts[0]
                y = run[st.kind](x=x, w=wt, n=n, k=k, qtype=qtype)
            else:  # one kernel per run of one type, each writing its columns of the one output
                y = self.dev.empty((x.shape[0], n))
                for run, wt, a, b, qtype in parts:
                    run[st.kind](x=x, w=wt, n=b - a, k=k, qtype=qtype, out=y.cols(a, b))
            if bias is not None:
                add_bias(y=y, b=bias, n_rows=y.shape[0])
            return y

        return fn, self.choices[node.id]

    def _compile_rope(self, node: Node):
        return compile_rope(node, self._picks, self._ropes)

    def _compile_attention(self, node: Node):
        p = node.params
        q_i, k_i, v_i, pos = node.inputs
        layer, nh, nkv, hd = p["kv_layer"], p["n_head"], p["n_head_kv"], p["head_dim"]
        params = {"n_head": nh, "n_head_kv": nkv, "head_dim": hd, "scale": p["scale"]}
        dtypes = {"q": "F32", "k": "F32", "v": "F32", "cache_k": "F32", "cache_v": "F32", "row_slots": "I32",
                  "positions": "I32"}
        cache = (1, 2, nkv, PLAN_CTX, hd)

        def shapes(rows):
            return {"q": (rows, nh * hd), "k": (rows, nkv * hd), "v": (rows, nkv * hd), "cache_k": cache,
                    "cache_v": cache, "row_slots": (rows,), "positions": (rows,)}

        run = self._picks(node, Call("Attention", dtypes, shapes, {**params, "layer": 0},
                                     {"q": STRIDED, "k": STRIDED, "v": STRIDED}))

        passes, feeds = self._q8
        q8 = {"q8": passes} if node.id in feeds else {}  # a qmv8 o projection reads it: x's int8 records too

        def fn(vals, st):  # the layer's own cache buffers: layer 0 of a one-layer [1, slots, ...] tensor
            ks, vs = self.cache
            return run[st.kind](q=vals[q_i], k=vals[k_i], v=vals[v_i], cache_k=ks[layer], cache_v=vs[layer],
                                row_slots=st.inputs["row_slots"], positions=vals[pos], layer=0, **params, **q8)

        return fn, run

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
        self._replays.clear()
        shape = (1, n_slots, m["n_head_kv"], n_ctx, m["head_dim"])
        self.cache = ([self.dev.empty(shape) for _ in range(m["n_layer"])],
                      [self.dev.empty(shape) for _ in range(m["n_layer"])])
        self.n_slots, self.n_ctx = n_slots, n_ctx
        self._ropes.clear()
        for node in self.graph.nodes:
            if node.op == Op.ROPE:
                key = rope_key(node)
                p, ff = node.params, node.weights.get("freq_factors")
                factors = self._vector(ff.name).cpu() if ff else None
                cos, sin = cpu_ops.rope_table(n_ctx, p["n_rot"], p["base"], p["freq_scale"], factors)
                self._ropes[key] = (self.dev.upload(cos), self.dev.upload(sin))

    # ------------------------------------------------------------------ run
    def _inputs(self, batch: Batch, tokens: VkTensor | None = None) -> dict[str, VkTensor]:
        up = {name: self.dev.upload(getattr(batch, name).to(torch.int32)) for name in ("positions", "row_slots",
                                                                                      "out_rows")}
        up["tokens"] = tokens if tokens is not None else self.dev.upload(batch.tokens.to(torch.int32))
        return up

    def _logits(self, batch: Batch, tokens: VkTensor | None = None, recorder=None) -> VkTensor:
        if self.cache is None:
            raise ModelError("vulkan backend: allocate() the KV cache before running a step")
        batch.check(self.n_slots, self.n_ctx)
        return self.plan.run(_State(self._inputs(batch, tokens), batch.n_tokens), recorder)

    def _replay(self, batch: Batch, recorder=None) -> _Replay | None:
        """The captured step for this batch, when it is a decode step returning rows 0..B-1 in order
        (what the engine's decode steps are) and nothing traces it; None: run the plan eagerly."""
        b = batch.n_tokens
        if not self.use_replay or recorder is not None or batch.kind != "decode" or b > MAX_REPLAY_ROWS:
            return None
        if batch.out_rows.tolist() != list(range(b)):
            return None
        if self.cache is None:
            raise ModelError("vulkan backend: allocate() the KV cache before running a step")
        batch.check(self.n_slots, self.n_ctx)
        if b not in self._replays:
            self._replays[b] = _Replay(self, b)
        return self._replays[b]

    def forward(self, batch: Batch, recorder=None) -> torch.Tensor:
        """float32 logits [R, n_vocab] (on the host) of the batch's out_rows."""
        rep = self._replay(batch, recorder)
        if rep is not None:
            rep.launch(batch)
            return rep.logits.cpu()
        return self._logits(batch, recorder=recorder).cpu()

    def decode_pick(self, batch: Batch, after: PickedStep | None = None,
                    params: torch.Tensor | None = None) -> PickedStep:
        """Launch a decode step whose tokens are picked on the device (argmax), or with `params`
        (int32 [7, B], kernels.sample.pack_params) drawn on the host from the rows' logits under
        the same sampling chain; only the picked tokens are read back. `after`: the step before,
        whose picked tokens are this step's inputs (on the device: the host never saw them)."""
        b = batch.n_tokens
        if batch.kind != "decode" or batch.out_rows.tolist() != list(range(b)):
            raise MinferError("decode_pick: the batch must be decode rows only, returning rows 0..B-1 in order")
        if after is not None and after.rows != b:
            raise MinferError(f"decode_pick: the step before had {after.rows} rows, this one {b}")
        rep = self._replay(batch) if params is None else None
        if rep is not None:
            return rep.launch(batch, after)
        tokens = None
        if after is not None:
            tokens = after.picked if after.host is None else self.dev.upload(torch.tensor(after.host,
                                                                                          dtype=torch.int32))
        logits = self._logits(batch, tokens)
        if params is None:
            return PickedStep(b, self._pick(x=logits))
        if params.dtype != torch.int32 or tuple(params.shape) != (PARAM_ROWS, b) or not bool(
                ((params[0] >= 1) & (params[0] <= KMAX)).all()):
            raise MinferError(f"decode_pick: params must be int32 [{PARAM_ROWS}, {b}] with top_k in 1..{KMAX}")
        return PickedStep(b, None, sample_rows(x=logits.cpu(), params=params.cpu()).tolist())

    def warmup(self) -> None:
        """Compile now what the first requests would otherwise wait for: the pipelines of a prompt
        chunk, and the captured decode step of every row count the slots can fill. Writes only
        into the free cache (nothing is cached yet)."""
        if self.cache is None:
            raise ModelError("vulkan backend: allocate() the KV cache before warming up")
        self.forward(Batch.single([0] * min(17, self.n_ctx), 0, slot=0))
        for b in range(1, min(self.n_slots, MAX_REPLAY_ROWS) + 1):
            self.decode_pick(Batch.build([(s, 0, [0]) for s in range(b)], list(range(b)), n_decode=b)).tokens()

    def trace_graph(self) -> list[dict]:
        return self.plan.trace_nodes(_Describe())

    def plan_rows(self, rows: int = 1, prefill: bool = False) -> list[dict]:
        """Per node with a kernel: what it runs for a step of `rows` rows."""
        kind = "row" if rows == 1 and not prefill else "chunk"
        return [{"id": n.id, "name": n.name, "op": str(n.op), "layer": n.layer,
                 "kernel": _name(self.choices[n.id][kind])} for n in self.graph.nodes if n.id in self.choices]


def _name(k: BoundKernel | str) -> str:
    """A kernel's name; a matmul of several kernels (one per weight type, a bias add) joins them with '+'."""
    return k if isinstance(k, str) else k.name
