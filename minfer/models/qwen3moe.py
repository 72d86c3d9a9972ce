"""The qwen3moe family (Qwen3-30B-A3B, Qwen3-235B-A22B), as llama.cpp runs it (src/models/qwen3moe.cpp):
qwen3's attention (per-head q/k RMSNorm before NEOX RoPE, no biases, head size from
`attention.key_length`) and, in every layer, a mixture-of-experts FFN with no shared expert
(models/moe.py): softmax gating over `expert_count` experts (128), the `expert_used_count` (8)
largest chosen and their weights normalised (Qwen3's norm_topk_prob), experts
`expert_feed_forward_length` wide (768; llama.cpp's default when the key is absent:
feed_forward_length / expert_used_count).
"""

from __future__ import annotations

from ..gguf.reader import GGUFReader
from .llama import LlamaArgs, build_graph
from .qwen3 import check_args  # qwen3's checks (llama's, RoPE over the whole head) and the experts' (moe.py)

__all__ = ["from_gguf", "check_args", "build_graph"]

QWEN3MOE = {"n_ff": lambda n_ff, n_used: n_ff // n_used, "norm": True, "gating": "softmax", "required": True}


def from_gguf(r: GGUFReader) -> LlamaArgs:
    return LlamaArgs.from_gguf(r, moe=QWEN3MOE, rope_style="neox", qk_norm=True)
