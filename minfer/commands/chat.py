"""`minfer chat`: an interactive chat with the model's chat template and the history.

On a terminal the input line edits like a shell's, through Python's `readline` (GNU readline
where Python has it): arrows and Emacs keys move and edit, Up / Down walk the history (kept
across sessions in the cache directory), a paste of several lines stays one message (readline's
bracketed paste), and a line that ends with `\\` continues on the next. We chose the standard
library's readline over prompt_toolkit: no new dependency, the keys people already have in
bash, and it only wraps `input()`; where Python has no readline (Windows) input is plain
`input()` and the rest works the same. Colours only when stdout is a terminal (NO_COLOR off).
Not on a terminal, messages are read one per line from stdin.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from ..errors import MinferError
from . import common

BANNER = ("minfer chat with {name} (context {n_ctx} tokens). Type a message and press Enter; end a line with \\ "
          "to go on to the next.\n"
          "  /reset  forget the conversation    /exit  quit (or Ctrl-D)    Ctrl-C  stop a reply    Up  history")
HISTORY_FILE = "chat_history"
HISTORY_LINES = 1000


def add_parser(sub) -> None:
    p = sub.add_parser("chat", help="interactive chat with the model's chat template",
                       description="Chat on stdin/stdout. Commands: /reset (forget the history), /exit. "
                                   "Ctrl-C stops a reply; Ctrl-D (or Ctrl-C at the prompt) ends the session. "
                                   "On a terminal: line editing and history (readline), a line ending in \\ "
                                   "continues on the next, pasted lines stay one message.")
    common.add_model_args(p)
    common.add_sampling_args(p, n_predict=512)
    common.add_chat_args(p)
    add_conversation_args(p)
    p.add_argument("--stats", action="store_true", help="print tok/s after each reply")
    p.set_defaults(func=chat)


def add_conversation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-cnv", "--conversation", dest="conversation", action="store_true", default=None,
                   help="conversation mode (llama-cli's; `minfer chat` always is, `minfer run -cnv` becomes it)")
    p.add_argument("-no-cnv", "--no-conversation", dest="conversation", action="store_false",
                   help="not conversation mode (llama-cli's; `minfer run` is one only with -cnv, or with no "
                        "prompt at a terminal)")


class Style:
    """ANSI colours, or nothing when stdout is not a terminal or NO_COLOR is set."""

    def __init__(self, on: bool):
        self.on = on

    def __call__(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.on and text else text

    def prompt(self, text: str) -> str:
        """For readline's prompt: the escapes marked as taking no width (\\001 .. \\002)."""
        return f"\001\033[1;32m\002{text}\001\033[0m\002" if self.on else text


class LineReader:
    """Messages from the user: readline-edited lines on a terminal, plain lines otherwise."""

    def __init__(self, interactive: bool, style: Style):
        self.interactive, self.style = interactive, style
        self.readline = None
        if interactive:
            try:
                import readline
            except ImportError:  # no readline here (Windows): plain input()
                readline = None
            self.readline = readline
            if readline is not None:
                self._load_history()

    def _history_path(self):
        from ..config import cache_dir

        return cache_dir() / HISTORY_FILE

    def _load_history(self) -> None:
        try:
            self.readline.read_history_file(self._history_path())
        except OSError:
            pass
        self.readline.set_history_length(HISTORY_LINES)

    def save(self) -> None:
        if self.readline is None:
            return
        try:
            path = self._history_path()
            path.parent.mkdir(parents=True, exist_ok=True)
            self.readline.write_history_file(path)
        except OSError:
            pass

    def _line(self, prompt: str) -> str | None:
        if self.interactive:
            try:
                return input(self.style.prompt(prompt))
            except EOFError:
                return None
        line = sys.stdin.readline()
        return line.rstrip("\n") if line else None

    def messages(self) -> Iterator[str]:
        """One message per Enter; a line ending in a backslash goes on with the next line."""
        while True:
            line = self._line("> ")
            if line is None:
                return
            parts = []
            while line is not None and line.endswith("\\"):
                parts.append(line[:-1])
                line = self._line(". ")
            parts.append(line or "")
            yield "\n".join(parts)


def chat(a: argparse.Namespace) -> int:
    params = common.sampling(a)
    config = common.engine_config(a, n_slots=1)
    if common.follower(a, config):
        return 0
    template = common.read_template(a.chat_template)
    if a.conversation is False:
        raise MinferError("-no-cnv: `minfer chat` is always a conversation; `minfer run` is the one-prompt command")
    m = common.load_model(a, config, chat_template=template)
    try:
        converse(m, a, params, first=None)
    finally:
        common.close_model(m, config)
    return 0


def converse(m, a: argparse.Namespace, params, first: str | None) -> None:
    """The chat loop on a loaded model; `first` is a message to send before reading any
    (`minfer run -cnv PROMPT`)."""
    from ..config import no_color

    interactive = sys.stdin.isatty()
    style = Style(sys.stdout.isatty() and not no_color())
    reader = LineReader(interactive, style)
    if interactive:
        print(BANNER.format(name=m.path.name, n_ctx=m.n_ctx), file=sys.stderr)
    base = [{"role": "system", "content": a.system}] if a.system else []
    history = list(base)
    inputs = reader.messages()
    try:
        while True:
            try:
                text = first if first is not None else next(inputs, None)
                first = None
            except KeyboardInterrupt:
                print(file=sys.stderr)
                break
            if text is None:
                break
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
                        sys.stdout.write(style(piece, "36"))
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
                common.print_stats(m.last_stats)
    finally:
        reader.save()
