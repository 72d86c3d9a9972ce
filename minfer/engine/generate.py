"""The generate loop: prompt ids -> sampled token ids -> streamed text pieces.

`generate_tokens` runs prefill and decode steps and samples; it stops on an end-of-generation
token (unless ignore_eos), after max_tokens, or when the context is full. `generate_text` turns
the ids into text with the tokenizer's StreamDecoder (never splits a UTF-8 character) and
applies stop strings: text that could be the start of a stop string is held back until it
either completes one (generation ends, the stop string is not emitted) or cannot any more.

`SlotState` remembers which tokens a KV-cache slot holds, so a follow-up prompt that extends
them (the next chat turn) only prefills the new part.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..errors import ContextOverflowError, MinferError
from .engine import Engine
from .sampler import Sampler, SamplingParams


@dataclass
class GenerationStats:
    prompt_tokens: int = 0  # tokens of the prompt
    prefilled_tokens: int = 0  # of those, the ones actually run (the rest were cached)
    generated_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    finish_reason: str | None = None  # "stop" (end token / stop string) or "length"

    @property
    def prefill_tps(self) -> float:
        return self.prefilled_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        # the first generated token comes from the prefill's logits: decode steps = generated - 1
        steps = self.generated_tokens - 1
        return steps / self.decode_seconds if steps > 0 and self.decode_seconds > 0 else 0.0


@dataclass
class SlotState:
    """A KV-cache slot and the token ids whose keys/values it holds, in order."""

    slot: int
    tokens: list[int] = field(default_factory=list)

    def reusable(self, prompt: list[int]) -> int:
        """How many leading prompt tokens are already cached (at least one token is always rerun,
        since the step that feeds it produces the logits the first new token is sampled from)."""
        n = 0
        for a, b in zip(self.tokens, prompt[:-1], strict=False):
            if a != b:
                break
            n += 1
        return n


def generate_tokens(engine: Engine, prompt: list[int], params: SamplingParams, state: SlotState,
                    eog_ids: frozenset[int] = frozenset(),
                    stats: GenerationStats | None = None) -> Iterator[int]:
    """Yield sampled token ids (an end-of-generation id is yielded, then generation stops)."""
    if not prompt:
        raise MinferError("the prompt is empty: nothing to generate from")
    if len(prompt) > engine.n_ctx:
        raise ContextOverflowError(f"the prompt has {len(prompt)} tokens but the context holds "
                                   f"{engine.n_ctx}")
    stats = stats if stats is not None else GenerationStats()
    stats.prompt_tokens = len(prompt)
    sampler = Sampler(params)
    keep = state.reusable(prompt)
    del state.tokens[keep:]
    t0 = time.perf_counter()
    logits = engine.prefill(state.slot, prompt[keep:], start=keep)[0]
    stats.prefill_seconds = time.perf_counter() - t0
    stats.prefilled_tokens = len(prompt) - keep
    state.tokens.extend(prompt[keep:])
    history = list(prompt)
    stats.finish_reason = "length"
    for i in range(params.max_tokens):
        tok = sampler(logits, history)
        engine.finish(tok, logits)
        history.append(tok)
        stats.generated_tokens += 1
        if tok in eog_ids and not params.ignore_eos:
            stats.finish_reason = "stop"
            yield tok
            return
        yield tok
        if i + 1 == params.max_tokens or len(history) >= engine.n_ctx:
            return
        t0 = time.perf_counter()
        logits = engine.decode(state.slot, tok, len(history) - 1)
        stats.decode_seconds += time.perf_counter() - t0
        state.tokens.append(tok)
    if params.max_tokens == 0:
        engine.finish(None, logits)


class StopStringFilter:
    """Holds back text that may begin a stop string; reports when one completes."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to emit, whether a stop string completed)."""
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out, False
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending = self.pending[:min(hits)], ""
            return out, True
        hold = max((n for s in self.stops for n in range(min(len(s) - 1, len(self.pending)), 0, -1)
                    if self.pending.endswith(s[:n])), default=0)
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def generate_text(engine: Engine, tokenizer, prompt: list[int], params: SamplingParams, state: SlotState,
                  stats: GenerationStats | None = None) -> Iterator[str]:
    """Yield text pieces of the generated continuation of `prompt` (end tokens are not rendered)."""
    stats = stats if stats is not None else GenerationStats()
    eog = frozenset(tokenizer.eot_ids)
    decoder = tokenizer.stream_decoder()
    stops = StopStringFilter(params.stop)
    tokens = generate_tokens(engine, prompt, params, state, eog, stats)
    try:
        for tok in tokens:
            if tok in eog and not params.ignore_eos:
                break
            piece, stopped = stops.feed(decoder.feed(tok))
            if piece:
                yield piece
            if stopped:
                stats.finish_reason = "stop"
                return
        tail, stopped = stops.feed(decoder.flush())
        tail += "" if stopped else stops.flush()
        if stopped:
            stats.finish_reason = "stop"
        if tail:
            yield tail
    finally:
        tokens.close()
