"""The engine loop and the scheduler on a scripted backend (no model): batches, admission, chunked
prefill, prefix reuse, stops, aborts, and per-sequence sampling that ignores the rest of the batch.

The scripted backend's logits for a row depend only on that row's token and position: greedy
decoding follows `NEXT` (token t is followed by NEXT[t]), and a sampled draw sees a fixed random
distribution per (token, position). What the loop does is then checked exactly.
"""

from __future__ import annotations

import pytest
import torch

from minfer.backends.base import Backend, Batch
from minfer.config import EngineConfig
from minfer.engine.engine import Engine
from minfer.engine.params import SamplingParams
from minfer.errors import ContextOverflowError, MinferError
from minfer.kernels.sample import sample_rows

V = 32
EOS = 0
PIECES = ["<eos>"] + [f"w{i} " for i in range(1, V)]
NEXT = {t: (t + 1) % V or 1 for t in range(V)}  # greedy successor; EOS only where a test asks
GREEDY = dict(temperature=0)


class ScriptedBackend(Backend):
    """A backend whose logits are a fixed function of (token, position): the scheduler's
    choices are visible in the batches it was handed."""

    name = "scripted"
    kv_itemsize = 4
    prefill_seqs = 1

    def __init__(self, eos_after: int | None = None):
        self.batches: list[Batch] = []
        self.eos_after = eos_after  # token after which EOS is the greedy choice

    def kv_budget(self) -> int:
        return 1 << 30

    def load(self, graph, reader, progress=True) -> None:
        raise AssertionError("the scheduler tests build the engine directly")

    def allocate(self, n_slots: int, n_ctx: int) -> None:
        pass

    def trace_graph(self) -> list[dict]:
        return []

    def plan_rows(self, rows: int = 1, prefill: bool = False) -> list[dict]:
        return []

    def forward(self, batch: Batch, recorder=None) -> torch.Tensor:
        self.batches.append(batch)
        rows = batch.out_rows.tolist()
        out = torch.empty(len(rows), V)
        for i, r in enumerate(rows):
            t, p = int(batch.tokens[r]), int(batch.positions[r])
            g = torch.Generator().manual_seed(1000 * t + p)
            out[i] = torch.randn(V, generator=g)
            out[i, NEXT[t] if t != self.eos_after else EOS] += 8.0
        return out


class PieceTokenizer:
    eot_ids = frozenset({EOS})

    def decode(self, ids):
        return "".join(PIECES[i] for i in ids)

    def stream_decoder(self):
        class D:
            def feed(self, t):
                return PIECES[t] if t != EOS else ""

            def flush(self):
                return ""

        return D()


def make(n_slots=2, n_ctx=64, chunk=8, eos_after=None, **cfg) -> tuple[Engine, ScriptedBackend]:
    be = ScriptedBackend(eos_after)
    config = EngineConfig(n_slots=n_slots, n_ctx=n_ctx, prefill_chunk=chunk, **cfg)
    return Engine(be, n_vocab=V, n_ctx=n_ctx, n_slots=n_slots, config=config, tokenizer=PieceTokenizer()), be


def test_greedy_follows_the_logits_and_stops_at_max_tokens():
    eng, be = make()
    seq = eng.add([3, 4], SamplingParams(max_tokens=4, **GREEDY))
    eng.run([seq])
    assert seq.generated == [5, 6, 7, 8] and seq.finish_reason == "length"
    assert seq.take_text() == "w5 w6 w7 w8 "
    kinds = [b.kind for b in be.batches]
    assert kinds == ["prefill", "decode", "decode", "decode"]  # the last token is never fed
    assert [b.positions.tolist() for b in be.batches[1:]] == [[2], [3], [4]]


def test_eos_stops_and_is_not_rendered_but_ignore_eos_goes_on():
    eng, _ = make(eos_after=5)
    seq = eng.add([3, 4], SamplingParams(max_tokens=10, **GREEDY))
    eng.run([seq])
    assert seq.generated == [5, EOS] and seq.finish_reason == "stop" and seq.take_text() == "w5 "
    seq = eng.add([3, 4], SamplingParams(max_tokens=4, ignore_eos=True, **GREEDY))
    eng.run([seq])
    assert seq.generated == [5, EOS, 1, 2] and seq.finish_reason == "length"


