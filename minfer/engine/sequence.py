"""One request's life in the engine: its tokens, its sampler, where it stands, why it ended.

A `Sequence` is made by `Engine.add`, waits in the scheduler's queue, gets a KV-cache slot,
prefills its prompt chunk by chunk, then decodes one token per step until it finishes:
an end-of-generation token ("stop", unless ignore_eos), a stop string ("stop"), its grammar
complete ("stop"), max_tokens or the end of the context ("length"), or an abort ("abort"). Every token it samples is in
`tokens`; its text (stop strings applied, never split inside a UTF-8 character) comes out of
`take_text()` as it grows.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from ..errors import MinferError
from ..kernels.sample import KMAX
from .params import SamplingParams
from .pooling import pool
from .sampler import Sampler


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


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


class TextStream:
    """Token ids -> text pieces: the tokenizer's stream decoder, then the stop-string filter."""

    def __init__(self, tokenizer, stops: tuple[str, ...]):
        self.decoder = tokenizer.stream_decoder()
        self.stops = StopStringFilter(stops)

    def feed(self, token: int) -> tuple[str, bool]:
        return self.stops.feed(self.decoder.feed(token))

    def finish(self, stopped: bool) -> str:
        """The held-back tail at the end (nothing after a completed stop string)."""
        if stopped:
            return ""
        tail, hit = self.stops.feed(self.decoder.flush())
        return tail if hit else tail + self.stops.flush()


@dataclass
class SequenceStats:
    arrival: float = field(default_factory=time.perf_counter)
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    cached_tokens: int = 0  # prompt tokens reused from the slot's cache (not run)
    draft_tokens: int = 0  # speculative decoding: draft tokens proposed (engine/draft.py)
    draft_accepted: int = 0  # ... and kept (the sampler picked them)
    token_times: list[float] = field(default_factory=list)  # when each generated token was sampled

    @property
    def prefill_seconds(self) -> float:
        """From the first scheduled step to the first token (the prompt's chunks)."""
        if self.first_scheduled is None or self.first_token is None:
            return 0.0
        return self.first_token - self.first_scheduled

    @property
    def decode_seconds(self) -> float:
        """From the first token to the last."""
        return self.token_times[-1] - self.token_times[0] if len(self.token_times) > 1 else 0.0


class Sequence:
    def __init__(self, seq_id: int, prompt: list[int], params: SamplingParams, *, eog_ids: frozenset[int] = frozenset(),
                 text: TextStream | None = None, logit_rows: range | None = None, reuse_prefix: bool = True,
                 matcher=None, pooling: str | None = None):
        """`logit_rows`: prompt positions whose logits to keep (scoring; `prompt_logits`).
        `reuse_prefix`: may start from tokens a free slot already holds. `matcher`: the parser
        state of its grammar (engine/grammar.py Matcher), advanced by every token it samples.
        `pooling`: an embedding (engine/pooling.py): its steps keep the hidden states of
        `logit_rows` in `prompt_logits` instead of logits, and it samples nothing."""
        self.id = seq_id
        self.prompt = list(prompt)
        self.tokens = list(prompt)  # prompt, then every sampled token
        self.params = params
        self.sampler = Sampler(params)
        self.eog_ids = eog_ids
        self.text = text
        self.logit_rows = logit_rows
        self.reuse_prefix = reuse_prefix
        self.matcher = matcher
        self.pooling = pooling
        self.drafter = None  # speculative decoding: engine/draft.py's NgramDrafter (set by the engine), or None
        self.draft_budget = None  # ... and its DraftBudget
        self.prompt_logits: list[torch.Tensor] = []
        self.status = Status.WAITING
        self.slot: int | None = None
        self.n_cached = 0  # tokens whose keys/values are in the slot
        self.prefix_exact = True  # its prompt rows so far are a fresh run's: their blocks may be cached
        self.finish_reason: str | None = None
        self.abort_requested = False
        self.error: Exception | None = None
        self.logprobs_n: int | None = None  # set: record (logprob, top-n) of each sampled token (engine/logprobs.py)
        self.logprobs: list[tuple[float, list[tuple[int, float]]]] = []
        self.stats = SequenceStats()
        self._text_out: list[str] = []
        self._stopped = False

    # ------------------------------------------------------------------ state
    @property
    def n_prompt(self) -> int:
        return len(self.prompt)

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.n_prompt:]

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def prefilling(self) -> bool:
        return self.n_cached < self.n_prompt

    @property
    def device_pickable(self) -> bool:
        """Its next token depends on its logits row alone (and its grammar's mask, if any, which a
        backend with `masked_pick` applies) and nothing else of them is kept (no penalties, no
        logprobs, no logit bias; greedy, or sampling from at most KMAX candidates): a backend may
        pick it on the device."""
        p = self.params
        return not p.penalized and not p.logit_bias and self.logprobs_n is None and \
            (p.greedy or 1 <= p.top_k <= KMAX)

    def sampling_row(self, ahead: int = 0) -> tuple[int, float, float, float, int, int]:
        """(top_k, temperature, top_p, min_p, seed, index) of the token `ahead` steps after the
        next one to sample (kernels.sample.pack_params's row)."""
        p = self.params
        return (p.top_k, p.temperature, p.top_p, p.min_p, self.sampler.seed, len(self.generated) + ahead)

    def embedding(self) -> list[float]:
        """The pooled, normalised embedding of a finished embedding sequence."""
        return pool(torch.cat(self.prompt_logits)).tolist()

    def take_text(self) -> str:
        """The text generated since the last call."""
        out = "".join(self._text_out)
        self._text_out.clear()
        return out

    # ------------------------------------------------------------------ updates (the scheduler's)
    def append(self, token: int, n_ctx: int, now: float) -> None:
        """Add a sampled token; finish the sequence if it ends here."""
        self.tokens.append(token)
        st = self.stats
        if st.first_token is None:
            st.first_token = now
        st.token_times.append(now)
        eog = token in self.eog_ids and not self.params.ignore_eos
        complete = False
        if self.matcher is not None and not eog:
            if not self.matcher.consume(token):  # (masked rows never sample a refused token)
                raise MinferError(f"sequence {self.id}: its grammar refused token {token}: {self.matcher.error}")
            complete = self.matcher.done
        if self.text is not None and not eog:
            piece, self._stopped = self.text.feed(token)
            if piece:
                self._text_out.append(piece)
        if eog or self._stopped or complete:
            self.finish("stop")
        elif self.params.max_tokens is not None and len(self.generated) >= self.params.max_tokens:
            self.finish("length")
        elif len(self.tokens) >= n_ctx:  # the next token could not be fed
            self.finish("length")

    def finish(self, reason: str) -> None:
        if self.finished:
            return
        if self.text is not None:
            tail = self.text.finish(self._stopped)
            if tail:
                self._text_out.append(tail)
        self.finish_reason = reason
        self.status = Status.FINISHED
        self.stats.finished = time.perf_counter()
