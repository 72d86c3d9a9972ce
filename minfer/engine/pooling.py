"""Embeddings: which prompt rows' final hidden states a sequence keeps, and how they pool.

An embedding request is a sequence that runs its whole prompt (no reused slot prefix) and
samples nothing; its steps return the final hidden state (after the output norm,
Backend.hidden) of the rows its pooling needs, and the pooled vector is L2-normalised:

  mean  the mean over every prompt row
  cls   the first row
  last  the last row (what a causal model's last token has seen: the whole text)

The file's `{arch}.pooling_type` (llama.cpp's: 1 mean, 2 cls, 3 last) chooses, else a flag or
the request; a model made for generation (no pooling type) pools by `mean` unless told.
"""

from __future__ import annotations

import torch

from ..errors import ParamError

POOLINGS = ("mean", "cls", "last")
FILE_POOLING = {1: "mean", 2: "cls", 3: "last"}  # llama.cpp's enum llama_pooling_type
DEFAULT_POOLING = "mean"


def default_pooling(metadata) -> str:
    """The file's pooling type (mean, cls, last), or DEFAULT_POOLING when it names none of them."""
    arch = metadata.get("general.architecture", "")
    return FILE_POOLING.get(metadata.get(f"{arch}.pooling_type"), DEFAULT_POOLING)


def check_pooling(pooling: str) -> str:
    if pooling not in POOLINGS:
        raise ParamError("pooling", f"must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    return pooling


def rows_of(n_prompt: int, pooling: str) -> range:
    """The prompt positions whose hidden states `pooling` reads."""
    return {"mean": range(n_prompt), "cls": range(1), "last": range(n_prompt - 1, n_prompt)}[pooling]


def pool(rows: torch.Tensor) -> torch.Tensor:
    """The L2-normalised mean of the kept rows [k, d] (one row for cls and last): float32 [d]."""
    v = rows.double().mean(0)
    return (v / v.norm().clamp_min(1e-12)).float()
