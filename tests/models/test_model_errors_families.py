"""Hostile metadata in qwen3 / gemma / phi3 files: a typed error naming the key, before anything is
built (models/*.py check_args, models/rope_scaling.py), never a crash or a silently wrong model."""

from __future__ import annotations

import pytest

from minfer.api import load
from minfer.errors import MetadataError, ModelError, UnsupportedError
from minfer.gguf.reader import ValueType

F32, I32, STR, ARR, BOOL = ValueType.FLOAT32, ValueType.INT32, ValueType.STRING, ValueType.ARRAY, ValueType.BOOL

CASES = [
    ("tiny-gemma3", {"gemma3.attention.sliding_window": (I32, -5)}, MetadataError, "sliding_window"),
    ("tiny-gemma3", {"gemma3.attention.sliding_window": 1 << 31}, MetadataError, "sliding_window"),
    ("tiny-gemma3", {"gemma3.attention.sliding_window_pattern": (ARR, (BOOL, [True, False, True]))},
     MetadataError, "sliding_window_pattern.*2 flags"),
    ("tiny-gemma3", {"gemma3.attention.sliding_window_pattern": (I32, -1)}, MetadataError, "sliding_window_pattern"),
    ("tiny-gemma3", {"gemma3.rope.freq_base_swa": (F32, float("nan"))}, MetadataError, "freq_base_swa"),
    ("tiny-gemma3", {"gemma3.block_count": 3}, MetadataError, "block_count"),
    ("tiny-gemma2", {"gemma2.final_logit_softcapping": float("nan")}, MetadataError, "final_logit_softcapping"),
    ("tiny-gemma2", {"gemma2.attn_logit_softcapping": 0.0}, MetadataError, "softcapping"),
    ("tiny-qwen3", {"qwen3.rope.scaling.type": "dynamic"}, UnsupportedError,
     "'dynamic'.*supported: none, linear, yarn"),
    ("tiny-qwen3", {"qwen3.rope.scaling.factor": 1e9}, MetadataError, "rope.scaling.factor"),
    ("tiny-qwen3", {"qwen3.rope.scaling.original_context_length": 0}, MetadataError, "original_context_length"),
    ("tiny-qwen3", {"qwen3.attention.key_length": 96, "qwen3.attention.value_length": 96}, MetadataError,
     "head_count"),
    ("tiny-qwen3", {"qwen3.rope.scaling.type": "longrope"}, UnsupportedError, "phi3 only"),
    ("tiny-phi3", {"phi3.attention.head_count_kv": 2}, MetadataError, "attn_qkv"),
    ("tiny-phi3", {"phi3.feed_forward_length": 256}, MetadataError, "ffn_up"),
    ("tiny-phi3", {"phi3.rope.scaling.attn_factor": float("inf")}, MetadataError, "attn_factor"),
]


@pytest.mark.parametrize("preset,meta,error,match", CASES, ids=[f"{c[0]}:{next(iter(c[1]))}" for c in CASES])
def test_bad_metadata_is_a_typed_error(tiny_gguf, rewrite_gguf, tmp_path, preset, meta, error, match):
    path = rewrite_gguf(tiny_gguf(preset), tmp_path / "bad.gguf", meta=meta)
    with pytest.raises(error, match=match):
        load(path, progress=False)


def test_missing_gemma_post_norm_is_named(tiny_gguf, rewrite_gguf, tmp_path):
    path = rewrite_gguf(tiny_gguf("tiny-gemma3"), tmp_path / "m.gguf", drop=("blk.1.post_ffw_norm.weight",))
    with pytest.raises(ModelError, match=r"'blk\.1\.post_ffw_norm\.weight' is missing.*blk\.N\.attn_q_norm"):
        load(path, progress=False)


def test_phi3_needs_both_longrope_factors(tiny_gguf, rewrite_gguf, tmp_path):
    path = rewrite_gguf(tiny_gguf("tiny-phi3"), tmp_path / "f.gguf", drop=("rope_factors_short.weight",))
    with pytest.raises(MetadataError, match="rope_factors_long.weight and rope_factors_short.weight"):
        load(path, progress=False)