def test_stop_string_ends_and_never_leaks_partially():
    eng, _ = make()
    seq = eng.add([3], SamplingParams(max_tokens=10, stop=("w6 w",), **GREEDY))
    pieces = []
    while not seq.finished:
        eng.step()
        pieces.append(seq.take_text())
    assert "".join(pieces) == "w4 w5 " and seq.finish_reason == "stop"
    assert all("w6" not in p for p in pieces)  # held back until the stop string could not complete


def test_context_end_is_length():
    eng, _ = make(n_ctx=6)
    seq = eng.add([3, 4, 5], SamplingParams(max_tokens=None, **GREEDY))
    eng.run([seq])
    assert len(seq.tokens) == 6 and seq.finish_reason == "length"
    with pytest.raises(ContextOverflowError, match="7 tokens but the context holds 6"):
        eng.add(list(range(1, 8)))


def test_a_prompt_that_fills_the_context_has_no_room_to_generate():
    """A generation whose prompt fills the context is refused as the server refuses it (was: one
    token sampled past the end, prompt + generated = n_ctx + 1); scoring it (max_tokens 0) runs."""
    eng, _ = make(n_ctx=6)
    for max_tokens in (None, 1, 4):
        with pytest.raises(ContextOverflowError, match="6 tokens and the context holds 6: no room to generate"):
            eng.add([1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=max_tokens, **GREEDY))
    seq = eng.add([1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=0), logit_rows=range(6))
    eng.run([seq])
    assert seq.finished and len(seq.tokens) == 6 and len(seq.generated) == 0
    seq = eng.add([1, 2, 3, 4, 5], SamplingParams(max_tokens=None, **GREEDY))
    eng.run([seq])
    assert len(seq.generated) == 1 and len(seq.tokens) == 6 and seq.finish_reason == "length"


def test_bad_prompts_are_typed_errors():
    eng, _ = make()
    with pytest.raises(MinferError, match="empty"):
        eng.add([])
    with pytest.raises(MinferError, match="outside the vocabulary"):
        eng.add([1, V])
    with pytest.raises(MinferError, match="not a contiguous range"):
        eng.add([1, 2, 3], logit_rows=range(2, 5))


def test_every_step_is_one_batch_of_all_decodes_and_one_prefill_chunk():
    eng, be = make(n_slots=3, chunk=4)
    a = eng.add([1, 2], SamplingParams(max_tokens=20, **GREEDY))
    b = eng.add([5, 6], SamplingParams(max_tokens=20, **GREEDY))
    eng.step()  # a's prompt
    eng.step()  # a decodes, b's prompt
    long = eng.add(list(range(1, 12)) + [3] * 3, SamplingParams(max_tokens=2, **GREEDY))  # 14 tokens: 4 chunks
    for _ in range(5):
        eng.step()
    shapes = [([s.n_tokens for s in x.spans], x.n_decode) for x in be.batches]
    assert shapes == [([2], 0), ([1, 2], 1), ([1, 1, 4], 2), ([1, 1, 4], 2), ([1, 1, 4], 2), ([1, 1, 2], 2),
                      ([1, 1, 1], 3)]
    assert a.slot != b.slot != long.slot and not long.prefilling and len(long.generated) == 2


def test_max_batch_tokens_bounds_the_chunk():
    eng, be = make(n_slots=2, chunk=8, max_batch_tokens=5)
    eng.add([1, 2], SamplingParams(max_tokens=10, **GREEDY))
    eng.step()
    eng.add(list(range(1, 11)), SamplingParams(max_tokens=1, **GREEDY))
    eng.step()
    assert [s.n_tokens for s in be.batches[-1].spans] == [1, 4]


def test_waiting_sequences_are_admitted_in_order_as_slots_free():
    eng, _ = make(n_slots=2)
    seqs = [eng.add([i + 1], SamplingParams(max_tokens=2 + i, **GREEDY)) for i in range(5)]
    order = []
    while any(not s.finished for s in seqs):
        eng.step()
        for s in seqs:
            if s.slot is not None and s not in order:
                order.append(s)
        assert eng.scheduler.slots_in_use <= 2
    assert order == seqs
    assert [len(s.generated) for s in seqs] == [2, 3, 4, 5, 6]


