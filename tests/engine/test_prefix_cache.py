"""The prefix cache across requests (engine/prefix.py) on a backend that models its KV cache.

`KVBackend` keeps, per slot, the token written at each position (its "keys/values"), and a
row's logits depend on EVERY cached token of its slot up to its position: a row that read a
wrong, stale or never-written cache entry gives different tokens (or fails), so reuse across
slots is checked by the outputs, against the same requests with the cache off.
"""

from __future__ import annotations

import random

import pytest
import torch

from minfer.backends.base import Batch
from minfer.config import EngineConfig
from minfer.engine.engine import Engine
from minfer.engine.params import SamplingParams
from minfer.engine.prefix import PrefixCache

from .test_scheduler import GREEDY, NEXT, PieceTokenizer, ScriptedBackend, V

B = 4  # block size of these tests


class KVBackend(ScriptedBackend):
    kv_copy = True
    PULL = 1.0  # added to the successor's logit (NEXT): a weak pull, most tokens depend on the whole history

    def __init__(self):
        super().__init__()
        self.copies: list[tuple[int, int, int]] = []
        self.kv: list[list[int | None]] = []

    def allocate(self, n_slots: int, n_ctx: int) -> None:
        self.kv = [[None] * n_ctx for _ in range(n_slots)]

    def copy_kv(self, src: int, dst: int, n: int) -> None:
        self.copies.append((src, dst, n))
        self.kv[dst][:n] = self.kv[src][:n]

    def forward(self, batch: Batch, recorder=None) -> torch.Tensor:
        self.batches.append(batch)
        owner = []  # row -> (slot, position)
        for sp in batch.spans:
            for i in range(sp.n_tokens):
                self.kv[sp.slot][sp.start + i] = int(batch.tokens[sp.offset + i])
                owner.append((sp.slot, sp.start + i))
        rows = batch.out_rows.tolist()
        out = torch.empty(len(rows), V)
        for i, r in enumerate(rows):
            slot, p = owner[r]
            seen = self.kv[slot][:p + 1]
            assert None not in seen, f"slot {slot} read a position never written"
            g = torch.Generator().manual_seed(hash(tuple(seen)) % (1 << 31))
            out[i] = torch.randn(V, generator=g)
            out[i, NEXT[seen[-1]]] += self.PULL
        return out


def make(n_slots=3, n_ctx=96, chunk=8, **cfg) -> tuple[Engine, KVBackend]:
    be = KVBackend()
    config = EngineConfig(n_slots=n_slots, n_ctx=n_ctx, prefill_chunk=chunk, prefix_block=B, **cfg)
    be.allocate(n_slots, n_ctx)
    return Engine(be, n_vocab=V, n_ctx=n_ctx, n_slots=n_slots, config=config, tokenizer=PieceTokenizer()), be


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True, **GREEDY)


def test_a_shared_prefix_is_copied_from_a_running_sequence_and_decodes_as_a_fresh_run():
    system = list(range(1, 21))  # five blocks
    eng, be = make()
    a = eng.add(system + [30, 31], greedy(40))
    while a.prefilling:
        eng.step()
    b = eng.add(system + [29, 28, 27], greedy(6))  # a is still running: its slot is the source
    eng.run([a, b])
    assert be.copies == [(a.slot, b.slot, 20)] and b.stats.cached_tokens == 20
    off, _ = make(prefix_cache=False)
    fresh = off.add(system + [29, 28, 27], greedy(6))
    off.run([fresh])
    assert fresh.stats.cached_tokens == 0 and b.generated == fresh.generated


def test_a_changed_token_misses_from_its_block_on():
    eng, be = make(n_slots=2)
    prompt = list(range(1, 25))
    eng.run([eng.add(prompt, greedy(2))])
    changed = list(prompt)
    changed[9] = 31  # inside block 2 (positions 8..11)
    seq = eng.add(changed, greedy(2))
    eng.run([seq])
    assert seq.stats.cached_tokens == 8
    assert be.batches[-3].spans[-1].start == 8  # its first chunk starts at the changed block


def test_the_least_recently_used_slot_is_evicted():
    eng, _ = make(n_slots=2)
    p1, p2, p3 = ([k] * 12 + [k + 1] for k in (1, 5, 9))
    for p in (p1, p2, p3):  # p3 takes p1's slot: the least recently used
        eng.run([eng.add(p, greedy(1))])
    again2, again1 = eng.add(p2, greedy(1)), eng.add(p1, greedy(1))
    eng.run([again2])
    eng.run([again1])
    assert again2.stats.cached_tokens == 12 and again1.stats.cached_tokens == 0


