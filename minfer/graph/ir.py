"""The graph IR: a model's forward pass as a flat, topologically ordered list of nodes.

A model file builds one Graph per loaded model (models/*.py through GraphBuilder); a backend
executes it for every step. Node ops are generic (the same node runs on cpu through torch and
on cuda through a kernel picked by contract), so nothing here names a kernel or a device.

Shapes are symbolic in the token dimension: `TOKENS` ("T") is the number of tokens in the step
(all sequences of the batch, concatenated token-major), `ROWS` ("R") the number of rows that
produce logits. Everything else is a concrete int fixed by the model. Batching is therefore the
token dimension plus the step's sequence spans (backends/base.py `Batch`), as in vLLM-style
continuous batching: decode of B sequences is a step with T = B.

Weights are referenced by GGUF tensor name with the shape the model expects, in GGUF order
(ne0 = the contiguous input dimension), so a backend can check and prepare them at load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

TOKENS = "T"
ROWS = "R"

Dim = int | str


class Op(StrEnum):
    """Node operations. Contract op kinds use the same spelling where they overlap."""

    INPUT = "Input"  # a per-step input: token ids, positions, output-row indices
    GET_ROWS = "GetRows"  # out[i] = table[ids[i]]; table is a weight ("w") or inputs[0]
    RMS_NORM = "RMSNorm"  # out = x / sqrt(mean(x^2) + eps) * w, over each run of `group` values (below)
    MATMUL = "MatMul"  # out = x @ w^T (+ b): w is [out, in] in memory, GGUF shape [in, out]
    ADD = "Add"  # out = a + b
    ROPE = "RoPE"  # rotary position embedding of [T, n_heads * head_dim] at positions
    ATTENTION = "Attention"  # write k, v into the layer's KV cache, causal GQA attention of q
    SWIGLU = "SwiGLU"  # out = silu(gate) * up
    SWIGLU_OAI = "SwiGLUOAI"  # gpt-oss's clamped SwiGLU (ggml's swiglu_oai; params alpha, limit: below)
    GEGLU = "GeGLU"  # out = gelu_tanh(gate) * up, gelu_tanh(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    SCALE = "Scale"  # out = x * scale (gemma's embedding scale sqrt(n_embd))
    SOFTCAP = "SoftCap"  # out = cap * tanh(x / cap) (gemma2's final-logit soft-capping)
    SLICE = "Slice"  # out = x[..., start:stop] (a view: splits a fused MatMul's output)
    PICK = "Pick"  # out = value `index` of a node that returns several (params: index)
    # mixture of experts (models/moe.py builds the FFN from these; ids stay on the device)
    MOE_ROUTE = "MoERoute"  # (weights [T, k] F32, ids [T, k] I32) of router logits [T, E]: gating, top-k (below)
    MOE_MATMUL = "MoEMatMul"  # out[t, j] = x[t] (or x[t, j]) @ w[ids[t, j]]^T (+ b[ids[t, j]]): chosen experts only
    MOE_SUM = "MoESum"  # out[t] = sum over j = 0..k-1, in that order, of weights[t, j] * y[t, j]
    # fused ops (graph/fuse.py): one node standing for several, with those nodes as its `parts`
    ADD_RMS_NORM = "AddRMSNorm"  # (h, RMSNorm(h)) with h = a + b: the residual add and the norm after it
    NORM_ADD_RMS_NORM = "NormAddRMSNorm"  # (h, RMSNorm(h)) with h = a + RMSNorm(b): gemma's post-norm too
    MATMUL_SWIGLU = "QMatMulSwiGLU"  # SwiGLU of the two halves of a stacked gate+up MatMul
    MATMUL_GEGLU = "QMatMulGeGLU"  # GeGLU of the two halves of a stacked gate+up MatMul (gemma)
    MATMUL_ROPE = "QMatMulRoPE"  # (RoPE of the first columns of y, y), y = a stacked q+k+v MatMul (+ bias)
    MATMUL_ADD_NORM = "QMatMulAddNorm"  # AddRMSNorm(a, MatMul(x, w)) with the rms deferred to the matmuls after it
    NORM_ROPE = "NormRoPE"  # (RoPE(RMSNorm per head of q), RoPE(RMSNorm per head of k)): qwen3's / gemma3's q, k
    MOE_MATMUL_GLU = "MoEMatMulGLU"  # glu(gate, up) of an expert layer's gate and up MoEMatMuls (params glu, ...)
    # tensor parallelism (parallel/, one graph per rank): run by the plan through a communicator
    ALL_REDUCE = "AllReduce"  # out = the sum of x over the ranks (float32)
    ALL_GATHER = "AllGather"  # out = the ranks' x side by side in the last dim (float32)
    LOCAL_IDS = "LocalIds"  # ids in [lo, hi) -> id - lo, others -> 0 (this rank's rows of a table)
    MASK_ROWS = "MaskRows"  # out[i] = x[i] where lo <= ids[i] < hi, else 0


PARALLEL_OPS = frozenset({Op.ALL_REDUCE, Op.ALL_GATHER, Op.LOCAL_IDS, Op.MASK_ROWS})
FUSED_OPS = frozenset({Op.ADD_RMS_NORM, Op.NORM_ADD_RMS_NORM, Op.MATMUL_SWIGLU, Op.MATMUL_GEGLU, Op.MATMUL_ROPE,
                       Op.NORM_ROPE, Op.MOE_MATMUL_GLU, Op.MATMUL_ADD_NORM})

# Params beyond each op's base set (qwen3, gemma, phi3). A model sets them only where they differ
# from the base behaviour, so a llama / qwen2 graph carries none of them. The RoPE ones live in the
# cos / sin tables (backends/rope.py), so RoPE kernels never see them; the GPU bindings pass the
# others to kernels whose contracts declare them (backends/bindings.py, contracts/ops.py).
#
# RMSNorm  group: int       normalise each run of `group` consecutive values on its own (the
#                           per-head q / k norms of qwen3 and gemma3: group = head_dim, weight
#                           (group,) shared by every head); absent: the whole row.
# RoPE     attn_factor: float   cos and sin multiplied by it (YaRN's and LongRoPE's magnitude
#                           scaling; YaRN's 1 + 0.1 ln(1 / freq_scale) is already folded in).
#          yarn: (ext_factor, n_ctx_orig, beta_fast, beta_slow)   YaRN's frequency mix: pair i turns
#                           at theta_interp (1 - r_i) + theta_extrap r_i, with theta_extrap the
#                           unscaled angle, theta_interp = freq_scale theta_extrap and r_i =
#                           ext_factor * ramp(i) (ggml's rope_yarn_ramp over the correction dims
#                           of beta_fast / beta_slow at n_ctx_orig).
#          n_ctx_orig: int  + weight "freq_factors_long": LongRoPE (phi3). The "freq_factors"
#                           weight is the short factors; the long ones divide the frequencies
#                           instead when the context allocated exceeds n_ctx_orig.
# Attention window: int     sliding window: query at position p sees keys at p - window < k <= p
#                           (llama.cpp's LLAMA_SWA_TYPE_STANDARD); absent: every earlier key.
#           softcap: float  scores s = scale q.k become softcap * tanh(s / softcap) before the softmax.
#           weight "sinks" [n_head]: attention sinks (gpt-oss, ggml_soft_max_add_sinks): head h's learned
#                           logit sinks[h] joins the softmax's denominator and nothing else: p_j =
#                           exp(s_j - m) / (sum_i exp(s_i - m) + exp(sinks[h] - m)), m = max(max_i s_i, sinks[h]).
# SwiGLUOAI alpha: float, limit: float   g = min(gate, limit), u = clamp(up, -limit, limit),
#                           out = g * sigmoid(alpha * g) * (u + 1)   (gpt-oss: alpha 1.702, limit 7).
# (Attention's `scale` is a base param: 1/sqrt(head_dim) by default, the model's own where it differs.)
#
# Mixture of experts (llama.cpp's build_moe_ffn), E experts of which k run per token:
# MoERoute n_used: int       k
#          gating: str       "softmax" (probs = softmax(logits)), "sigmoid" (probs = sigmoid(logits)) or
#                            "softmax_weight" (probs = logits; the k chosen weights softmaxed: gpt-oss)
#          norm: bool        the k weights divided by their sum (clamped below at 2^-14, as llama.cpp)
#          scale: float      the weights multiplied by it (1.0: not applied)
#          weight "b" [E]    optional selection bias (DeepSeek-V3's exp_probs_b): experts are chosen by
#                            probs + b, weighted by probs. The k chosen are the k largest, largest first,
#                            the lower expert index first among equal values.
#          Its value is a tuple: Pick index 0 the weights, 1 the ids.
# MoEMatMul weight "w" (K, N, E) in GGUF order: E matrices [N, K] (a 3-D ffn_*_exps tensor); optional "b"
#                            (N, E): each expert's bias (gpt-oss). x [T, K] feeds every chosen expert of its
#                            row (gate / up), x [T, k, K] feeds slot j to expert ids[t, j] (down).


@dataclass(frozen=True)
class WeightRef:
    """A weight tensor a node reads: its GGUF name and the shape the model needs (GGUF order).

    A fused weight (graph/fuse.py) has `parts`: the real tensors whose rows it stacks, in
    order; its name is only a label and its shape is (in, sum of the parts' out). A chunk of one
    tensor (a backend whose device binds fewer bytes than the tensor holds: backends/calls.py
    `type_runs`) has its one part and `rows` = (first, end) of the part's output rows it takes."""

    name: str
    shape: tuple[int, ...]
    parts: tuple[WeightRef, ...] = ()
    rows: tuple[int, int] | None = None

    @property
    def tensors(self) -> tuple[WeightRef, ...]:
        """The file tensors this weight reads."""
        return self.parts or (self,)


@dataclass(frozen=True)
class Node:
    """One operation. `inputs` are ids of earlier nodes; `weights` maps a role ("w", "b") to a weight.

    A fused node (op in FUSED_OPS, made by graph/fuse.py) also carries the nodes it stands for:
    `parts`, a small graph of its own whose ids are local: ids 0..len(inputs)-1 are the fused
    node's inputs, part j has id len(inputs) + j and reads lower local ids. `exports` are the
    local ids of the values it returns: one export is its value, several a tuple that Pick nodes
    read. A backend runs a fused node as one kernel where a contract accepts it, and its parts
    where none does (e.g. a decode row's fused GEMV epilogue, and the plain kernels for prompts)."""

    id: int
    name: str
    op: Op
    inputs: tuple[int, ...]
    shape: tuple[Dim, ...]
    dtype: str = "F32"
    layer: int | None = None
    weights: dict[str, WeightRef] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    parts: tuple[Node, ...] = ()
    exports: tuple[int, ...] = ()

    @property
    def n_values(self) -> int:
        """How many values the node returns (a fused node with several exports, or MoERoute: a tuple)."""
        return 2 if self.op == Op.MOE_ROUTE else max(1, len(self.exports))

    def renumbered(self, id: int, inputs: tuple[int, ...]) -> Node:
        """This node with another id and inputs: `dataclasses.replace(node, id=, inputs=)` without
        its per-call look at the fields (the graph passes renumber every node of a load)."""
        return Node(id, self.name, self.op, inputs, self.shape, self.dtype, self.layer, self.weights, self.params,
                    self.parts, self.exports)


@dataclass(frozen=True)
class Graph:
    """Nodes in execution order, the named step inputs, the logits node and every weight used."""

    nodes: tuple[Node, ...]
    inputs: dict[str, int]
    output: int
    weights: dict[str, WeightRef]
    meta: dict[str, Any] = field(default_factory=dict)

    def consumers_last_use(self) -> dict[int, int]:
        """For each node id, the id of the last node that reads it (itself if none does)."""
        last = {n.id: n.id for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                last[i] = n.id
        last[self.output] = len(self.nodes)  # the output outlives the step
        return last

    @property
    def logits_id(self) -> int:
        """The matmul that makes the logits: the output, or the node a final SoftCap reads."""
        out = self.nodes[self.output]
        return out.inputs[0] if out.op == Op.SOFTCAP else out.id

    @property
    def hidden_id(self) -> int:
        """The node the logits matmul reads: the final hidden state (after the output norm) of
        the rows asked for; what embeddings pool."""
        return self.nodes[self.logits_id].inputs[0]

    def trace_nodes(self, kernels: dict[int, str] | None = None) -> list[dict]:
        """Nodes as TraceRecorder.set_graph wants them. Symbolic dims become -1 ("per step");
        `shape_symbolic` keeps their names."""
        kernels = kernels or {}
        return [
            {
                "id": n.id,
                "name": n.name,
                "op": str(n.op),
                "inputs": list(n.inputs),
                "shape": [d if isinstance(d, int) else -1 for d in n.shape],
                "shape_symbolic": [str(d) for d in n.shape],
                "dtype": n.dtype,
                "layer": n.layer,
                "kernel": kernels.get(n.id),
                "weights": {role: [t.name for t in w.tensors] for role, w in n.weights.items()},
            }
            for n in self.nodes
        ]
