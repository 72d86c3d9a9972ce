"""tests/parallel/test_tp_gloo.py's run of the cuda backend split over `tp` ranks under the
Triton interpreter (TRITON_INTERPRET=1: host tensors, gloo between the ranks): a prompt, a
decode batch, two decode steps picked on the device (the second reading the first's tokens on
the device), a greedy and a seeded sampled generation (tokens picked on the device).
Saved to OUT.

    TRITON_INTERPRET=1 python tp_cuda_scenario.py MODEL TP OUT
"""

import sys

import torch

import minfer
from minfer.backends.base import Batch


def main(path: str, tp: int, out: str) -> None:
    with minfer.load(path, device="cuda", tp=tp, n_ctx=32, n_slots=2, progress=False) as m:
        be = m.engine.backend
        res = {"prefill": be.forward(Batch.single([1, 2, 3, 4, 5], 0, slot=0, rows=range(5))),
               "decode": be.forward(Batch.build([(0, 5, [6]), (1, 0, [7])], [0, 1], n_decode=2))}
        first = be.decode_pick(Batch.build([(0, 6, [8]), (1, 1, [9])], [0, 1], n_decode=2))
        second = be.decode_pick(Batch.build([(0, 7, [0]), (1, 2, [0])], [0, 1], n_decode=2), after=first)
        res["picked"] = [first.tokens(), second.tokens()]
        res["greedy"] = m.generate_batch(["Once upon"], max_tokens=6, temperature=0, ignore_eos=True)[0].token_ids
        # sampled on the device (the Sample contract), the parameters sent to every rank
        res["sampled"] = m.generate_batch(["Once upon"], max_tokens=6, temperature=0.9, top_k=40, seed=3,
                                          ignore_eos=True)[0].token_ids
        res["tp_world"] = m.engine.graph.meta.get("tp_world", 1)
    torch.save(res, out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