def test_prompt_chunks_end_at_block_boundaries():
    eng, be = make(chunk=6)  # (not a multiple of the block: cut down to one, except the last, which ends the prompt)
    eng.run([eng.add(list(range(1, 15)), greedy(1))])
    assert [(b.spans[0].start, b.spans[0].n_tokens) for b in be.batches[:3]] == [(0, 4), (4, 4), (8, 6)]


def test_reuse_can_be_refused_and_the_cache_turned_off():
    prompt = list(range(1, 18))
    eng, be = make()
    eng.run([eng.add(prompt, greedy(1))])
    refused = eng.add(prompt[:-1] + [3], greedy(1), reuse_prefix=False)
    eng.run([refused])
    assert refused.stats.cached_tokens == 0
    off, be_off = make(prefix_cache=False)
    off.run([off.add(prompt, greedy(1))])
    other = off.add(prompt[:-1] + [3], greedy(1))
    off.run([other])
    assert other.stats.cached_tokens == 0 and be_off.copies == []


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_concurrent_requests_decode_the_same_with_the_cache_on_and_off(seed):
    """Requests sharing prefixes of several lengths arrive while others run, more than the slots:
    every output equals the cache-off one, and the cache saved prompt tokens."""
    rng = random.Random(seed)
    bases = [[rng.randrange(1, V) for _ in range(n)] for n in (13, 22, 9)]
    prompts = [rng.choice(bases)[:rng.randrange(5, 23)] + [rng.randrange(1, V) for _ in range(rng.randrange(1, 6))]
               for _ in range(14)]
    lengths = [rng.randrange(1, 7) for _ in prompts]
    outs, runs = [], []
    for on in (True, False):
        eng, _ = make(n_slots=3, chunk=8, prefix_cache=on)
        arrivals = random.Random(seed + 100)  # (the same arrivals in both runs)
        seqs, pending = [], list(zip(prompts, lengths, strict=True))
        while pending or any(not s.finished for s in seqs):
            for _ in range(arrivals.randrange(0, 3)):  # arrivals between steps
                if pending:
                    prompt, n = pending.pop(0)
                    seqs.append(eng.add(prompt, greedy(n)))
            eng.step()
        outs.append([s.generated for s in seqs])
        runs.append(sum(s.n_prompt - s.stats.cached_tokens for s in seqs))
    assert outs[0] == outs[1]
    assert runs[0] < runs[1]


def test_the_index_never_trusts_a_key_without_its_tokens():
    cache = PrefixCache(2, B)
    cache.register(0, [1, 2, 3, 4, 5, 6, 7, 8], 8)
    assert cache.lookup([1, 2, 3, 4, 5, 6, 7, 8, 9], 2) == (2, 0)
    assert cache.lookup([1, 2, 3, 4, 5, 6, 7, 9, 9], 2) == (1, 0)
    cache.slot_tokens[0][5] = 0  # (as if another prefix had collided with block 1's key)
    assert cache.lookup([1, 2, 3, 4, 5, 6, 7, 8, 9], 2) == (1, 0)
    cache.keep(0, 0)
    assert cache.lookup([1, 2, 3, 4, 5, 6, 7, 8, 9], 2) == (0, None) and cache.cached_blocks == 0


def test_requests_arriving_together_compute_their_shared_prefix_once():
    system = list(range(1, 21))
    eng, be = make(n_slots=3, chunk=8, prefill_seqs=3, max_batch_tokens=11)
    seqs = [eng.add(system + [25 + i, 20 - i], greedy(3)) for i in range(3)]
    eng.run(seqs)
    assert [s.stats.cached_tokens for s in seqs] == [0, 20, 20]
    assert sum(sp.n_tokens for b in be.batches for sp in b.spans[b.n_decode:]) == 22 + 2 + 2
    off, _ = make(n_slots=3, chunk=8, prefill_seqs=3, max_batch_tokens=11, prefix_cache=False)
    plain = [off.add(s.prompt, greedy(3)) for s in seqs]
    off.run(plain)
    assert [s.generated for s in seqs] == [s.generated for s in plain]


def test_a_request_waits_only_for_blocks_of_its_own_prefix():
    """A running prompt that shares later blocks' tokens but not the first block computes nothing
    the waiting request could reuse (a block counts only after its whole prefix): the request is
    admitted at once, with the blocks that are cached."""
    eng, _ = make(n_slots=3, chunk=8, prefill_seqs=3, max_batch_tokens=11)
    eng.run([eng.add(list(range(1, 9)) + [30, 31], greedy(1))])  # caches blocks [1..4], [5..8]
    running = eng.add([9, 9, 9, 9, 5, 6, 7, 8] + list(range(10, 26)), greedy(1))
    waiting = eng.add(list(range(1, 9)) + list(range(10, 26)), greedy(1))  # blocks 1.. equal running's
    eng.step()
    assert running.slot is not None and waiting.slot is not None and waiting.stats.cached_tokens == 8
