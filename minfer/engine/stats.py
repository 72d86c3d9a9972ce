"""What one generation ran (`Model.last_stats`, the stats line `minfer run` prints): counts and
timings, in plain data (no torch), so a client of a resident process (commands/resident.py) prints
the line from the numbers the server sends as the in-process run prints it from its sequence."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .sequence import Sequence


@dataclass
class GenerationStats:
    """Counts and timings of the latest `generate` call (Model.last_stats)."""

    prompt_tokens: int = 0
    prefilled_tokens: int = 0  # prompt tokens actually run (the rest came from the slot's cache)
    generated_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    finish_reason: str | None = None
    first_step: bool = False  # the prefill was the model's first step: its time includes one-time warm-up
    draft_tokens: int = 0  # speculative decoding: draft tokens proposed
    draft_accepted: int = 0  # ... and kept

    @classmethod
    def of(cls, seq: Sequence, first_step: bool = False) -> GenerationStats:
        st = seq.stats
        return cls(seq.n_prompt, seq.n_prompt - st.cached_tokens, len(seq.generated), st.prefill_seconds,
                   st.decode_seconds, seq.finish_reason, first_step, st.draft_tokens, st.draft_accepted)

    @classmethod
    def of_timings(cls, usage: dict, timings: dict, finish_reason: str | None) -> GenerationStats:
        """From a server's answer: OpenAI's `usage` and llama-server's `timings` (server/output.py
        timings_json: the same numbers `of` reads, in milliseconds)."""
        return cls(usage["prompt_tokens"], timings["prompt_n"], usage["completion_tokens"],
                   timings["prompt_ms"] / 1e3, timings["predicted_ms"] / 1e3, finish_reason,
                   draft_tokens=timings.get("draft_n", 0), draft_accepted=timings.get("draft_n_accepted", 0))

    @property
    def prefill_tps(self) -> float:
        return self.prefilled_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        # the first generated token comes from the prefill's logits: decode steps = generated - 1
        steps = self.generated_tokens - 1
        return steps / self.decode_seconds if steps > 0 and self.decode_seconds > 0 else 0.0
