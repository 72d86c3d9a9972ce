"""Bad input gives typed errors with clear messages: wrong files, too-long prompts, bad templates."""

from __future__ import annotations

import pytest

from minfer.api import load
from minfer.errors import (
    ContextOverflowError,
    DeviceError,
    MinferError,
    ModelError,
    ParamError,
    TemplateError,
    UnsupportedError,
)


def test_unknown_architecture_names_it_and_lists_supported(tiny_gguf, rewrite_gguf, tmp_path):
    path = rewrite_gguf(tiny_gguf(), tmp_path / "a.gguf", meta={"general.architecture": "mamba"})
    supported = "gemma2, gemma3, gpt-oss, llama, phi3, qwen2, qwen3, qwen3moe"
    with pytest.raises(UnsupportedError, match=rf"'mamba'.*supported: {supported}"):
        load(path, progress=False)


def test_missing_tensor_is_named(tiny_gguf, rewrite_gguf, tmp_path):
    path = rewrite_gguf(tiny_gguf(), tmp_path / "m.gguf", drop=("blk.1.ffn_up.weight",))
    with pytest.raises(ModelError, match=r"'blk\.1\.ffn_up\.weight' is missing.*blk\.N\.ffn_up\.weight"):
        load(path, progress=False)


def test_missing_qwen2_bias_is_named(tiny_gguf, rewrite_gguf, tmp_path):
    path = rewrite_gguf(tiny_gguf("tiny-qwen2"), tmp_path / "b.gguf", drop=("blk.0.attn_k.bias",))
    with pytest.raises(ModelError, match=r"'blk\.0\.attn_k\.bias' is missing"):
        load(path, progress=False)


def test_misshaped_tensor_is_named(tiny_gguf, rewrite_gguf, tmp_path):
    # ffn_up is [256, 512]; declare it [512, 256] (same bytes): the graph expects [256, 512]
    path = rewrite_gguf(tiny_gguf(), tmp_path / "s.gguf", shapes={"blk.0.ffn_up.weight": (512, 256)})
    with pytest.raises(ModelError, match=r"'blk\.0\.ffn_up\.weight' has shape \[512, 256\].*"
                                         r"expect \[256, 512\]"):
        load(path, progress=False)


def test_inconsistent_head_metadata(tiny_gguf, rewrite_gguf, tmp_path):
    path = rewrite_gguf(tiny_gguf(), tmp_path / "h.gguf", meta={"llama.attention.head_count_kv": 3})
    with pytest.raises(MinferError, match="head_count_kv"):
        load(path, progress=False)


@pytest.fixture(scope="module")
def tiny_model(tiny_gguf):
    with load(tiny_gguf(), n_ctx=32, progress=False) as m:
        yield m


def test_prompt_longer_than_context(tiny_model):
    ids = tiny_model.tokenize("the " * 40)
    assert len(ids) > 32
    with pytest.raises(ContextOverflowError, match="context"):
        tiny_model.generate("the " * 40, max_tokens=4)
    with pytest.raises(ContextOverflowError):
        tiny_model.generate("the " * 40, max_tokens=4, stream=True)  # raised before the first piece
    with pytest.raises(ContextOverflowError):
        tiny_model.logits(ids)


def test_token_ids_outside_the_vocabulary(tiny_model):
    with pytest.raises(MinferError, match="outside the vocabulary"):
        tiny_model.logits([1, tiny_model.n_vocab])


def test_hostile_template_surfaces_template_error(tiny_gguf, rewrite_gguf, tmp_path):
    hostile = "{{ ().__class__.__base__.__subclasses__() }}"
    path = rewrite_gguf(tiny_gguf(), tmp_path / "t.gguf", meta={"tokenizer.chat_template": hostile})
    with load(path, progress=False) as m:
        with pytest.raises(TemplateError):
            m.generate([{"role": "user", "content": "hi"}], max_tokens=2)


