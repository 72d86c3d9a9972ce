"""The qwen3 family (Qwen3 dense): the qwen2 graph without q/k/v biases, with a per-head RMSNorm
of q and k before RoPE (`attn_q_norm`, `attn_k_norm`, one weight of head_dim values shared by the
heads), NEOX RoPE (YaRN when `rope.scaling.type = yarn`), head size from
`attention.key_length` (Qwen3-0.6B: 128 with n_embd / n_head = 64). llama.cpp's llm_build_qwen3.
"""

from __future__ import annotations

from ..errors import MetadataError
from ..gguf.reader import GGUFReader
from .llama import LlamaArgs, build_graph
from .llama import check_args as llama_check_args

__all__ = ["from_gguf", "check_args", "build_graph"]


def from_gguf(r: GGUFReader) -> LlamaArgs:
    return LlamaArgs.from_gguf(r, rope_style="neox", qk_norm=True)


def check_args(a: LlamaArgs, r: GGUFReader) -> None:
    """llama's checks, and llama.cpp's qwen3 rule that RoPE turns the whole head (n_rot = head_dim)."""
    llama_check_args(a, r)
    if a.n_rot != a.head_dim:
        raise MetadataError(f"{a.arch}.rope.dimension_count", f"must equal key_length {a.head_dim} for qwen3, "
                            f"found {a.n_rot}")
