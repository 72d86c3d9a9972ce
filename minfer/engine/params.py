"""Sampling parameters of one request, validated when made. No torch here: the CLI checks its
flags with these before loading a model.

The chain follows llama.cpp's default order (engine/sampler.py): penalties, top-k, top-p,
min-p, temperature, then a draw. temperature == 0 is greedy. The penalties look at the last
`repeat_last_n` tokens of the sequence (prompt included), as llama.cpp's do:
`repeat_penalty` divides a seen token's positive logit (multiplies a negative one);
`frequency_penalty` subtracts penalty x count and `presence_penalty` subtracts penalty once
for every seen token (OpenAI's definitions, over that window).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field, fields

from ..config import check_int
from ..errors import ParamError
from .grammar import Grammar

MAX_STOPS = 16
MAX_STOP_CHARS = 512
MAX_LOGIT_BIAS = 300  # OpenAI's limit on logit_bias entries; each bias in [-100, 100]
MAX_REQUEST_TEMPERATURE = 2.0  # OpenAI's range: what one request (HTTP or a batch line) may ask


# every numeric field's accepted range: (lowest, highest or None, lowest excluded). One table for the
# checks below and the server's /openapi.json (server/schema.py), which documents the same ranges
RANGES: dict[str, tuple[float, float | None, bool]] = {
    "max_tokens": (0, None, False), "temperature": (0.0, None, False), "top_k": (0, None, False),
    "top_p": (0.0, 1.0, True), "min_p": (0.0, 1.0, False), "repeat_penalty": (0.0, None, True),
    "repeat_last_n": (0, None, False), "frequency_penalty": (-2.0, 2.0, False),
    "presence_penalty": (-2.0, 2.0, False), "seed": (0, 2**64 - 1, False)}
INTEGERS = ("max_tokens", "top_k", "repeat_last_n", "seed")


def _num(name: str, v, lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> None:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or v != v:
        raise ParamError(name, f"must be a number, got {v!r}")
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise ParamError(name, f"must be {'>' if lo_open else '>='} {lo}, got {v}")
    if hi is not None and v > hi:
        raise ParamError(name, f"must be <= {hi}, got {v}")


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int | None = 256  # None: until an end token, a stop string or the end of the context
    temperature: float = 0.8
    top_k: int = 40  # 0: no limit
    top_p: float = 0.95  # 1.0: off
    min_p: float = 0.05  # 0.0: off
    repeat_penalty: float = 1.0  # 1.0: off
    repeat_last_n: int = 64  # window of the three penalties
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None  # None: a fresh random seed
    stop: tuple[str, ...] = field(default=())
    ignore_eos: bool = False
    grammar: Grammar | None = None  # the output must match it (engine/grammar.py: JSON schema, GBNF, ...)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit), OpenAI's logit_bias

    def __post_init__(self):
        for name, (lo, hi, lo_open) in RANGES.items():
            v = getattr(self, name)
            if name in INTEGERS:
                check_int(name, v, lo, hi, none_ok=name in ("max_tokens", "seed"))
            else:
                _num(name, v, lo, hi, lo_open)
        if not isinstance(self.ignore_eos, bool):
            raise ParamError("ignore_eos", f"must be true or false, got {self.ignore_eos!r}")
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, list | tuple) or any(not isinstance(s, str) or not s for s in stop):
            raise ParamError("stop", "must be a non-empty string or a list of non-empty strings")
        if len(stop) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stop):
            raise ParamError("stop", f"allows at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters")
        object.__setattr__(self, "stop", tuple(stop))
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise ParamError("grammar", f"must be a Grammar (engine/grammar.py), got {type(self.grammar).__name__}")
        bias = tuple(self.logit_bias.items()) if isinstance(self.logit_bias, dict) else self.logit_bias
        if not isinstance(bias, tuple | list) or len(bias) > MAX_LOGIT_BIAS:
            raise ParamError("logit_bias", f"must map at most {MAX_LOGIT_BIAS} token ids to biases")
        for pair in bias:
            if not (isinstance(pair, tuple | list) and len(pair) == 2):
                raise ParamError("logit_bias", f"entries are (token id, bias) pairs, got {pair!r}")
            check_int("logit_bias token id", pair[0], 0)
            _num("logit_bias", pair[1], -100.0, 100.0)
        object.__setattr__(self, "logit_bias", tuple((int(t), float(b)) for t, b in bias))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of(cls, **settings) -> SamplingParams:
        """From keywords, an unknown one a ParamError naming it (not a TypeError)."""
        unknown = sorted(set(settings) - set(cls.names()))
        if unknown:
            raise ParamError(unknown[0], f"is not a sampling parameter; known: {', '.join(cls.names())}")
        return cls(**settings)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        return self.repeat_last_n > 0 and (self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0
                                           or self.presence_penalty != 0.0)


def check_request(p: SamplingParams) -> SamplingParams:
    """The bounds a request adds to SamplingParams' own, the same for an HTTP request and a line
    of a `minfer batch` file: at least one token (max_tokens >= 1, or None: until the end), and
    OpenAI's temperature range. Returns `p`; a ParamError names the field."""
    if p.max_tokens is not None:
        check_int("max_tokens", p.max_tokens, 1)
    if p.temperature > MAX_REQUEST_TEMPERATURE:
        raise ParamError("temperature", f"must be <= {MAX_REQUEST_TEMPERATURE}, got {p.temperature}")
    return p