def test_cuda_without_a_gpu_is_a_device_error(tiny_gguf):
    """Without a GPU (and without the Triton interpreter, which the tests run under) --device cuda
    is a typed error at load; an unknown device too."""
    import os
    import subprocess
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the error case cannot happen here")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = f"from minfer.cli import main; main(['run', '-m', {str(tiny_gguf())!r}, '--device', 'cuda', 'hi'])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "device 'cuda' requested but no CUDA GPU is visible" in proc.stderr, proc.stderr[-2000:]
    with pytest.raises(DeviceError, match="unknown device 'tpu'; available: cpu, cuda"):
        load(tiny_gguf(), device="tpu", progress=False)


def test_context_too_large_for_memory_is_refused(tiny_gguf):
    want = r"a KV cache of 1024 x 1048576 tokens needs 2048\.00 GiB of memory; this machine has [0-9.]+ GiB available"
    with pytest.raises(MinferError, match=want):
        load(tiny_gguf(), n_ctx=2**20, n_slots=1024, progress=False)
    with pytest.raises(ParamError, match=r"n_ctx must be >= 1 and <= 1048576, got 1000000000000"):
        load(tiny_gguf(), n_ctx=10**12, progress=False)


def _value(kind: str, v):
    from minfer.gguf.reader import ValueType

    return (getattr(ValueType, kind), v)


@pytest.mark.parametrize("key, value, why", [
    ("llama.block_count", 2_591_894_889, r"block_count.*must be in 1\.\.1024, found 2591894889"),
    ("llama.block_count", 3, r"says 3 layers, the file holds blk\.0\.\.blk\.1"),
    ("llama.block_count", 1, r"says 1 layers, the file holds blk\.0\.\.blk\.1"),
    ("llama.context_length", _value("UINT64", 2**34), r"context_length.*must be in 1\.\.1073741824"),
    ("llama.context_length", 0, r"context_length.*must be in 1\.\."),
    ("llama.embedding_length", 252, r"embedding_length.*is 252, token_embd\.weight has shape \[256, "),
    ("llama.feed_forward_length", _value("UINT64", 1 << 40), r"feed_forward_length.*must be in 1\.\."),
    ("llama.attention.head_count", 100_000, r"head_count.*must be in 1\.\.4096"),
    ("llama.rope.dimension_count", 63, r"rope\.dimension_count.*must be even"),
    ("llama.rope.dimension_count", 1 << 20, r"rope\.dimension_count.*must be in 2\.\.64"),
    ("llama.rope.freq_base", _value("FLOAT32", float("nan")), r"rope\.freq_base.*not a sane value"),
    ("llama.rope.freq_base", _value("FLOAT32", -5.0), r"rope\.freq_base.*not a sane value"),
    ("llama.attention.layer_norm_rms_epsilon", _value("FLOAT32", float("inf")), r"epsilon.*not a sane value"),
])
def test_hyperparameters_are_checked_against_the_tensors_before_anything_is_built(
        tiny_gguf, rewrite_gguf, tmp_path, key, value, why):
    """A file whose metadata asks for a billion layers (the 32 KB mutant that built a graph for 74 s
    and died with MemoryError) or an absurd context is refused with a MetadataError naming the key,
    before a graph is built or a byte allocated (the bound is loose: CI machines are shared)."""
    import time

    from minfer.errors import MetadataError

    path = rewrite_gguf(tiny_gguf(), tmp_path / "hp.gguf", meta={key: value})
    t0 = time.perf_counter()
    with pytest.raises(MetadataError, match=why):
        load(path, progress=False)
    assert time.perf_counter() - t0 < 10.0


def test_a_huge_training_context_does_not_size_the_allocations(tiny_gguf, rewrite_gguf, tmp_path):
    """context_length 2^24 (2-layer model): tables and cache follow the context asked for (or the
    4096 default), not the file's training context."""
    path = rewrite_gguf(tiny_gguf(), tmp_path / "ctx.gguf", meta={"llama.context_length": 1 << 24})
    with load(path, progress=False) as m:
        assert m.args.n_ctx_train == 1 << 24 and m.n_ctx == 4096
        assert all(t.shape[0] == 4096 for pair in m.engine.backend._ropes.values() for t in
                   (pair if isinstance(pair, tuple) else (pair,)))
        assert m.engine.backend.cache.n_ctx == 4096
    with load(path, n_ctx=64, progress=False) as m:
        assert m.n_ctx == 64 and m.engine.backend.cache.k.shape[3] == 64
