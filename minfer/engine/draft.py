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

from dataclasses import replace
from typing import TYPE_CHECKING

from ..backends.base import Backend, Batch
from ..config import DRAFT_MAX, NGRAM_MAX, EngineConfig
from ..errors import MinferError, ModelError
from ..gguf.reader import GGUFReader

if TYPE_CHECKING:
    from .sequence import Sequence

VOCAB_SLACK = 128  # token ids a draft model's vocabulary may have more or fewer than the model's (llama.cpp's)


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


    def draft(self, items: list[tuple[Sequence, int]]) -> list[list[int]]:
        """The scheduler's call: drafts for (sequence, at most k tokens) pairs (this sequence's)."""
        return [self.propose(seq.tokens, k) for seq, k in items]


class ModelDrafter:
    """Drafts from a second, smaller model with the same vocabulary (`--model-draft`), greedy, for
    every drafting sequence of a step at once. The draft model has its own KV cache with one slot
    per engine slot; `held[slot]` is what that slot holds. A proposal first runs the tokens of the
    sequence its slot does not hold yet (its prompt the first time; after that the tokens the
    engine kept since, from the first one that differs from what the draft fed itself) the way the
    engine ran them (prompt tokens as prompt chunks, generated ones as decode rows: a draft model
    that is the target then holds the target's very cache and its drafts are all kept), the newest
    one's row giving the first draft token, then one decode step per further draft token, all
    drafting sequences as rows of one batch."""

    def __init__(self, backend: Backend, n_vocab: int, n_slots: int, chunk: int, reader=None):
        self.backend = backend
        self.n_vocab = n_vocab  # the target model's: a draft token past it ends the draft
        self.held: list[list[int]] = [[] for _ in range(n_slots)]
        self.chunk = chunk  # prompt tokens per catch-up step of one sequence
        self.reader = reader  # the draft file, closed with the drafter

    def draft(self, items: list[tuple[Sequence, int]]) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in items]
        # Each sequence's tokens its slot does not hold run as the engine ran them: prompt tokens as prompt
        # chunks, generated ones as decode rows (the engine's own and the rows that check drafts: a prompt
        # chunk's int8 activations round otherwise, and a near-tie would then pick another token). The
        # newest token's row gives the first draft.
        prompts: list[tuple[int, int, list[int]]] = []  # (slot, start, tokens): a prompt's last piece (a row)
        rows: list[tuple[int, int, list[int]]] = []  # generated tokens, one decode row each
        firsts: list[tuple[bool, int]] = []  # per item: (from a prompt piece?, index of its row there)
        for seq, _ in items:
            toks, held = seq.tokens, self.held[seq.slot]
            start = next((i for i, (a, b) in enumerate(zip(held, toks, strict=False)) if a != b), min(len(held),
                                                                                                        len(toks)))
            start = min(start, len(toks) - 1)  # (the last token always runs: its row gives the first draft)
            p_end = min(seq.n_prompt, len(toks))  # prompt tokens: pieces of `chunk`, as the engine cut them
            while start < p_end:
                n = min(self.chunk, p_end - start)
                if start + n == len(toks):  # the piece of the newest token: its last row gives the first draft
                    prompts.append((seq.slot, start, toks[start:]))
                    firsts.append((True, len(prompts) - 1))
                    start = len(toks)
                    break
                self.backend.forward(Batch.build([(seq.slot, start, toks[start:start + n])], []))
                start += n
            if start < len(toks):  # generated tokens: a decode row each, the newest one's row the draft's
                rows += [(seq.slot, p, [toks[p]]) for p in range(start, len(toks))]
                firsts.append((False, len(rows) - 1))
            self.held[seq.slot] = list(toks)
        picked_rows = self._pick(Batch.build(rows, list(range(len(rows))), n_decode=len(rows))) if rows else []
        picked_prompts = []
        if prompts:
            ends, n = [], 0
            for _, _, piece in prompts:
                n += len(piece)
                ends.append(n - 1)
            picked_prompts = self._pick(Batch.build(prompts, ends))
        picked = [picked_prompts[i] if is_prompt else picked_rows[i] for is_prompt, i in firsts]
        want = [k for _, k in items]
        live = []
        for i, t in enumerate(picked):
            if t < self.n_vocab:
                drafts[i].append(t)
                live.append(i)
        while True:
            live = [i for i in live if len(drafts[i]) < want[i]]
            if not live:
                return drafts
            rows = []
            for i in live:
                seq = items[i][0]
                rows.append((seq.slot, len(self.held[seq.slot]), [drafts[i][-1]]))
                self.held[seq.slot].append(drafts[i][-1])
            picked = self._pick(Batch.build(rows, list(range(len(rows))), n_decode=len(rows)))
            nxt = []
            for i, t in zip(live, picked, strict=True):
                if t < self.n_vocab:
                    drafts[i].append(t)
                    nxt.append(i)
            live = nxt

    def _pick(self, batch: Batch) -> list[int]:
        return self.backend.forward(batch).argmax(-1).tolist()

    def close(self) -> None:
        self.backend.close()
        if self.reader is not None:
            self.reader.close()


