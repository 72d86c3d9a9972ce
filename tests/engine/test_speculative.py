"""Speculative decoding with prompt-lookup drafts (engine/draft.py; the scheduler's draft rows).

The engine tests run on `KVBackend` (test_prefix_cache.py): every row's logits depend on every
token its slot holds up to its position, so a draft row that read a stale position, a rejected
draft's keys left where the next step reads, or a miscounted cache position changes the tokens.
Every case compares the same requests with drafts off: the tokens, finish reasons, logprobs and
cached counts must be equal, and drafts must both be accepted and rejected (the comparison
would be empty otherwise). On the real SmolLM2 (cpu) the greedy and the seeded text are equal,
and most drafts of a copy task are kept."""

from __future__ import annotations

import pytest

from minfer.config import EngineConfig
from minfer.engine.draft import DraftBudget, NgramDrafter
from minfer.engine.engine import Engine
from minfer.engine.params import SamplingParams
from minfer.errors import MinferError, ParamError

from .test_prefix_cache import KVBackend
from .test_scheduler import GREEDY, PieceTokenizer, V


# ---------------------------------------------------------------------- the drafter
def test_the_longest_suffix_that_occurred_before_wins_and_its_latest_occurrence():
    d = NgramDrafter(n_max=3, n_min=1)
    #        0  1  2  3  4  5  6  7  8  9 10 11
    toks = [5, 6, 7, 8, 1, 6, 7, 9, 2, 5, 6, 7]
    # suffix (5, 6, 7) occurred at 0..2: what followed it there
    assert d.propose(toks, 3) == [8, 1, 6]
    toks += [4]  # suffix (7, 4): never before; (4): never; nothing
    assert d.propose(toks, 3) == []
    toks += [6, 7]  # (4, 6, 7) never, (6, 7) ended at 2, 6 and 11: the latest, 11, followed by 4, 6
    assert d.propose(toks, 2) == [4, 6]
    assert d.propose(toks, 0) == []


def test_a_proposal_may_run_up_to_the_last_token_and_no_further():
    d = NgramDrafter(n_max=2, n_min=1)
    toks = [3, 3, 3]  # (3, 3) ended at 1: what followed is [3] (the current last token), no more
    assert d.propose(toks, 5) == [3]
    assert NgramDrafter(n_max=2, n_min=2).propose([1, 2], 4) == []  # (a suffix needs an earlier occurrence)


def test_the_drafter_and_the_budget_refuse_bad_settings():
    with pytest.raises(MinferError):
        NgramDrafter(n_max=2, n_min=3)
    with pytest.raises(MinferError):
        DraftBudget(0)
    with pytest.raises(ParamError):
        EngineConfig(spec="medusa")
    with pytest.raises(ParamError):
        EngineConfig(spec="ngram", draft_max=0)
    with pytest.raises(ParamError):
        EngineConfig(spec="ngram", draft_ngram_min=4, draft_ngram_max=3)


def test_the_budget_doubles_after_a_full_acceptance_falls_after_a_partial_one_and_pauses_after_misses():
    b = DraftBudget(8)
    assert b.next == 8 and b.ready()
    b.update(8, 2)
    assert b.next == 3 and b.ready()
    b.update(3, 3)
    assert b.next == 6
    b.update(6, 6)
    assert b.next == 8
    b.update(0, 0)  # (nothing proposed: nothing learnt)
    assert b.next == 8 and b.ready()
    paused = []
    for _ in range(6):  # misses in a row: 1, 3, 7, 15, 31, 31 steps without a proposal
        b.update(b.next, 0)
        assert b.next == 1
        n = 0
        while not b.ready():
            n += 1
        paused.append(n)
    assert paused == [1, 3, 7, 15, 31, 31]
    b.update(1, 1)  # a kept draft ends the pauses
    assert b.next == 2 and b.misses == 0 and b.ready()
    b.update(2, 0)
    assert not b.ready() and b.ready()


# ---------------------------------------------------------------------- the engine
class Repeating(KVBackend):
    PULL = 3.0  # the successor wins most rows: text that repeats its prompt, with history-dependent turns


class Copying(KVBackend):
    PULL = 8.0  # the successor wins (almost) every row: a prompt-lookup draft of the cycle is kept


def make(spec: str, n_slots: int = 3, n_ctx: int = 96, backend=Repeating, **cfg) -> tuple[Engine, KVBackend]:
    be = backend()
    config = EngineConfig(n_slots=n_slots, n_ctx=n_ctx, prefill_chunk=8, prefix_block=4, spec=spec, **cfg)
    be.allocate(n_slots, n_ctx)
    return Engine(be, n_vocab=V, n_ctx=n_ctx, n_slots=n_slots, config=config, tokenizer=PieceTokenizer()), be


