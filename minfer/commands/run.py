"""`minfer run`: generate a continuation of one prompt, streamed to stdout (`-cnv`: a chat).

A prompt run goes to a resident process that keeps the model loaded between runs (resident.py,
Ollama's keep-alive), started by the first run; `--keep-alive 0` / `--no-daemon` (or a trace, a
chat, tensor parallelism) runs in this process instead."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..config import KEEP_ALIVE_DEFAULT, dist_env, keep_alive
from . import chat as chat_command
from . import common


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="generate a continuation of a prompt, streamed to stdout",
                       description="Generate text from a prompt (special tokens like <|im_start|> are parsed). "
                                   "Prints prefill and decode tok/s on stderr. With -cnv it is `minfer chat` "
                                   "(the prompt, if any, is the first message). No prompt: a piped stdin is the "
                                   "prompt, and at a terminal it is a chat (as `ollama run MODEL`).")
    common.add_model_args(p)
    common.add_sampling_args(p, n_predict=128)
    common.add_chat_args(p)
    chat_command.add_conversation_args(p)
    p.add_argument("--trace", default=None, metavar="PATH", help="record a trace of the run (as MINFER_TRACE)")
    p.add_argument("-p", "--prompt", dest="prompt_flag", default=None, help="the prompt text")
    p.add_argument("-f", "--file", type=Path, default=None, help="read the prompt from this file")
    p.add_argument("prompt", nargs="?", default=None, help="the prompt text; - reads it from stdin")
    p.add_argument("--keep-alive", default=None, metavar="DURATION",
                   help="keep the model loaded in a resident process for this long after the run, for the next "
                        f"runs with the same settings (e.g. 30s, 5m, 1h; -1 = until `minfer stop`; 0 = no resident "
                        f"process) (default: $MINFER_KEEP_ALIVE, else {KEEP_ALIVE_DEFAULT})")
    p.add_argument("--no-daemon", action="store_true",
                   help="load and run the model in this process (as --keep-alive 0)")
    p.set_defaults(func=run, stats=False)


def run(a: argparse.Namespace) -> int:
    params = common.sampling(a)
    config = common.engine_config(a, trace_path=a.trace, n_slots=1)
    if common.follower(a, config):
        return 0
    template = common.read_template(a.chat_template)
    keep_s = keep_alive(a.keep_alive)  # (checked even where it does not apply: every flag is, before the load)
    if a.conversation is None and not common.prompt_given(a) and sys.stdin is not None and sys.stdin.isatty():
        a.conversation = True  # no prompt at a terminal: a chat, as `ollama run MODEL` (-no-cnv: the error)
    if a.conversation:
        first = common.read_prompt(a) if common.prompt_given(a) else None
        m = common.load_model(a, config, chat_template=template)
        try:
            chat_command.converse(m, a, params, first=first)
        finally:
            common.close_model(m, config)
        return 0
    keep_s = 0.0 if a.no_daemon else keep_s
    prompt = common.read_prompt(a)
    if keep_s > 0 and config.trace_path is None and config.tp == 1 and dist_env() is None:
        from . import resident

        if resident.run(a, config, params, prompt, template, keep_s):
            return 0
    m = common.load_model(a, config, chat_template=template)
    try:
        common.warn_context(m, params, prompt)
        for piece in m.generate(prompt, stream=True, params=params):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        common.print_stats(m.last_stats)
    finally:
        common.close_model(m, config)
    return 0
