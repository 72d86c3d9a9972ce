"""The prefix cache across slots on a GPU backend (its `copy_kv`), shared by the cuda and vulkan tests."""

from __future__ import annotations

from minfer.api import load
from minfer.engine.params import SamplingParams


def prefix_cache_runs(path, device: str) -> None:
    """Requests sharing a 40-token prefix, the later ones given its blocks by a KV copy from a
    running sequence's slot (in queue order before their chunk), decode the greedy tokens of the
    same requests with the cache off."""
    shared = list(range(3, 43))
    prompts = [shared + [50 + i, 60 + i] for i in range(3)]
    runs = []
    for on in (True, False):
        m = load(path, device, n_ctx=96, n_slots=3, progress=False, prefix_cache=on, prefix_block=8, prefill_seqs=1)
        eng = m.engine
        params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        first = eng.add(prompts[0], params)
        while first.prefilling:
            eng.step()
        rest = [eng.add(p, params) for p in prompts[1:]]  # (first is decoding: its slot is the source)
        eng.run([first, *rest])
        runs.append(([s.generated for s in (first, *rest)], [s.stats.cached_tokens for s in rest]))
        m.close()
    (on_tokens, on_cached), (off_tokens, off_cached) = runs
    assert on_cached == [40, 40] and off_cached == [0, 0]
    assert on_tokens == off_tokens and all(len(t) == 8 for t in on_tokens)
