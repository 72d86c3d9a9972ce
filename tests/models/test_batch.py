"""Many sequences at once on SmolLM2: every request's output is the one it gets alone (batch
invariance), for greedy and for seeded sampling; `minfer batch` on a JSONL file."""

from __future__ import annotations

import json

import pytest

from minfer.api import load
from minfer.cli import main

TOPICS = ["the sea", "a cat", "mountains", "rain", "a city at night", "bread", "the moon", "a river"]
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "1, 2, 3, 4,",
           "The three primary colors are red, blue and", "In 1969, Neil Armstrong",
           "Water boils at a temperature of", "Here is a list of fruits: apple, banana,"] + [
    [{"role": "user", "content": f"Write {'a very short' if i % 2 else 'a'} poem about {t}." + " Please." * i}]
    for i, t in enumerate(TOPICS)]


@pytest.fixture(scope="module")
def model16(smollm2_path):
    with load(smollm2_path, n_ctx=512, n_slots=16, progress=False) as m:
        yield m


def _alone(m, prompt, **kw):
    (r,) = m.generate_batch([prompt], **kw)
    return r


TOP = 20  # logprobs of the sampled token and the 20 most likely: the logits rows, compared bit for bit


def _run(m, prompts, params):
    """Run the prompts together; (result, the logprobs of every step) per prompt."""
    from minfer.api import result_of

    seqs = [m.submit(p, sp) for p, sp in zip(prompts, params, strict=True)]
    for s in seqs:
        s.logprobs_n = TOP
    m.run(seqs)
    return [(result_of(s), s.logprobs) for s in seqs]


@pytest.mark.parametrize("kind", ["greedy", "seeded"])
def test_sixteen_prompts_together_equal_each_alone(model16, kind):
    """Tokens, text and every step's logits (the log-softmax of the sampled token and the top 20, a
    function of the whole row) of each request are bit for bit those it gets alone: on the cpu
    backend every row is computed on its own (docs/ARCHITECTURE.md, batch invariance)."""
    from minfer.engine.params import SamplingParams

    kw = dict(max_tokens=20, temperature=0) if kind == "greedy" else dict(max_tokens=20, temperature=0.8)
    params = [SamplingParams(**(dict(kw, seed=100 + i) if kind == "seeded" else kw)) for i in range(len(PROMPTS))]
    alone = [_run(model16, [p], [sp])[0] for p, sp in zip(PROMPTS, params, strict=True)]
    assert len({len(model16.prompt_ids(p)) for p in PROMPTS}) >= 12  # prompts of different lengths
    batch = _run(model16, PROMPTS, params)
    for i, ((a, lp_a), (b, lp_b)) in enumerate(zip(alone, batch, strict=True)):
        assert b.token_ids == a.token_ids, (i, PROMPTS[i])
        assert b.text == a.text and b.finish_reason == a.finish_reason
        assert len(lp_a) == len(a.token_ids) and all(len(top) == TOP for _, top in lp_a)
        assert lp_b == lp_a, (i, next(j for j, (x, y) in enumerate(zip(lp_a, lp_b, strict=True)) if x != y))
    if kind == "greedy":  # the single-sequence generate() is the same path
        assert model16.generate(PROMPTS[0], **kw) == alone[0][0].text


