"""One scenario run by tests/parallel/test_tp_gloo.py in a fresh process, split over `tp` ranks
(this process is rank 0 and starts the others): teacher-forced logits of prompts, decode
batches and a mixed step, straight through the backend; then greedy and seeded generations
through the engine, and greedy ones reusing a cached prefix block. Everything is saved to OUT
for the test to compare across tp.

    python tp_scenario.py MODEL TP OUT
"""

import sys

import torch

import minfer
from minfer.backends.base import Batch


def main(path: str, tp: int, out: str) -> None:
    with minfer.load(path, tp=tp, n_ctx=64, n_slots=2, progress=False) as m:
        be, v = m.engine.backend, m.n_vocab
        a, b = [(7 * i + 3) % v for i in range(9)], [(11 * i + 5) % v for i in range(5)]
        res = {"prefill_a": be.forward(Batch.single(a, 0, slot=0, rows=range(9))),
               "prefill_b": be.forward(Batch.single(b, 0, slot=1, rows=range(5)))}
        decode = []
        for k in range(4):  # two sequences decoding together, tokens forced
            batch = Batch.build([(0, 9 + k, [(13 * k + 1) % v]), (1, 5 + k, [(17 * k + 2) % v])], [0, 1], n_decode=2)
            decode.append(be.forward(batch))
        res["decode"] = torch.stack(decode)
        mixed = Batch.build([(0, 13, [4 % v]), (1, 9, [5 % v, 6 % v, 7 % v])], [0, 3], n_decode=1)
        res["mixed"] = be.forward(mixed)
        greedy = m.generate_batch(["Once upon a time", "the cat sat"], max_tokens=16, temperature=0, ignore_eos=True)
        res["greedy"] = [r.token_ids for r in greedy]
        sampled = m.generate_batch(["Once upon a time"], max_tokens=16, temperature=0.9, seed=5, ignore_eos=True)
        res["sampled"] = sampled[0].token_ids
        # the prefix cache: a 32-token block cached by one request, then kept by one and copied
        # into the other slot (every rank's KV copied) for two requests decoding together
        shared = [(5 * i + 2) % v for i in range(34)]
        params = minfer.api.SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        m.engine.run([m.engine.add(shared + [1], params)])
        rows = range(34, 36)  # (the logits of the tokens after the block: they read the reused keys/values)
        seqs = [m.engine.add(shared + [k, k + 1], params, logit_rows=rows) for k in (2, 3)]
        m.engine.run(seqs)
        res["prefix"] = ([s.generated for s in seqs], [s.stats.cached_tokens for s in seqs])
        res["prefix_logits"] = torch.stack([torch.cat(s.prompt_logits) for s in seqs])
        fresh = [m.engine.add(shared + [k, k + 1], params, logit_rows=rows, reuse_prefix=False) for k in (2, 3)]
        m.engine.run(fresh)
        res["prefix_fresh"] = torch.stack([torch.cat(s.prompt_logits) for s in fresh])
        res["tp_world"] = m.engine.graph.meta.get("tp_world", 1)
    torch.save(res, out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
