"""Draft tokens for speculative decoding: prompt lookup (n-gram matching, no second model).

A sequence that is generating text it has seen before (an edit of a given text, a summary that
quotes it, code that repeats its identifiers) can guess its next tokens by finding where its
last few tokens occurred earlier in its own prompt and output, and proposing what followed them
there. The engine feeds those guesses as extra decode rows of the same step and keeps the ones
the model itself would have picked (scheduler.py `postprocess`): a wrong guess costs only its
row; a right one saves a whole step.

`NgramDrafter` is one sequence's index: for every n-gram length in [n_min, n_max], the latest
position where each n-gram ended, updated as tokens arrive (O(n_max) dictionary operations per
token), so a lookup is O(n_max) whatever the sequence's length. The longest suffix that occurred
before wins; among its occurrences, the latest (recent text predicts best).

How many tokens to propose, and when, adapts per sequence (`DraftBudget`): after a proposal
accepted in full the next may be twice as long (up to `draft_max`), after a partial one one more
than was kept; proposals with nothing kept pause drafting for exponentially more steps. Text the
drafts cannot guess so pays for a few rows, not one every step.
"""

from __future__ import annotations

from ..config import DRAFT_MAX, NGRAM_MAX
from ..errors import MinferError


class NgramDrafter:
    """Prompt-lookup drafts for one sequence (see the module docstring)."""

    def __init__(self, n_max: int = 3, n_min: int = 2):
        if not 1 <= n_min <= n_max <= NGRAM_MAX:
            raise MinferError(f"n-gram drafter: need 1 <= n_min <= n_max <= {NGRAM_MAX}, got {n_min}, {n_max}")
        self.n_max, self.n_min = n_max, n_min
        self._last: list[dict[tuple[int, ...], int]] = [{} for _ in range(n_max + 1)]  # [n]: n-gram -> end index
        self._indexed = 0  # tokens[:_indexed] have their n-grams in the index

    def _index(self, tokens: list[int], upto: int) -> None:
        """Record the n-grams that end at positions _indexed..upto-1."""
        for end in range(self._indexed, upto):
            for n in range(self.n_min, min(self.n_max, end + 1) + 1):
                self._last[n][tuple(tokens[end - n + 1:end + 1])] = end
        self._indexed = max(self._indexed, upto)

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to `k` tokens that followed the latest earlier occurrence of the longest suffix of
        `tokens` (n_max tokens down to n_min); [] when no suffix occurred before. `tokens` only
        grows between calls (a sequence's prompt and output)."""
        if k <= 0 or len(tokens) < 2:
            return []
        self._index(tokens, len(tokens) - 1)  # (not the suffix itself: its end is the last token)
        for n in range(min(self.n_max, len(tokens) - 1), self.n_min - 1, -1):
            end = self._last[n].get(tuple(tokens[-n:]))
            if end is not None:
                return tokens[end + 1:end + 1 + k]
        return []


class DraftBudget:
    """How many draft tokens to propose next for one sequence, and when: the count doubles after a
    full acceptance (up to `most`) and falls to one more than the accepted count after a partial
    one; a proposal with nothing kept pauses drafting for 1, 3, 7, ... steps (up to MAX_PAUSE) as
    such misses repeat, so text the drafts cannot guess pays for a few rows, not one every step."""

    MAX_PAUSE = 31

    def __init__(self, most: int):
        if not 1 <= most <= DRAFT_MAX:
            raise MinferError(f"draft budget: need 1 <= draft_max <= {DRAFT_MAX}, got {most}")
        self.most = most
        self.next = most
        self.misses = 0  # proposals in a row with nothing kept
        self.pause = 0  # steps to skip before the next proposal

    def ready(self) -> bool:
        """Whether to propose at this step (counts a paused step down)."""
        if self.pause:
            self.pause -= 1
            return False
        return True

    def update(self, proposed: int, accepted: int) -> None:
        if proposed <= 0:
            return
        if accepted == 0:
            self.misses += 1
            self.pause = min(self.MAX_PAUSE, 2 ** self.misses - 1)
            self.next = 1
        else:
            self.misses = 0
            self.next = min(self.most, 2 * self.next) if accepted >= proposed else min(self.most, accepted + 1)