def test_batch_command_writes_results_in_order_and_errors_in_place(smollm2_path, tmp_path, capsys):
    lines = [json.dumps({"prompt": "The capital of France is", "id": "a", "max_tokens": 5}),
             "{not json",
             json.dumps({"messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 4}),
             json.dumps({"prompt": "x", "temperature": -1}),
             json.dumps({"prompt": "1, 2, 3,", "max_token": 3}),
             "",
             json.dumps({"prompt": "Once upon a time", "seed": 3, "temperature": 0.9, "max_tokens": 6})]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(lines) + "\n")
    rc = main(["batch", "-m", str(smollm2_path), "-np", "3", "--temp", "0", str(src), str(dst)])
    assert rc == 0
    out = [json.loads(x) for x in dst.read_text().splitlines()]
    assert [r["index"] for r in out] == list(range(7))
    ok = {r["index"]: r for r in out if "error" not in r}
    assert sorted(ok) == [0, 2, 6]
    assert ok[0]["id"] == "a" and ok[0]["text"].startswith(" Paris") and ok[0]["completion_tokens"] == 5
    assert ok[0]["finish_reason"] == "length" and ok[6]["completion_tokens"] == 6
    err = {r["index"]: r["error"]["message"] for r in out if "error" in r}
    assert "not valid JSON" in err[1] and "temperature must be >= 0" in err[3]
    assert "unknown field 'max_token'" in err[4] and "empty line" in err[5]
    assert "7 requests (4 errors)" in capsys.readouterr().err
    with load(smollm2_path, n_ctx=512, progress=False) as m:  # the command's greedy result is generate()'s
        assert m.generate("The capital of France is", max_tokens=5, temperature=0) == ok[0]["text"]


@pytest.mark.parametrize("with_prefill", [False, True])
def test_decode_logits_are_bit_identical_alone_and_batched(model16, raw, with_prefill):
    """The logits of 8 decode rows in one step equal each row's logits computed alone, bit for bit;
    also when the step carries a prompt chunk of another sequence (a mixed step)."""
    import torch

    from minfer.backends.base import Batch

    eng = model16.engine
    prompts = [model16.prompt_ids(p) for p in PROMPTS[:8]]
    for slot, ids in enumerate(prompts):
        raw.prefill(eng, slot, ids[:-1], rows=[0])  # cache all but the last token
    spans = [(slot, len(ids) - 1, [ids[-1]]) for slot, ids in enumerate(prompts)]
    rows = list(range(8))
    if with_prefill:
        spans.append((9, 0, prompts[9 % 8] * 3))
        rows.append(8 + len(prompts[1]) * 3 - 1)
    together = eng.backend.forward(Batch.build(spans, rows, n_decode=8))
    for slot, ids in enumerate(prompts):
        alone = raw.decode(eng, slot, ids[-1], len(ids) - 1)
        assert torch.equal(alone, together[slot]), slot
    if with_prefill:
        assert torch.equal(together[8], raw.prefill(eng, 10, prompts[1] * 3)[-1])


def test_a_prompt_split_anywhere_gives_the_bits_of_it_whole(model16, raw):
    """A prompt's rows computed in two chunks (a reused first part, then the rest) equal the rows of one
    chunk, bit for bit, wherever the split falls: what a slot's cached tokens or the prefix cache leave to
    compute gets a fresh run's numbers. (Prompt attention as one causal SDPA over the chunk rounded each
    row by the chunk's shape, 1e-7, which the next matmul's int8 activations made logits ~0.5 apart.)"""
    import torch

    eng = model16.engine
    ids = model16.prompt_ids(PROMPTS[8]) + model16.tokenize(" The capital of France is Paris.", add_special=False)
    whole = raw.prefill(eng, 0, ids)
    for slot, cut in enumerate((1, 4, 17, 32, 33, len(ids) - 1), start=1):
        raw.prefill(eng, slot, ids[:cut], rows=[0])
        rest = raw.prefill(eng, slot, ids[cut:], start=cut)
        assert torch.equal(rest, whole[cut:]), (cut, float((rest - whole[cut:]).abs().max()))
    model16.reset()  # (the slots' caches were written behind the scheduler's back)


def test_a_prompt_continuing_a_slot_gives_the_text_and_logprobs_of_a_fresh_run(model16):
    """The leak test_api's streaming test met on a near-tie: Model.logits(ids) leaves a slot holding the
    prompt, and the next request with that prompt runs only its last token there. Its logprobs (the
    logits rows, bit for bit) and text are those of the same request run from scratch."""
    from minfer.engine.params import SamplingParams

    prompt = "The capital of France is"
    ids = model16.prompt_ids(prompt)
    params = SamplingParams(max_tokens=12, temperature=0)
    model16.reset()
    fresh = model16.engine.add(ids, params, reuse_prefix=False)
    fresh.logprobs_n = TOP
    model16.run([fresh])
    model16.reset()
    model16.logits(ids)
    again = model16.submit(prompt, params)
    again.logprobs_n = TOP
    model16.run([again])
    assert again.stats.cached_tokens == len(ids) - 1  # (it did continue the slot)
    assert again.generated == fresh.generated and again.logprobs == fresh.logprobs
