"""The qwen2 family (Qwen2, Qwen2.5): the llama graph with q/k/v biases and NEOX-style RoPE.

llama.cpp's converter does not permute qwen2's Q/K rows, so the rotation pairs are the two
halves of each head (i, i + n_rot/2), llama.cpp's NEOX mode. Everything else, including the
tied or separate output and the metadata keys (under `qwen2.`), is llama's.
"""

from __future__ import annotations

from ..gguf.reader import GGUFReader
from .llama import LlamaArgs, build_graph

__all__ = ["from_gguf", "build_graph"]


def from_gguf(r: GGUFReader) -> LlamaArgs:
    return LlamaArgs.from_gguf(r, qkv_bias=True, rope_style="neox")
