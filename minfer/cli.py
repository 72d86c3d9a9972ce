"""The `minfer` command line: assembles the subcommands of minfer/commands/ and turns typed
errors into one clear line and exit code 2. Imports no torch: commands import what they run.

Every parser is a `Parser`: no abbreviated long flags (`--temp` is never `--temperature`'s
prefix, `-hf` is never `-h f`), `--version` on every subcommand, and an unknown flag reported
under the usage of the subcommand it was given to (argparse hands leftovers up to the top parser).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import sys

from . import __version__
from .commands import MODULES
from .errors import MinferError


class Parser(argparse.ArgumentParser):
    """argparse with llama.cpp's habits: exact flags only, leftovers are this parser's error."""

    def __init__(self, *args, **kw):
        kw.setdefault("allow_abbrev", False)
        super().__init__(*args, **kw)

    def parse_known_args(self, args=None, namespace=None):
        ns, extra = super().parse_known_args(args, namespace)
        if extra and self.prog != "minfer":  # a subcommand: its usage, not the top parser's
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return ns, extra


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="minfer", description="LLM inference for GGUF files")
    parser.add_argument("--version", action="version", version=f"minfer {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for name in MODULES:
        importlib.import_module(f"{__package__}.commands.{name}").add_parser(sub)
    for p in sub.choices.values():
        p.add_argument("--version", action="version", version=f"minfer {__version__}")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MinferError as e:
        print(f"minfer: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("minfer: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _drop_stdout()
        return 0
    except OSError as e:  # a write failed (stdout on a full disk, a terminal gone): one line, not a traceback
        if e.errno not in _WRITE_ERRORS or e.filename is not None:  # (opening a named file: its own typed errors)
            raise
        _drop_stdout()
        print(f"minfer: error: cannot write: {e.strerror or e}", file=sys.stderr)
        return 1


_WRITE_ERRORS = {errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG}


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush at exit does not fail again with
    what the error line already said."""
    import os

    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
