"""`minfer run`: generate a continuation of one prompt, streamed to stdout."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import common


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="generate a continuation of a prompt, streamed to stdout",
                       description="Generate text from a prompt (special tokens like <|im_start|> are parsed). "
                                   "Prints prefill and decode tok/s on stderr.")
    common.add_model_args(p)
    common.add_sampling_args(p, n_predict=128)
    p.add_argument("--trace", default=None, metavar="PATH", help="record a trace of the run (as MINFER_TRACE)")
    p.add_argument("-p", "--prompt", dest="prompt_flag", default=None, help="the prompt text")
    p.add_argument("-f", "--file", type=Path, default=None, help="read the prompt from this file")
    p.add_argument("prompt", nargs="?", default=None, help="the prompt text; - reads it from stdin")
    p.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    params = common.sampling(a)
    config = common.engine_config(a, trace_path=a.trace, n_slots=1)
    if common.follower(a, config):
        return 0
    prompt = common.read_prompt(a)
    m = common.load_model(a, config)
    try:
        for piece in m.generate(prompt, stream=True, params=params):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        common.print_stats(m)
    finally:
        common.close_model(m, config)
    return 0
