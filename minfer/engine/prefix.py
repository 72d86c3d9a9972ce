"""The prefix cache: which whole blocks of prompt tokens each KV-cache slot holds, so that a new
request reuses every cached block of its prompt's prefix, from whichever slot holds it.

A block is `block` consecutive prompt tokens at positions i*block .. (i+1)*block. Its key is a
hash chain: key(i) = hash(key(i-1), tokens of block i), so equal keys mean the same WHOLE prefix
0..(i+1)*block (a block is never reused after a different prefix; the tokens are compared too,
so a hash collision cannot reuse a wrong block). A slot holding block i's key therefore holds
every block before it, at the same positions: reusing n blocks is one copy of positions
0..n*block from a source slot into the new sequence's slot (Backend.copy_kv), or nothing when
the new sequence gets the slot that holds them.

Only blocks computed by prompt chunks that started at a block boundary after an exact prefix
are registered (never rows a decode step computed, never rows after a whole-slot chat
continuation), so a reused block holds exactly the values a fresh run computes (the
scheduler cuts prompt chunks at block boundaries). A slot's blocks stay until the slot is given
to a sequence that does not keep them: free slots are handed out least recently used first,
which makes eviction LRU over the slots' blocks.

This is bookkeeping only: the scheduler asks it, the engine makes the copies.
"""

from __future__ import annotations

from ..errors import MinferError


def block_keys(tokens: list[int], block: int, n_blocks: int) -> list[int]:
    """The chain keys of the first `n_blocks` whole blocks of `tokens`."""
    keys, h = [], 0
    for i in range(n_blocks):
        h = hash((h, tuple(tokens[i * block:(i + 1) * block])))
        keys.append(h)
    return keys


class PrefixCache:
    def __init__(self, n_slots: int, block: int):
        if block < 1:
            raise MinferError(f"prefix cache: the block size must be >= 1 token, got {block}")
        self.block = block
        self.slot_tokens: list[list[int]] = [[] for _ in range(n_slots)]  # the registered blocks' tokens
        self.slot_keys: list[list[int]] = [[] for _ in range(n_slots)]
        self.holders: dict[int, set[int]] = {}  # key -> slots holding that block

    def depth(self, slot: int, prompt: list[int], limit: int) -> int:
        """Blocks (at most `limit`) of `prompt` that `slot` holds."""
        n = 0
        for have, want in zip(self.slot_keys[slot], block_keys(prompt, self.block, limit), strict=False):
            if have != want:
                break
            n += 1
        while n and self.slot_tokens[slot][:n * self.block] != prompt[:n * self.block]:
            n -= 1  # (a hash collision: never trust the key alone)
        return n

    def lookup(self, prompt: list[int], limit: int) -> tuple[int, int | None]:
        """(blocks, a slot holding them): the longest cached prefix of `prompt`, at most `limit`
        whole blocks; (0, None) when its first block is nowhere."""
        best, where = 0, None
        for i, key in enumerate(block_keys(prompt, self.block, limit)):
            slots = self.holders.get(key)
            if not slots:
                break
            best, where = i + 1, min(slots)
        if where is not None:
            best = self.depth(where, prompt, best)
        return best, (where if best else None)

    def keep(self, slot: int, n_blocks: int) -> None:
        """`slot` now holds only its first `n_blocks` blocks (the rest is about to be overwritten)."""
        for key in self.slot_keys[slot][n_blocks:]:
            held = self.holders.get(key)
            if held is not None:
                held.discard(slot)
                if not held:
                    del self.holders[key]
        del self.slot_keys[slot][n_blocks:]
        del self.slot_tokens[slot][n_blocks * self.block:]

    def copied(self, slot: int, prompt: list[int], n_blocks: int) -> None:
        """`slot` was given a sequence whose first `n_blocks` blocks are now in it (kept or copied)."""
        self.keep(slot, 0)
        self.register(slot, prompt, n_blocks * self.block)

    def register(self, slot: int, prompt: list[int], n_tokens: int) -> None:
        """`slot` holds exact values of `prompt`'s first `n_tokens` tokens: record its whole blocks."""
        n = min(n_tokens, len(prompt)) // self.block
        have = len(self.slot_keys[slot])
        if n <= have:
            return
        keys = block_keys(prompt, self.block, n)
        for key in keys[have:]:
            self.holders.setdefault(key, set()).add(slot)
        self.slot_keys[slot] = keys
        self.slot_tokens[slot] = list(prompt[:n * self.block])

    def forget(self, slots) -> None:
        for slot in slots:
            self.keep(slot, 0)

    @property
    def cached_blocks(self) -> int:
        return len(self.holders)