def test_a_new_prompt_goes_to_the_slot_it_continues():
    eng, be = make(n_slots=2)
    a = eng.add([1, 2, 3, 4, 5, 6], SamplingParams(max_tokens=2, **GREEDY))
    b = eng.add([9, 9, 9], SamplingParams(max_tokens=2, **GREEDY))
    eng.run([a, b])
    follow = eng.add([9, 9, 9, 10, 11, 12, 13], SamplingParams(max_tokens=1, **GREEDY))
    eng.run([follow])
    assert follow.slot == b.slot and follow.stats.cached_tokens == 4  # b's prompt + its first fed token
    last = be.batches[-1]
    assert last.spans[0].start == 4 and last.tokens.tolist() == [11, 12, 13]
    eng.reset()
    again = eng.add([9, 9, 9, 10, 11, 12, 13], SamplingParams(max_tokens=1, **GREEDY))
    eng.run([again])
    assert again.stats.cached_tokens == 0


def test_reuse_runs_at_least_the_last_prompt_token_and_can_be_refused():
    eng, be = make(n_slots=1)
    eng.run([eng.add([1, 2, 3], SamplingParams(max_tokens=3, **GREEDY))])  # caches 1 2 3 4 5
    same = eng.add([1, 2, 3, 4, 5], SamplingParams(max_tokens=1, **GREEDY))
    eng.run([same])
    assert same.stats.cached_tokens == 4 and be.batches[-1].tokens.tolist() == [5]
    fresh = eng.add([1, 2, 3, 4, 5], SamplingParams(max_tokens=1, **GREEDY), reuse_prefix=False)
    eng.run([fresh])
    assert fresh.stats.cached_tokens == 0 and be.batches[-1].tokens.tolist() == [1, 2, 3, 4, 5]
    assert same.generated == fresh.generated == [6]


def test_a_partial_match_is_not_reused():
    """Prompts that only share a beginning (a system prompt) never share cache rows: a request's
    numbers must not depend on which request ran before it."""
    eng, be = make(n_slots=1)
    eng.run([eng.add([1, 2, 3, 4], SamplingParams(max_tokens=2, **GREEDY))])
    other = eng.add([1, 2, 3, 9, 9], SamplingParams(max_tokens=1, **GREEDY))
    eng.run([other])
    assert other.stats.cached_tokens == 0 and be.batches[-1].tokens.tolist() == [1, 2, 3, 9, 9]
    shorter = eng.add([1, 2, 3], SamplingParams(max_tokens=1, **GREEDY))  # the slot holds more than it
    eng.run([shorter])
    assert shorter.stats.cached_tokens == 0


def test_abort_frees_slots_and_the_engine_goes_on():
    eng, _ = make(n_slots=4)
    seqs = [eng.add([1 + i % 7, 2], SamplingParams(max_tokens=50, **GREEDY)) for i in range(50)]
    for _ in range(6):
        eng.step()
    for s in seqs:
        eng.abort(s)
    assert eng.scheduler.slots_in_use == 0 and not eng.scheduler.has_work()
    assert all(s.finish_reason == "abort" for s in seqs)
    ok = eng.add([3], SamplingParams(max_tokens=3, **GREEDY))
    eng.run([ok])
    assert ok.generated == [4, 5, 6]


def test_closing_a_stream_aborts_its_sequence():
    eng, _ = make(n_slots=1)
    seq = eng.add([3], SamplingParams(max_tokens=30, **GREEDY))
    it = eng.stream(seq)
    next(it)
    it.close()
    assert seq.finish_reason == "abort" and eng.scheduler.slots_in_use == 0


def test_seeded_sampling_is_the_same_alone_and_in_a_batch():
    params = [SamplingParams(max_tokens=12, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=s, ignore_eos=True)
              for s in (1, 2, 3)]
    prompts = [[3, 4], [7], [1, 2, 3, 4, 5]]
    alone = []
    for p, sp in zip(prompts, params, strict=True):
        eng, _ = make(n_slots=1)
        seq = eng.add(p, sp)
        eng.run([seq])
        alone.append(seq.generated)
    eng, be = make(n_slots=3)
    seqs = [eng.add(p, sp) for p, sp in zip(prompts, params, strict=True)]
    eng.run(seqs)
    assert [s.generated for s in seqs] == alone
    assert len({tuple(a) for a in alone}) == 3 and max(b.n_decode for b in be.batches) == 3