def load_draft_model(target: GGUFReader, config: EngineConfig, n_slots: int, n_ctx: int, n_vocab: int,
                     progress: bool = True) -> ModelDrafter:
    """`config.draft_model` on `config.device` with a KV cache of the target's slots and context,
    after checking that its vocabulary is the target's (a typed ModelError naming the difference:
    the draft's token ids must mean the target's)."""
    from . import loader

    reader = GGUFReader(config.draft_model)
    try:
        check_same_vocab(target, reader)
        m = loader.load(reader, replace(config, spec="", draft_model=None, trace_path=None), None, progress)
        try:
            m.backend.allocate(n_slots, n_ctx)
        except BaseException:
            m.backend.close()
            raise
    except BaseException:
        reader.close()
        raise
    return ModelDrafter(m.backend, n_vocab, n_slots, config.prefill_chunk, reader)


def check_same_vocab(target: GGUFReader, draft: GGUFReader) -> None:
    """A draft model's tokens are the target's: the same tokenizer model, token lists that agree
    wherever both have the id, sizes within VOCAB_SLACK (llama.cpp's rule for its draft models)."""
    a, b = target.metadata, draft.metadata
    ma, mb = a.get("tokenizer.ggml.model"), b.get("tokenizer.ggml.model")
    if ma != mb:
        raise ModelError(f"draft model {draft.path}: its tokenizer is {mb!r}, the model's is {ma!r}")
    ta, tb = list(a.get("tokenizer.ggml.tokens") or ()), list(b.get("tokenizer.ggml.tokens") or ())
    if not ta or not tb:
        raise ModelError(f"draft model {draft.path}: a file without tokenizer.ggml.tokens cannot be compared")
    if abs(len(ta) - len(tb)) > VOCAB_SLACK:
        raise ModelError(f"draft model {draft.path}: {len(tb)} tokens against the model's {len(ta)} (at most "
                         f"{VOCAB_SLACK} apart)")
    bad = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), None)
    if bad is not None:
        raise ModelError(f"draft model {draft.path}: token {bad} is {tb[bad]!r} there and {ta[bad]!r} in the model")


class DraftBudget:
    """How many draft tokens to propose next for one sequence, and when: the count doubles after a
    full acceptance (up to `most`) and falls to one more than the accepted count after a partial
    one; a proposal with nothing kept, or none to make, pauses drafting for 1, 3, 7, ... steps (up
    to MAX_PAUSE) as such misses repeat, so text the drafts cannot guess pays for a few rows, not
    one every step, and a GPU's overlapped decode runs in the pauses."""

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
            self.missed()
            self.next = 1
        else:
            self.misses = 0
            self.next = min(self.most, 2 * self.next) if accepted >= proposed else min(self.most, accepted + 1)

    def missed(self) -> None:
        """A proposal with nothing kept, or none to make (no suffix matched): pause (steps a
        sequence does not draft may overlap on a GPU: scheduler.continue_decode)."""
        self.misses += 1
        self.pause = min(self.MAX_PAUSE, 2 ** self.misses - 1)
