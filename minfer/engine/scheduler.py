"""The scheduler: which sequences run in the next step, in which KV-cache slot, with which tokens.

Sequences wait in arrival order and are admitted when a slot is free (first come, first
served). Each step is ONE batch: the next token of every sequence that is generating, plus
chunks of at most `prefill_seqs` sequences' prompts (`prefill_chunk` tokens each, fewer at a
prompt's end or when `max_batch_tokens` binds), in admission order. A long prompt therefore
never stalls the running sequences for longer than one chunk. One prompt per step (the cpu
backend's default) keeps every row's numbers independent of the other requests; several (the
cuda default) fill the GPU when many requests arrive at once.

A new sequence goes to the free slot whose cached tokens its prompt continues (the longest
such; ties and no match: the least recently used slot), and only the rest of its prompt is run:
a chat's next turn pays only for the new turn. At least the prompt's last token always runs,
since its logits give the first new token. A slot's own tokens are reused whole only when the
prompt extends ALL of them (a chat continuation, which may include rows the decode path
computed); a partial match such as a shared system prompt is reused only through the prefix
cache below, block by block, and only rows that a fresh run computes the same way: otherwise one
request's numbers would depend on which request ran before it (rows computed in other chunks,
or by the decode path, whose bfloat16 rounding turns such differences into different tokens).

Across requests (a shared system prompt, an agent's growing context), the prefix cache
(engine/prefix.py) reuses whole blocks of `prefix_block` prompt tokens from ANY slot: the new
sequence's slot gets them by one KV copy from the slot that holds them (the step's `copies`,
made by the engine before the step runs). Its numbers stay those of a fresh run: prompt chunks
end at block boundaries (except at the prompt's end), so a block's rows are always computed by
a chunk that starts at a block boundary, and only such blocks are ever reused. A waiting request
whose prefix a running prompt is still computing waits for those blocks (requests that arrive
together with one system prompt compute it once).

The scheduler owns slots and queues; it never touches tensors except to hand logits rows to the
sequences' samplers (`postprocess`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from ..backends.base import Batch
from ..errors import MinferError
from .logprobs import token_logprobs
from .prefix import PrefixCache
from .sequence import Sequence, Status


@dataclass
class ScheduledStep:
    """One step: the batch, and what its logits rows mean."""

    batch: Batch
    decode: list[Sequence]  # rows 0..len-1, one token each
    prefills: list[tuple[Sequence, int]]  # (sequence, tokens of its prompt chunk), in row order after decode
    samples: list[tuple[Sequence, int]]  # (sequence, logits row) to sample a token from
    keep: list[tuple[Sequence, list[int]]]  # (sequence, logits rows) of prompt positions to store
    hidden: bool = False  # an embedding step: its rows are final hidden states, not logits
    copies: list[tuple[int, int, int]] = field(default_factory=list)  # (from slot, to slot, tokens): KV to copy first
    drafts: dict[int, list[int]] = field(default_factory=dict)  # id(sequence) -> its draft tokens (speculative rows)


def _continued(cached: list[int], prompt: list[int]) -> int:
    """len(cached) when `prompt` starts with every cached token, else 0."""
    n = len(cached)
    return n if n and n <= len(prompt) and prompt[:n] == cached else 0


class Scheduler:
    def __init__(self, n_slots: int, n_ctx: int, prefill_chunk: int, max_batch_tokens: int,
                 device: str | torch.device = "cpu", prefill_seqs: int = 1, prefix_block: int = 32,
                 prefix_cache: bool = True, argmax=None):
        """`prefix_block`: the prefix cache's block size, which prompt chunks are aligned to
        whether the cache is on or not; `prefix_cache`: reuse cached blocks across requests;
        `argmax`: the greedy rows' picks from their logits (Backend.greedy_tokens; default torch's)."""
        if min(n_slots, n_ctx, prefill_chunk) < 1 or max_batch_tokens < n_slots + 1:
            raise MinferError(f"scheduler: slots {n_slots}, context {n_ctx} and prefill chunk {prefill_chunk} must "
                              f"be >= 1 and max_batch_tokens ({max_batch_tokens}) >= slots + 1")
        self.n_slots, self.n_ctx = n_slots, n_ctx
        self.prefill_chunk, self.max_batch_tokens = prefill_chunk, max_batch_tokens
        self.prefill_seqs = max(1, prefill_seqs)
        self.device = device
        self.argmax = argmax or (lambda logits: logits.argmax(-1).tolist())
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free: set[int] = set(range(n_slots))
        self.slot_tokens: list[list[int]] = [[] for _ in range(n_slots)]  # what a free slot's cache holds
        self._last_used = [0] * n_slots
        self._clock = 0
        self._embedded = False  # the last step ran embedding chunks
        self.block = max(1, prefix_block)
        self.prefix = PrefixCache(n_slots, self.block) if prefix_cache else None
        self._copies: list[tuple[int, int, int]] = []  # made by admissions of the step being formed

    # ------------------------------------------------------------------ queue
    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        """End `seq` now ("abort"); a running one gives its slot back (its cached tokens stay
        reusable)."""
        if seq.finished:
            return
        if seq.status is Status.WAITING:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        seq.finish("abort")
        self._release(seq)

    def forget(self) -> None:
        """Drop what free slots remember: the next sequences run their whole prompts."""
        for slot in self.free:
            self.slot_tokens[slot] = []
        if self.prefix is not None:
            self.prefix.forget(self.free)

    @property
    def slots_in_use(self) -> int:
        return self.n_slots - len(self.free)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ slots
    def _admit(self, seq: Sequence) -> None:
        """Give `seq` the free slot that holds most of its prompt (a chat continuation, or its
        cached blocks; ties: the least recently used), then copy in any longer cached prefix
        another slot holds."""
        B, reuse, prefix = self.block, seq.reuse_prefix, self.prefix
        limit = seq.n_prompt - 1  # (the prompt's last token always runs: its logits give the first token)
        if seq.logit_rows is not None and len(seq.logit_rows):
            limit = min(limit, seq.logit_rows.start)
        own = {slot: prefix.depth(slot, seq.prompt, limit // B) if prefix is not None and reuse else 0
               for slot in self.free}

        def score(slot: int) -> tuple[int, int]:
            shared = _continued(self.slot_tokens[slot], seq.prompt) if reuse else 0
            return max(shared, own[slot] * B), -self._last_used[slot]

        slot = max(sorted(self.free), key=score)
        keep = min(score(slot)[0], limit)
        blocks = own[slot] if keep == own[slot] * B else min(own[slot], keep // B)
        exact = keep == blocks * B  # what the slot keeps is cached blocks only: new blocks may join them
        if prefix is not None and reuse:
            n, src = prefix.lookup(seq.prompt, limit // B)
            if n * B > keep and src is not None and src != slot:
                self._copies.append((src, slot, n * B))
                keep, blocks, exact = n * B, n, True
        if prefix is not None:
            prefix.copied(slot, seq.prompt, blocks)
        self.free.discard(slot)
        self.slot_tokens[slot] = []
        seq.slot, seq.n_cached, seq.status = slot, keep, Status.RUNNING
        seq.prefix_exact = exact
        seq.stats.cached_tokens = keep
        self.running.append(seq)

    def _computing(self, seq: Sequence) -> bool:
        """A running prompt is computing blocks of `seq`'s prefix that no slot holds yet: `seq`
        waits for them (requests that arrive together with one system prompt compute it once,
        then copy it) rather than compute them again."""
        if self.prefix is None or not seq.reuse_prefix:
            return False
        B = self.block
        limit = (seq.n_prompt - 1) // B
        have = self.prefix.lookup(seq.prompt, limit)[0]
        for r in self.running:
            if r.prefilling and r.prefix_exact:
                n = 0  # whole blocks the two prompts share, from the first (a block counts after its prefix)
                while n < limit and (n + 1) * B <= r.n_prompt and \
                        r.prompt[n * B:(n + 1) * B] == seq.prompt[n * B:(n + 1) * B]:
                    n += 1
                if n > have:
                    return True
        return False

    def _release(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        if seq.slot is not None and seq.slot not in self.free:
            self.slot_tokens[seq.slot] = seq.tokens[:seq.n_cached]
            self._clock += 1
            self._last_used[seq.slot] = self._clock
            self.free.add(seq.slot)

    # ------------------------------------------------------------------ steps
    def schedule(self) -> ScheduledStep | None:
        """The next step, or None when nothing is waiting or running. A step holding embedding
        chunks holds nothing else (its rows return hidden states, not logits); when one is next
        in line and sequences are generating, embedding and generating steps alternate."""
        decode = [s for s in self.running if not s.prefilling]
        waiting = [s for s in self.running if s.prefilling]  # admitted, prompt not done (admission order)
        head = waiting[0] if waiting else (self.waiting[0] if self.waiting and self.free else None)
        embed = head is not None and head.pooling is not None and not (self._embedded and decode)
        self._embedded = embed
        if embed:
            decode = []
        drafts = self._drafts(decode, bool(waiting or self.waiting))
        spans = []
        rows: dict[int, int] = {}  # batch row -> index in out_rows

        def out(row: int) -> int:
            return rows.setdefault(row, len(rows))

        samples = []
        for s in decode:  # its next token's row, then one row per draft token (the same slot, the next positions)
            for i, tok in enumerate([s.tokens[-1], *drafts.get(id(s), ())]):
                samples.append((s, out(len(spans))))
                spans.append((s.slot, s.n_cached + i, [tok]))
        keep: list[tuple[Sequence, list[int]]] = []
        prefills: list[tuple[Sequence, int]] = []
        n_decode = len(spans)
        budget = self.max_batch_tokens - n_decode
        offset = n_decode
        while budget > 0 and len(prefills) < self.prefill_seqs:
            if len(prefills) == len(waiting):
                if not (self.waiting and self.free) or (self.waiting[0].pooling is not None) != embed:
                    break
                if self._computing(self.waiting[0]):
                    break
                self._admit(self.waiting.popleft())
                waiting.append(self.running[-1])
            pre = waiting[len(prefills)]
            if (pre.pooling is not None) != embed:
                break
            start = pre.n_cached
            chunk = min(self.prefill_chunk, budget, pre.n_prompt - start)
            end = (start + chunk) // self.block * self.block  # (a block's rows: one chunk's, from its start)
            if start + chunk < pre.n_prompt and end > start:
                chunk = end - start
            elif start + chunk < pre.n_prompt and chunk % self.block:
                if prefills and self.prefill_chunk >= self.block:  # (no room left for a whole block: next step)
                    break
                pre.prefix_exact = False  # (a chunk smaller than a block: its blocks are not cached)
            spans.append((pre.slot, start, pre.tokens[start:start + chunk]))
            if pre.logit_rows is not None:
                want = [p for p in range(start, start + chunk) if p in pre.logit_rows]
                if want:
                    keep.append((pre, [out(offset + p - start) for p in want]))
            if start + chunk == pre.n_prompt and pre.params.max_tokens != 0:
                samples.append((pre, out(offset + chunk - 1)))
            if pre.stats.first_scheduled is None:
                pre.stats.first_scheduled = time.perf_counter()
            prefills.append((pre, chunk))
            budget -= chunk
            offset += chunk
        if not decode and not prefills:
            return None
        batch = Batch.build(spans, list(rows), n_decode=n_decode, device=self.device)
        copies, self._copies = self._copies, []
        return ScheduledStep(batch, decode, prefills, samples, keep, hidden=embed, copies=copies, drafts=drafts)

    def _drafts(self, decode: list[Sequence], prompts_waiting: bool) -> dict[int, list[int]]:
        """Draft tokens of the generating sequences that have a drafter (engine/draft.py), as many
        as each one's budget, its context, its max_tokens and the step's row budget allow (a
        prompt chunk waiting keeps its `prefill_chunk` rows)."""
        room = self.max_batch_tokens - len(decode) - (self.prefill_chunk if prompts_waiting else 0)
        asks: dict[int, tuple[object, list[tuple[Sequence, int]]]] = {}  # one call per drafter (a draft model: one)
        for s in decode:
            if s.drafter is None or room <= 0 or not s.draft_budget.ready():
                continue
            k = min(s.draft_budget.next, room, self.n_ctx - len(s.tokens))  # (rows end at position n_ctx - 1)
            if s.params.max_tokens is not None:
                k = min(k, s.params.max_tokens - len(s.generated) - 1)  # (a step samples k + 1 tokens at most)
            if k > 0:
                asks.setdefault(id(s.drafter), (s.drafter, []))[1].append((s, k))
                room -= k
        out: dict[int, list[int]] = {}
        for drafter, items in asks.values():
            for (s, _), draft in zip(items, drafter.draft(items), strict=True):
                if draft:
                    out[id(s)] = draft
                else:
                    s.draft_budget.missed()
        return out

    def continue_decode(self, step: ScheduledStep) -> ScheduledStep | None:
        """The decode step that follows `step` (launched, its tokens not read yet) when nothing can
        change it: the same sequences in the same rows, each one position further, none of which
        ends at `step` by its length, with no prompt to run and no one waiting for a free slot.
        None otherwise. Its input tokens are `step`'s, which only the device knows yet
        (batch.tokens holds placeholders); a sequence that ends at `step` by an end token or a
        stop string wastes its row of the next step, whose token postprocess drops."""
        seqs = step.decode
        if step.prefills or not seqs or len(self.running) != len(seqs) or (self.waiting and self.free):
            return None
        drafting = [s.draft_budget for s in seqs if s.drafter is not None]
        if any(not b.pause for b in drafting):  # (its drafts would depend on the tokens not read yet)
            return None
        for s in seqs:
            if s.finished or s.prefilling or len(s.tokens) + 1 >= self.n_ctx or (
                    s.params.max_tokens is not None and len(s.generated) + 1 >= s.params.max_tokens):
                return None
        for b in drafting:  # (every drafting sequence is pausing: this step counts as one of its pauses)
            b.ready()
        spans = [(s.slot, s.n_cached + 1, [0]) for s in seqs]
        batch = Batch.build(spans, list(range(len(seqs))), n_decode=len(seqs), device=self.device)
        return ScheduledStep(batch, list(seqs), [], [(s, i) for i, s in enumerate(seqs)], [])

    def postprocess(self, step: ScheduledStep, logits: torch.Tensor | None = None,
                    picked: list[int] | None = None) -> list[tuple[Sequence, int, int]]:
        """Advance the step's sequences: cached counts, stored prompt logits, one sampled token
        each; release the slots of those that finished. `picked`: the token of every row, picked
        greedily on the device, instead of logits. Returns (sequence, token, logits row) for
        every token sampled."""
        now = time.perf_counter()
        for s in step.decode:
            if not s.finished and id(s) not in step.drafts:  # (a sequence that ended at the step before keeps its
                s.n_cached += 1  # count; a drafting one counts the rows it keeps, below)
        for pre, chunk in step.prefills:
            pre.n_cached += chunk
            if self.prefix is not None and pre.prefix_exact:
                self.prefix.register(pre.slot, pre.prompt, pre.n_cached)
        for seq, idx in step.keep:  # (indexing copies; host tensors whatever the backend)
            seq.prompt_logits.append(logits[idx].cpu())
        live = [(seq, row) for seq, row in step.samples if not seq.finished]  # (aborted ones are skipped)
        # plain greedy rows: one argmax over all of them (one device read on a GPU); the rest go
        # through their own samplers, on host copies of their rows
        greedy = [r for s, r in live if s.params.greedy and not s.params.penalized]
        other = [r for s, r in live if not (s.params.greedy and not s.params.penalized)]
        tokens: dict[int, int] = {}  # logits row -> its token (a sampler's: drawn below, in order)
        if picked is not None:
            if not all(s.device_pickable for s, _ in live):
                raise MinferError("scheduler: tokens picked on the device need rows without penalties or logprobs")
            tokens.update((r, picked[r]) for _, r in live)
            other = []
        elif greedy:
            picked = self.argmax(logits if greedy == list(range(logits.shape[0])) else logits[greedy])
            tokens.update(zip(greedy, picked, strict=True))
        host = dict(zip(other, logits[other].float().cpu(), strict=True)) if other else {}
        rows_of: dict[int, tuple[Sequence, list[int]]] = {}  # a sequence's rows, in order (several: drafts)
        for seq, row in live:
            rows_of.setdefault(id(seq), (seq, []))[1].append(row)
        sampled = []
        for seq, rows in rows_of.values():
            draft = step.drafts.get(id(seq))
            for i, row in enumerate(rows):
                # a draft row's token is the one its sampler draws there (the same counter-based
                # random number as without drafts): kept rows give exactly the tokens decoding one
                # by one would, and a draft token is kept with probability p(draft), as in the
                # standard rejection rule
                tok = tokens[row] if row in tokens else seq.sampler(host[row], seq.tokens, len(seq.generated))
                if seq.logprobs_n is not None:
                    seq.logprobs.append(token_logprobs(logits[row], tok, seq.logprobs_n))
                seq.append(tok, self.n_ctx, now)
                sampled.append((seq, tok, row))
                if draft is None:
                    break
                seq.n_cached += 1  # (row i's input token is the sequence's: its keys and values stand)
                if seq.finished or i == len(draft) or tok != draft[i]:
                    seq.draft_budget.update(len(draft), i)
                    seq.stats.draft_tokens += len(draft)
                    seq.stats.draft_accepted += i
                    break
        pres = [pre for pre, _ in step.prefills]
        for pre in pres:
            if not pre.prefilling and pre.params.max_tokens == 0:
                pre.finish("stop" if pre.pooling is not None else "length")
        for seq in [*step.decode, *pres]:
            if seq.finished:
                self._release(seq)
        return sampled
