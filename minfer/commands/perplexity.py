"""`minfer perplexity`: llama-perplexity's measure of a text file."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import MinferError
from . import common

DEFAULT_CHUNK = 512  # llama-perplexity's default -c


def add_parser(sub) -> None:
    p = sub.add_parser("perplexity", help="perplexity of a text file (llama-perplexity's method)",
                       description="Chunks of -c tokens, BOS first, second half of each chunk scored; "
                                   "prints each chunk's running PPL and the final PPL +/- error.")
    common.add_model_args(p, ctx_help="tokens per chunk, as llama-perplexity's -c (default 512)")
    p.add_argument("--chunk", dest="ctx", type=int, default=None, help="the same as -c")
    p.add_argument("file", type=Path, help="UTF-8 text file")
    p.set_defaults(func=perplexity)


def perplexity(a: argparse.Namespace) -> int:
    chunk = DEFAULT_CHUNK if a.ctx is None else a.ctx
    if chunk < 4 or chunk % 2:
        raise MinferError(f"-c/--ctx-size (the chunk size) must be an even number >= 4, got {chunk}")
    a.ctx = chunk
    config = common.engine_config(a, n_slots=1)
    if common.follower(a, config):
        return 0
    try:
        text = a.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise MinferError(f"cannot read {a.file}: {e}") from None
    m = common.load_model(a, config)
    try:
        def on_chunk(i: int, n: int, running: float) -> None:
            print(f"[{i + 1}/{n}] running PPL = {running:.4f}", flush=True)

        r = m.perplexity(text, n_ctx=chunk, on_chunk=on_chunk)
    finally:
        common.close_model(m, config)
    print("chunk NLLs: " + " ".join(f"{x:.4f}" for x in r.nll_per_chunk))
    print(f"PPL = {r.ppl:.4f} +/- {r.ppl_error:.5f}  ({r.chunks} chunks of {r.n_ctx}, {r.n_scored} tokens scored, "
          f"{r.seconds:.1f} s, {r.chunks * r.n_ctx / r.seconds:.0f} tok/s)")
    return 0
