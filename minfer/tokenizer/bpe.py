"""Byte-level BPE over one pre-tokenized word, and SentencePiece-style (SPM) merging.

Both follow llama.cpp (src/llama-vocab.cpp, `llm_tokenizer_bpe_session` / `llm_tokenizer_spm_session`):
symbols start as single characters in a doubly linked list; a heap holds every adjacent pair
that is mergeable; the best pair is merged (BPE: lowest merge rank, SPM: highest token score;
ties go to the leftmost pair), stale heap entries are skipped, and the new neighbours are pushed.
That is O(n log n) per word, so a hostile single 1 MB "word" cannot make us quadratic.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping

from .unicode import BYTE_TO_CHAR

# per-tokenizer cache of word -> ids; cleared when full so memory stays bounded
WORD_CACHE_LIMIT = 1 << 16


_POS_BITS = 32
_POS_MASK = (1 << _POS_BITS) - 1


def _merge(symbols: list[str], rank_of: Callable[[str, str], int | None]) -> list[str]:
    """Merge adjacent symbols best-first. `rank_of(left, right)` is None when the pair cannot
    merge, else its rank (smaller merges first; equal ranks merge leftmost first)."""
    n = len(symbols)
    if n < 2:
        return symbols
    text = list(symbols)
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    # heap entries: (rank << 32 | left position, merged text); one int compare orders them
    heap = []
    for i in range(n - 1):
        r = rank_of(text[i], text[i + 1])
        if r is not None:
            heap.append((r << _POS_BITS | i, text[i] + text[i + 1]))
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        key, merged = pop(heap)
        left = key & _POS_MASK
        right = nxt[left]
        # stale entry: the left symbol was absorbed, or either side has grown since the push
        if right < 0 or not text[left] or len(text[left]) + len(text[right]) != len(merged):
            continue
        text[left] = merged
        text[right] = ""
        after = nxt[right]
        nxt[left] = after
        if after >= 0:
            prv[after] = left
            r = rank_of(merged, text[after])
            if r is not None:
                push(heap, (r << _POS_BITS | left, merged + text[after]))
        before = prv[left]
        if before >= 0:
            r = rank_of(text[before], merged)
            if r is not None:
                push(heap, (r << _POS_BITS | before, text[before] + merged))
    return [t for t in text if t]


class BytePairEncoder:
    """GPT-2 style byte-level BPE: UTF-8 bytes of a word -> printable alphabet -> merges -> ids."""

    def __init__(self, token_to_id: Mapping[str, int], ranks: Mapping[tuple[str, str], int],
                 ignore_merges: bool):
        self._token_to_id = token_to_id
        self._ranks = ranks
        self._ignore_merges = ignore_merges
        self._cache: dict[str, tuple[int, ...]] = {}

    def encode_word(self, word: str) -> tuple[int, ...]:
        ids = self._cache.get(word)
        if ids is None:
            ids = self._encode(word)
            if len(self._cache) >= WORD_CACHE_LIMIT:
                self._cache.clear()
            self._cache[word] = ids
        return ids

    def _encode(self, word: str) -> tuple[int, ...]:
        encoded = "".join([BYTE_TO_CHAR[b] for b in word.encode("utf-8", "surrogatepass")])
        vocab = self._token_to_id
        if self._ignore_merges and encoded in vocab:
            return (vocab[encoded],)
        ranks = self._ranks
        out: list[int] = []
        for sym in _merge(list(encoded), lambda a, b: ranks.get((a, b))):
            tid = vocab.get(sym)
            if tid is not None:
                out.append(tid)
            else:  # a symbol that is not a token: emit its bytes, dropping those with no token
                out.extend(vocab[c] for c in sym if c in vocab)
        return tuple(out)


class SentencePieceEncoder:
    """llama.cpp's SPM tokenizer: score-ordered merges of characters into vocab tokens, then
    byte fallback (`<0xNN>` tokens) for characters that never became a token."""

    def __init__(self, token_to_id: Mapping[str, int], scores: list[float], byte_ids: list[int | None]):
        self._token_to_id = token_to_id
        # token id -> rank of its score, highest score first (equal scores share a rank)
        order = {s: r for r, s in enumerate(sorted(set(scores), reverse=True))}
        self._score_rank = [order[s] for s in scores]
        self._byte_ids = byte_ids  # byte value -> token id, None when the vocab has no token for it

    def encode(self, text: str, out: list[int]) -> None:
        vocab, score_rank = self._token_to_id, self._score_rank

        def rank_of(a: str, b: str) -> int | None:
            tid = vocab.get(a + b)
            return None if tid is None else score_rank[tid]

        for sym in _merge(list(text), rank_of):
            tid = vocab.get(sym)
            if tid is not None:
                out.append(tid)
                continue
            for byte in sym.encode("utf-8", "surrogatepass"):
                bid = self._byte_ids[byte]
                if bid is not None:
                    out.append(bid)