def test_prompt_logits_are_kept_across_chunks():
    eng, _ = make(chunk=3)
    prompt = [5, 6, 7, 8, 9, 10, 11]
    seq = eng.add(prompt, SamplingParams(max_tokens=0), logit_rows=range(1, 6))
    eng.run([seq])
    got = torch.cat(seq.prompt_logits)
    assert got.shape == (5, V) and seq.generated == [] and seq.finish_reason == "length"
    assert got.argmax(-1).tolist() == [NEXT[t] for t in prompt[1:6]]


# ---- overlap: step N+1 queued before step N's tokens are read ---------------------------------


class Launched:
    def __init__(self, picked: list[int], log: list, n: int):
        self.picked, self.log, self.n = picked, log, n

    def tokens(self) -> list[int]:
        self.log.append(("read", self.n))
        return self.picked


class OverlapBackend(ScriptedBackend):
    """The scripted backend with `decode_pick`: tokens picked "on the device"; a step launched
    after another takes that step's picked tokens, never the batch's placeholders."""

    device_pick = True

    def __init__(self, eos_after: int | None = None):
        super().__init__(eos_after)
        self.log: list[tuple[str, int]] = []

    def decode_pick(self, batch: Batch, after: Launched | None = None, params=None) -> Launched:
        assert batch.kind == "decode" and batch.out_rows.tolist() == list(range(batch.n_tokens))
        toks = after.picked if after is not None else batch.tokens.tolist()
        fed = Batch.build([(s.slot, s.start, [t]) for s, t in zip(batch.spans, toks, strict=True)],
                          list(range(batch.n_tokens)), n_decode=batch.n_tokens)
        n = sum(1 for e in self.log if e[0] == "launch") + 1
        self.log.append(("launch", n))
        logits = self.forward(fed)
        picked = logits.argmax(-1) if params is None else sample_rows(logits, params)
        return Launched(picked.tolist(), self.log, n)

    def ahead(self) -> int:
        """How many steps were launched before the step ahead of them had been read."""
        read, count = 0, 0
        for kind, n in self.log:
            if kind == "launch":
                count += n - 1 > read
            else:
                read = n
        return count


def run_both(script, eos_after=None, **cfg):
    """Run `script(engine)` on the plain loop and on the overlapped one; both engines' sequences."""
    out = []
    for backend in (ScriptedBackend(eos_after), OverlapBackend(eos_after)):
        config = EngineConfig(n_slots=cfg.get("n_slots", 3), n_ctx=cfg.get("n_ctx", 64), prefill_chunk=8)
        eng = Engine(backend, n_vocab=V, n_ctx=config.n_ctx, n_slots=config.n_slots, config=config,
                     tokenizer=PieceTokenizer())
        out.append((eng, backend, script(eng)))
    return out


def _summary(seqs):
    return [(s.generated, s.finish_reason, s.take_text(), s.slot) for s in seqs]


def test_overlapped_greedy_decoding_equals_the_plain_loop():
    """Ends by length, by an end token (one speculative row past it) and by a stop string; more
    sequences than slots (admissions break the chain); a later prompt continuing a slot."""
    def script(eng):
        ps = [([3, 4], dict(max_tokens=9)), ([5], dict(max_tokens=12)), ([1, 2], dict(max_tokens=7, stop=("w6 w",))),
              ([9], dict(max_tokens=5)), ([2], dict(max_tokens=None))]
        seqs = [eng.add(p, SamplingParams(**kw, **GREEDY)) for p, kw in ps]
        eng.run(seqs)
        follow = eng.add(seqs[3].tokens + [20, 21], SamplingParams(max_tokens=6, **GREEDY))
        eng.run([follow])
        return [*seqs, follow]

    (_, _, plain), (eng, be, over) = run_both(script, eos_after=7)
    assert _summary(over) == _summary(plain)
    assert {s.finish_reason for s in plain} == {"length", "stop"} and plain[1].generated[-1] == EOS
    assert over[-1].stats.cached_tokens == len(plain[3].tokens) - 1  # the slot's cache is what it says
    assert be.ahead() >= 8  # most decode steps were queued before the one ahead of them was read
    assert eng._inflight is None or all(s.finished for s in eng._inflight[0].decode)
    assert eng.scheduler.slots_in_use == 0