PROMPTS = [list(range(1, 25)) + list(range(1, 9)), list(range(10, 31)) + [1, 2, 3, 10, 11, 12],
           [5, 6, 7, 8, 9, 20, 21, 5, 6, 7]]
PARAMS = {
    "greedy": dict(GREEDY),
    "sampled": dict(temperature=1.0, seed=11),
    "penalized": dict(temperature=0.7, top_k=8, repeat_penalty=1.3, seed=5),
    "stop string": dict(GREEDY, stop=("w29 w30",)),  # (ends the first two early, inside a kept draft)
}


def run(spec: str, params: dict, max_tokens: int = 40, n_ctx: int = 96, logprobs: int | None = None):
    eng, be = make(spec, n_ctx=n_ctx)
    seqs = [eng.add(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True, **params)) for p in PROMPTS]
    for s in seqs:
        s.logprobs_n = logprobs
    eng.run(seqs)
    return seqs, be


@pytest.mark.parametrize("case", list(PARAMS))
def test_drafts_keep_exactly_the_tokens_of_decoding_one_by_one(case):
    off, _ = run("", PARAMS[case])
    on, be = run("ngram", PARAMS[case])
    for a, b in zip(off, on, strict=True):
        assert b.generated == a.generated and b.finish_reason == a.finish_reason
        assert b.n_cached == a.n_cached == len(a.tokens) - 1
    proposed = sum(s.stats.draft_tokens for s in on)
    accepted = sum(s.stats.draft_accepted for s in on)
    assert 0 < accepted < proposed, (accepted, proposed)  # (both paths taken: kept and refused drafts)
    drafted = [b for b in be.batches if b.n_decode > len({int(s) for s in b.row_slots[:b.n_decode]})]
    assert drafted, "no step carried draft rows"


def test_draft_rows_are_decode_rows_of_one_slot_at_consecutive_positions():
    _, be = run("ngram", PARAMS["greedy"])
    for b in be.batches:
        heads = b.spans[:b.n_decode]
        for prev, cur in zip(heads, heads[1:], strict=False):
            if cur.slot == prev.slot:
                assert cur.start == prev.start + 1 and cur.n_tokens == prev.n_tokens == 1


def test_drafts_take_fewer_steps_on_repeating_text():
    steps = {}
    for spec in ("", "ngram"):
        eng, be = make(spec, backend=Copying)
        seq = eng.add(list(range(1, 32)) + [1, 2], SamplingParams(max_tokens=60, ignore_eos=True, **GREEDY))
        eng.run([seq])
        steps[spec] = (len(be.batches), seq.generated)
    assert steps["ngram"][1] == steps[""][1]
    # measured 64 steps without drafts, 12 with (2026-12-03: 4 prompt chunks, then up to 9 tokens a step)
    assert steps["ngram"][0] <= steps[""][0] / 3, steps


def test_logprobs_are_those_of_the_rows_kept():
    off, _ = run("", PARAMS["sampled"], logprobs=3)
    on, _ = run("ngram", PARAMS["sampled"], logprobs=3)
    for a, b in zip(off, on, strict=True):
        assert len(b.logprobs) == len(b.generated) and b.logprobs == a.logprobs


@pytest.mark.parametrize("max_tokens, n_ctx", [(7, 96), (200, 48)])
def test_drafts_never_pass_max_tokens_or_the_context(max_tokens, n_ctx):
    off, _ = run("", PARAMS["greedy"], max_tokens=max_tokens, n_ctx=n_ctx)
    on, be = run("ngram", PARAMS["greedy"], max_tokens=max_tokens, n_ctx=n_ctx)
    for a, b in zip(off, on, strict=True):
        assert b.generated == a.generated and b.finish_reason == a.finish_reason == "length"
        assert len(b.generated) == max_tokens if max_tokens < 50 else len(b.tokens) == n_ctx
    for batch in be.batches:  # (Batch.check would refuse it in a real backend)
        assert all(s.end <= n_ctx for s in batch.spans)


def test_a_grammar_sequence_runs_without_drafts_beside_drafting_ones():
    eng, _ = make("ngram")
    a = eng.add(PROMPTS[0], SamplingParams(max_tokens=20, ignore_eos=True, **GREEDY))
    a.drafter = None  # (as the engine leaves a sequence with a grammar: its mask is one row's)
    b = eng.add(PROMPTS[0], SamplingParams(max_tokens=20, ignore_eos=True, **GREEDY))
    eng.run([a, b])
    assert a.stats.draft_tokens == 0 < b.stats.draft_tokens and a.generated == b.generated


