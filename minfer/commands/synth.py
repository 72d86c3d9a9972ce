"""`minfer synth PRESET QUANT OUT.gguf`: a random-weight GGUF in the exact shapes of a real model."""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def add_parser(sub) -> None:
    from ..gguf import presets  # plain data: the writer (numpy) is imported when the command runs

    p = sub.add_parser("synth", help="write a random-weight GGUF in the exact shapes of a real model",
                       description=presets.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("preset", choices=list(presets.PRESETS))
    p.add_argument("quant", choices=presets.QUANTS)
    p.add_argument("out", type=Path, help="output .gguf path")
    p.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the preset's)")
    p.add_argument("--logit-scale", type=float, default=1.0,
                   help="tiny presets: multiply the logits by this factor (the output norm's weights; default 1): "
                        "a decisive model for greedy comparisons")
    p.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    from ..gguf.synth import synth

    t0 = time.perf_counter()
    path = synth(a.preset, a.quant, a.out, seed=a.seed, vocab=a.vocab, logit_scale=a.logit_scale, progress=None)
    print(f"wrote {path}: {a.preset} {a.quant}, {path.stat().st_size / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s")
    return 0
