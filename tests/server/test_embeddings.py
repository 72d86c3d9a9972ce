"""/v1/embeddings through the official `openai` client against the real server (SmolLM2 on cpu),
and Model.embed: normalised vectors, equal alone and in a batch, base64 equal to floats, the
pooling choices."""

from __future__ import annotations

import base64
import struct

import httpx
import pytest
import torch

TEXTS = ["The cat sat on the mat.", "A kitten rested on a rug.", "Stock markets fell sharply today."]


def test_alone_equals_batched_and_normalised(client, model_id):
    batch = client.embeddings.create(model=model_id, input=TEXTS)
    assert [d.index for d in batch.data] == [0, 1, 2] and batch.model == model_id
    alone = [client.embeddings.create(model=model_id, input=t).data[0].embedding for t in TEXTS]
    assert [d.embedding for d in batch.data] == alone  # bit for bit: each text runs alone in its slot
    e = torch.tensor(alone)
    assert torch.allclose(e.norm(dim=1), torch.ones(3), atol=1e-5) and e.shape[1] == 576  # SmolLM2's n_embd
    sim = e @ e.T
    assert sim[0, 1] > sim[0, 2] and sim[0, 1] > sim[1, 2]  # the two cat sentences are the closest pair
    assert batch.usage.prompt_tokens == sum(
        client.embeddings.create(model=model_id, input=t).usage.prompt_tokens for t in TEXTS)


def test_base64_and_pooling(server, model_id):
    def ask(**kw):
        r = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS[0], **kw}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["data"][0]["embedding"]

    floats = ask()
    raw = base64.b64decode(ask(encoding_format="base64"))
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(floats, abs=0)
    last, cls = ask(pooling="last"), ask(pooling="cls")
    assert len({tuple(floats), tuple(last), tuple(cls)}) == 3


def test_model_embed_matches_the_server(client, model_id, smollm2_model):
    """The Python API pools the same hidden states (the server's model has the same weights; its
    slots are not the API's, which must not matter)."""
    api = smollm2_model.embed(TEXTS[:2])
    served = [d.embedding for d in client.embeddings.create(model=model_id, input=TEXTS[:2]).data]
    assert torch.allclose(torch.tensor(api), torch.tensor(served), atol=1e-6)
    assert smollm2_model.embed(TEXTS[1]) == [api[1]]
