"""`minfer chat`: an interactive chat with the model's chat template and the history."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import MinferError
from . import common

BANNER = ("minfer chat with {name} (context {n_ctx} tokens). Type a message and press Enter.\n"
          "  /reset  forget the conversation    /exit  quit (or Ctrl-D)    Ctrl-C  stop a reply")


def add_parser(sub) -> None:
    p = sub.add_parser("chat", help="interactive chat with the model's chat template",
                       description="Chat on stdin/stdout. Commands: /reset (forget the history), /exit. "
                                   "Ctrl-C stops a reply; Ctrl-D (or Ctrl-C at the prompt) ends the session.")
    common.add_model_args(p)
    common.add_sampling_args(p, n_predict=512)
    p.add_argument("--system", default=None, help="system prompt (default: the template's own, if any)")
    p.add_argument("--chat-template", type=Path, default=None, metavar="FILE",
                   help="use this Jinja chat template instead of the model's")
    p.add_argument("--stats", action="store_true", help="print tok/s after each reply")
    p.set_defaults(func=chat)


def chat(a: argparse.Namespace) -> int:
    params = common.sampling(a)
    config = common.engine_config(a, n_slots=1)
    if common.follower(a, config):
        return 0
    template = common.read_template(a.chat_template)
    m = common.load_model(a, config, chat_template=template)
    interactive = sys.stdin.isatty()
    try:
        if interactive:
            print(BANNER.format(name=m.path.name, n_ctx=m.n_ctx), file=sys.stderr)
        base = [{"role": "system", "content": a.system}] if a.system else []
        history = list(base)
        while True:
            if interactive:
                print("> ", end="", file=sys.stderr, flush=True)
            try:
                line = sys.stdin.readline()
            except KeyboardInterrupt:
                print(file=sys.stderr)
                break
            if not line:
                break
            text = line.rstrip("\n")
            if text.strip() in ("/exit", "/quit"):
                break
            if text.strip() == "/reset":
                history = list(base)
                print("(history cleared)", file=sys.stderr)
                continue
            if not text.strip():
                continue
            history.append({"role": "user", "content": text})
            reply: list[str] = []
            try:
                pieces = m.generate(history, stream=True, params=params)
                try:
                    for piece in pieces:
                        reply.append(piece)
                        sys.stdout.write(piece)
                        sys.stdout.flush()
                except KeyboardInterrupt:  # stop this reply, keep the session
                    pieces.close()
                    print(" [stopped]", file=sys.stderr)
            except MinferError as e:  # e.g. the history outgrew the context: say so, keep the session
                history.pop()
                print(f"\nerror: {e} (use /reset to clear the history)", file=sys.stderr)
                continue
            sys.stdout.write("\n")
            sys.stdout.flush()
            history.append({"role": "assistant", "content": "".join(reply)})
            if a.stats:
                common.print_stats(m)
    finally:
        common.close_model(m, config)
    return 0