def test_a_step_in_flight_past_an_abort_changes_nothing():
    def script(eng):
        a = eng.add([3], SamplingParams(max_tokens=20, **GREEDY))
        b = eng.add([10], SamplingParams(max_tokens=20, **GREEDY))
        for _ in range(4):
            eng.step()
        assert not isinstance(eng.backend, OverlapBackend) or eng._inflight is not None
        eng.abort(a)  # a step with a's row is in flight: its token is dropped
        eng.run([b])
        c = eng.add([3], SamplingParams(max_tokens=4, **GREEDY))
        eng.run([c])
        return [a, b, c]

    (_, _, plain), (eng, be, over) = run_both(script)
    assert [s.generated for s in over] == [s.generated for s in plain]
    assert over[0].finish_reason == "abort" and len(over[0].generated) == 4
    assert be.ahead() > 0 and eng.scheduler.slots_in_use == 0


def test_sampled_rows_are_overlapped_and_draw_what_the_host_draws():
    """Seeded sampling (top-k within the device's 64 candidates), sampled on the device step after
    step, against the host sampler of the plain loop: the same tokens, greedy rows beside them."""
    def script(eng):
        seqs = [eng.add([3, 4], SamplingParams(max_tokens=9, temperature=1.2, top_k=20, seed=5, ignore_eos=True)),
                eng.add([8], SamplingParams(max_tokens=9, temperature=0.7, top_p=0.8, min_p=0.1, seed=9,
                                            ignore_eos=True)),
                eng.add([1], SamplingParams(max_tokens=9, **GREEDY))]
        eng.run(seqs)
        return seqs

    (_, _, plain), (_, be, over) = run_both(script)
    assert [s.generated for s in over] == [s.generated for s in plain]
    assert len({tuple(s.generated) for s in plain}) == 3 and be.ahead() >= 4


def test_penalized_or_unbounded_top_k_rows_are_not_overlapped():
    for params in (SamplingParams(max_tokens=6, temperature=1.0, top_k=0, seed=5),
                   SamplingParams(max_tokens=6, temperature=0, repeat_penalty=1.3)):
        def script(eng, params=params):
            seqs = [eng.add([3, 4], SamplingParams(max_tokens=6, **GREEDY)), eng.add([8], params)]
            eng.run(seqs)
            return seqs

        (_, _, plain), (_, be, over) = run_both(script)
        assert [s.generated for s in over] == [s.generated for s in plain]
        decode_launches = [e for e in be.log if e[0] == "launch"]
        assert not decode_launches  # every decode step carried that row: sampled on the host


def test_overlap_can_be_turned_off():
    be = OverlapBackend()
    config = EngineConfig(n_slots=1, n_ctx=32, overlap=False)
    eng = Engine(be, n_vocab=V, n_ctx=32, n_slots=1, config=config, tokenizer=PieceTokenizer())
    seq = eng.add([3], SamplingParams(max_tokens=5, **GREEDY))
    eng.run([seq])
    assert seq.generated == [4, 5, 6, 7, 8] and not be.log


def test_rows_that_want_logprobs_are_not_overlapped():
    def script(eng):
        seq = eng.add([3, 4], SamplingParams(max_tokens=5, **GREEDY))
        seq.logprobs_n = 2  # (what the server sets for a request with logprobs)
        eng.run([seq])
        return [seq]

    (_, _, plain), (_, be, over) = run_both(script)
    assert over[0].generated == plain[0].generated == [5, 6, 7, 8, 9]
    assert len(over[0].logprobs) == 5 and not be.log


def test_several_prompts_share_a_step_within_the_token_budget():
    """prefill_seqs = 3: waiting prompts are admitted and chunked together, in arrival order, never
    past max_batch_tokens; the tokens are those of one prompt per step."""
    outs = []
    for seqs_per_step in (1, 3):
        eng, be = make(n_slots=4, chunk=4, max_batch_tokens=10, prefill_seqs=seqs_per_step)
        prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16]]
        seqs = [eng.add(p, SamplingParams(max_tokens=3, **GREEDY)) for p in prompts]
        eng.run(seqs)
        outs.append([s.generated for s in seqs])
        shapes = [[sp.n_tokens for sp in b.spans[b.n_decode:]] for b in be.batches]
        assert all(b.n_tokens <= 10 for b in be.batches)
        if seqs_per_step == 3:
            assert shapes[0] == [3, 4, 2]  # three prompts in the first step: 3 + 4 (a chunk) + 2 tokens
            assert max(len(x) for x in shapes) == 3
        else:
            assert max(len(x) for x in shapes) == 1
    assert outs[0] == outs[1]
