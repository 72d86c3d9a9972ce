"""The generate loop and stop-string handling, on a scripted engine and tokenizer.

The fake engine's logits always put the next token of a script first, so what the loop does
(stops, budgets, cache reuse, text assembly) is checked without a model.
"""

from __future__ import annotations

import pytest
import torch

from minfer.engine.generate import (
    GenerationStats,
    SlotState,
    StopStringFilter,
    generate_text,
    generate_tokens,
)
from minfer.engine.sampler import SamplingParams
from minfer.errors import ContextOverflowError

PIECES = ["<eos>", "Hel", "lo", " Wo", "rld", "!", " Bye"]
EOS = 0
GREEDY = dict(temperature=0)


class ScriptedEngine:
    """Greedy sampling from its logits yields `script` in order; records what was prefilled."""

    def __init__(self, script: list[int], n_ctx: int = 64):
        self.script, self.n_ctx, self.n_vocab = script, n_ctx, len(PIECES)
        self.fed: list[tuple[str, list[int], int]] = []
        self.finished: list[int | None] = []
        self._i = 0

    def _next(self) -> torch.Tensor:
        logits = torch.zeros(self.n_vocab)
        logits[self.script[min(self._i, len(self.script) - 1)]] = 1.0
        self._i += 1
        return logits

    def prefill(self, slot, tokens, start=0, rows=None):
        self.fed.append(("prefill", list(tokens), start))
        return self._next()[None]

    def decode(self, slot, token, pos):
        self.fed.append(("decode", [token], pos))
        return self._next()

    def finish(self, token, logits):
        self.finished.append(token)


class PieceTokenizer:
    eot_ids = frozenset({EOS})

    def stream_decoder(self):
        class D:
            def feed(self, t):
                return "" if t == EOS else PIECES[t]

            def flush(self):
                return ""

        return D()


def _text(script, prompt=(3, 4), **kw):
    eng = ScriptedEngine(script)
    stats = GenerationStats()
    params = SamplingParams(**GREEDY, **kw)
    out = list(generate_text(eng, PieceTokenizer(), list(prompt), params, SlotState(0), stats))
    return out, stats, eng


def test_max_tokens_and_timing_stats():
    out, stats, eng = _text([1, 2, 3, 4, 5, 6], max_tokens=3)
    assert "".join(out) == "Hello Wo"
    assert stats.generated_tokens == 3 and stats.finish_reason == "length"
    assert [f[0] for f in eng.fed] == ["prefill", "decode", "decode"]  # the last token is never fed
    assert eng.fed[1] == ("decode", [1], 2)  # first new token goes at the position after the prompt
    assert eng.finished == [1, 2, 3]  # each step is closed with the token sampled from it


def test_end_of_generation_token_stops_and_is_not_rendered():
    out, stats, _ = _text([1, 2, EOS, 5], max_tokens=10)
    assert "".join(out) == "Hello" and stats.finish_reason == "stop"


def test_ignore_eos_keeps_going():
    out, stats, _ = _text([1, EOS, 5], max_tokens=4, ignore_eos=True)
    assert stats.generated_tokens == 4 and stats.finish_reason == "length"


def test_stop_string_across_tokens_is_cut_and_held_text_is_never_emitted():
    out, stats, _ = _text([1, 2, 3, 4, 5], max_tokens=10, stop=("lo Wor",))
    assert "".join(out) == "Hel" and stats.finish_reason == "stop"
    assert all("lo" not in p for p in out)


def test_held_back_prefix_is_released_when_it_cannot_match():
    out, _, _ = _text([1, 2, 5, 6], max_tokens=4, stop=("lo?",))
    assert "".join(out) == "Hello! Bye"


def test_context_full_stops_generation():
    eng = ScriptedEngine([1, 2, 3, 4, 5], n_ctx=4)
    toks = list(generate_tokens(eng, [3, 4], SamplingParams(max_tokens=10, **GREEDY), SlotState(0)))
    assert len(toks) == 2  # positions 2 and 3 filled the context of 4


def test_prompt_longer_than_context_is_a_typed_error():
    eng = ScriptedEngine([1], n_ctx=4)
    with pytest.raises(ContextOverflowError):
        list(generate_tokens(eng, [1, 2, 3, 4, 5], SamplingParams(**GREEDY), SlotState(0)))


def test_cached_prefix_is_not_prefilled_again():
    eng = ScriptedEngine([1, 2, 3, 4, 5, 6, 7])
    state = SlotState(0)
    list(generate_tokens(eng, [3, 4, 5], SamplingParams(max_tokens=2, **GREEDY), state))
    assert state.tokens == [3, 4, 5, 1]  # prompt + the token fed by the one decode step
    eng.fed.clear()
    list(generate_tokens(eng, [3, 4, 5, 1, 2, 6], SamplingParams(max_tokens=1, **GREEDY), state))
    assert eng.fed == [("prefill", [2, 6], 4)]
    # a diverging prompt reuses only the common prefix
    eng.fed.clear()
    list(generate_tokens(eng, [3, 7], SamplingParams(max_tokens=1, **GREEDY), state))
    assert eng.fed == [("prefill", [7], 1)]


@pytest.mark.parametrize("feeds,stops,want", [
    (["ab", "c"], ("bc",), ("a", True)),
    (["x<", "/s", ">y"], ("</s>",), ("x", True)),
    (["x<", "z"], ("</s>",), ("x<z", False)),
    (["abc"], (), ("abc", False)),
])
def test_stop_string_filter(feeds, stops, want):
    f = StopStringFilter(stops)
    out, stopped = "", False
    for piece in feeds:
        text, stopped = f.feed(piece)
        out += text
        if stopped:
            break
    if not stopped:
        out += f.flush()
    assert (out, stopped) == want
