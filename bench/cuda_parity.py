"""cuda (or vulkan: --device) vs cpu on one model: teacher-forced prompt logits, decode-step logits, greedy agreement.

Usage: python bench/cuda_parity.py MODEL.gguf [--tokens 64] [--steps 32] [--device cuda|vulkan]
Prints one RESULT line: relative error of the prompt's logits and of the decode steps' logits
(||cuda - cpu|| / ||cpu||, the cpu's exact float32 path as reference), and how many greedy
decode steps with a top-1/top-2 margin >= 0.5 agree.
"""

from __future__ import annotations

import argparse

import torch

from minfer.api import load
from minfer.backends.base import Batch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--device", default="cuda", help="the backend compared with cpu (cuda, vulkan, gpu)")
    a = ap.parse_args()
    cpu = load(a.model, "cpu", n_ctx=a.tokens + a.steps + 1, n_slots=1, progress=False)
    gpu = load(a.model, a.device, n_ctx=a.tokens + a.steps + 1, n_slots=1, progress=False)
    ids = [(37 * i + 11) % cpu.n_vocab for i in range(a.tokens + a.steps)]
    ref = cpu.engine.backend.forward(Batch.single(ids, 0, rows=range(len(ids))))
    got = gpu.engine.backend.forward(Batch.single(ids[:a.tokens], 0, rows=range(a.tokens))).float().cpu()
    rel_prompt = float((got - ref[:a.tokens]).norm() / ref[:a.tokens].norm())
    steps = []
    for p in range(a.tokens, a.tokens + a.steps):
        steps.append(gpu.engine.backend.forward(Batch.build([(0, p, [ids[p]])], [0], n_decode=1))[0].float().cpu())
    dec = torch.stack(steps)
    want = ref[a.tokens:]
    rel_dec = float((dec - want).norm() / want.norm())
    top2 = want.topk(2, -1).values
    decisive = (top2[:, 0] - top2[:, 1]) >= 0.5
    agree = (dec.argmax(-1) == want.argmax(-1)) & decisive
    print(f"RESULT {a.device} {a.model}: prompt_rel={rel_prompt:.2e} decode_rel={rel_dec:.2e} "
          f"greedy_agree={int(agree.sum())}/{int(decisive.sum())} (decisive steps)")


if __name__ == "__main__":
    main()
