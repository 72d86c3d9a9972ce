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
    RMS_NORM = "RMSNorm"  # out = x / sqrt(mean(x^2) + eps) * w
    MATMUL = "MatMul"  # out = x @ w^T (+ b): w is [out, in] in memory, GGUF shape [in, out]
    ADD = "Add"  # out = a + b
    ROPE = "RoPE"  # rotary position embedding of [T, n_heads * head_dim] at positions
    ATTENTION = "Attention"  # write k, v into the layer's KV cache, causal GQA attention of q
    SWIGLU = "SwiGLU"  # out = silu(gate) * up
    SLICE = "Slice"  # out = x[..., start:stop] (a view: splits a fused MatMul's output)
    PICK = "Pick"  # out = value `index` of a fused node that returns several (params: index)
    # fused ops (graph/fuse.py): one node standing for several, with those nodes as its `parts`
    ADD_RMS_NORM = "AddRMSNorm"  # (h, RMSNorm(h)) with h = a + b: the residual add and the norm after it
    MATMUL_SWIGLU = "QMatMulSwiGLU"  # SwiGLU of the two halves of a stacked gate+up MatMul
    MATMUL_ROPE = "QMatMulRoPE"  # (RoPE of the first columns of y, y), y = a stacked q+k+v MatMul (+ bias)
    # tensor parallelism (parallel/, one graph per rank): run by the plan through a communicator
    ALL_REDUCE = "AllReduce"  # out = the sum of x over the ranks (float32)
    ALL_GATHER = "AllGather"  # out = the ranks' x side by side in the last dim (float32)
    LOCAL_IDS = "LocalIds"  # ids in [lo, hi) -> id - lo, others -> 0 (this rank's rows of a table)
    MASK_ROWS = "MaskRows"  # out[i] = x[i] where lo <= ids[i] < hi, else 0


PARALLEL_OPS = frozenset({Op.ALL_REDUCE, Op.ALL_GATHER, Op.LOCAL_IDS, Op.MASK_ROWS})
FUSED_OPS = frozenset({Op.ADD_RMS_NORM, Op.MATMUL_SWIGLU, Op.MATMUL_ROPE})


@dataclass(frozen=True)
class WeightRef:
    """A weight tensor a node reads: its GGUF name and the shape the model needs (GGUF order).

    A fused weight (graph/fuse.py) has `parts`: the real tensors whose rows it stacks, in
    order; its name is only a label and its shape is (in, sum of the parts' out)."""

    name: str
    shape: tuple[int, ...]
    parts: tuple[WeightRef, ...] = ()

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
        """How many values the node returns (a fused node with several exports: a tuple)."""
        return max(1, len(self.exports))


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
