"""Embeddings in the engine (engine/pooling.py, Backend.hidden): the pooled vector is the
normalised mean (or first / last row) of the final hidden states a plain run computes, long texts
pool across chunks, and an embedding that arrives while sequences generate changes neither."""

from __future__ import annotations

import torch

from minfer.api import load
from minfer.backends.base import Batch
from minfer.engine.params import SamplingParams


def _hidden(model, ids: list[int]) -> torch.Tensor:
    """Every row's final hidden state of one fresh run of `ids` in slot 0 (the reference)."""
    batch = Batch.build([(0, 0, ids)], list(range(len(ids))), n_decode=0)
    return model.engine.backend.hidden(batch)


def test_pooling_and_interleaving(tiny_gguf):
    with load(tiny_gguf("tiny-llama", "f32"), n_ctx=128, n_slots=3, prefill_chunk=16, progress=False) as m:
        ids = [5 + (7 * i) % 300 for i in range(40)]  # three prompt chunks
        rows = _hidden(m, ids)
        m.reset()
        for pooling, want in (("mean", rows.mean(0)), ("cls", rows[0]), ("last", rows[-1])):
            got = torch.tensor(m.embed([ids], pooling=pooling)[0])
            assert torch.allclose(got, want / want.norm(), atol=1e-5), pooling
        alone = m.embed([ids], pooling="mean")[0]
        text_alone = m.generate("Once upon a time", temperature=0, max_tokens=12)
        gen = m.engine.add(m.tokenize("Once upon a time"), SamplingParams(temperature=0, max_tokens=12))
        m.engine.step()
        m.engine.step()  # generating when the embedding arrives
        emb = m.engine.add(ids, pooling="mean")
        m.run([gen, emb])
        assert emb.embedding() == alone and gen.finish_reason == "length"
        assert m.detokenize(gen.generated) == text_alone