# ---------------------------------------------------------------------- the real model
COPY = ("Alice went to the market on Saturday to buy apples, pears and oranges for the party. "
        "She met Bob, who was carrying a large basket of fresh bread from the bakery.")


# (spec, the message, the least share of greedy drafts kept). Measured 2026-12-03: prompt lookup on a copy
# keeps 31 of 32 greedy drafts (sampled at 0.8 the text rephrases: 13 of 25); SmolLM2 drafting for itself
# keeps 41 of 41 (its draft slots catch up on the tokens kept between proposals: a stale one keeps fewer)
SMOLLM2_CASES = [("ngram", "Repeat this text exactly, word for word:\n\n" + COPY, 0.8),
                 ("model", "Write a short poem about the sea.", 0.9)]


@pytest.mark.parametrize("spec, message, floor", SMOLLM2_CASES)
def test_smollm2_text_is_the_same_with_drafts_and_most_greedy_drafts_are_kept(smollm2_path, smollm2_model, spec,
                                                                              message, floor):
    from minfer.api import load

    msgs = [{"role": "user", "content": message}]
    draft = str(smollm2_path) if spec == "model" else None
    with load(smollm2_path, n_ctx=1024, spec=spec, draft_model=draft, progress=False) as m:
        kept = []
        for params in (SamplingParams(max_tokens=40, temperature=0),
                       SamplingParams(max_tokens=40, temperature=0.8, seed=7)):
            want = smollm2_model.submit(msgs, params)
            smollm2_model.run([want])
            got = m.submit(msgs, params)
            m.run([got])
            assert got.generated == want.generated
            kept.append((got.stats.draft_accepted, got.stats.draft_tokens))
    (g_kept, g_drafts), (_, s_drafts) = kept
    assert g_kept >= floor * g_drafts > 0 and s_drafts > 0, kept


# ---------------------------------------------------------------------- a draft model
def test_a_draft_model_with_other_tokens_is_refused_at_load(tiny_gguf):
    from minfer.api import load
    from minfer.errors import ModelError

    with pytest.raises(ModelError, match="draft model .*(token|tokenizer)"):
        load(tiny_gguf("tiny-llama", "f32"), n_ctx=64, spec="model", draft_model=str(tiny_gguf("tiny-gemma3", "f32")),
             progress=False)


def test_several_sequences_draft_from_one_draft_model_as_they_would_alone(tiny_gguf):
    """A q4_0 draft of a f32 tiny model (the same vocabulary): three sequences at once, drafts
    batched across them, the same tokens as without drafts."""
    from minfer.api import load

    target, draft = tiny_gguf("tiny-llama", "f32", decisive=True), tiny_gguf("tiny-llama", "q4_0", decisive=True)
    prompts = ["one two three one two three one two", "hello there", "the cat sat on the mat, the cat"]
    with load(target, n_ctx=128, n_slots=3, progress=False) as off:
        want = off.generate_batch(prompts, max_tokens=24, temperature=0, ignore_eos=True)
    with load(target, n_ctx=128, n_slots=3, spec="model", draft_model=str(draft), progress=False) as on:
        seqs = [on.submit(p, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)) for p in prompts]
        on.run(seqs)
    assert [s.generated for s in seqs] == [r.token_ids for r in want]
    assert sum(s.stats.draft_accepted for s in seqs) > 0


def test_overlapped_decode_runs_while_drafts_pause():
    """On a backend that picks tokens on the device (cuda), a step is queued before the one ahead
    of it is read only when no sequence would draft at it: text no suffix of which occurred before
    pauses the drafter (1, 3, 7, ... steps), and those steps overlap; the tokens are the plain
    loop's."""
    from .test_scheduler import OverlapBackend, ScriptedBackend

    out = []
    for backend, spec in ((ScriptedBackend(), ""), (OverlapBackend(), "ngram")):
        config = EngineConfig(n_slots=2, n_ctx=64, prefill_chunk=8, spec=spec)
        eng = Engine(backend, n_vocab=V, n_ctx=64, n_slots=2, config=config, tokenizer=PieceTokenizer())
        seqs = [eng.add(p, SamplingParams(max_tokens=24, ignore_eos=True, **GREEDY)) for p in ([3, 4], [9])]
        eng.run(seqs)
        out.append(([s.generated for s in seqs], backend))
    (plain, _), (spec_tokens, be) = out
    assert spec_tokens == plain
    assert be.ahead() >= 12, be.ahead()  # (measured 15, 2026-12-03; 0 if drafting sequences never overlapped)
