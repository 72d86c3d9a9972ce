"""The `minfer` command line: assembles the subcommands of minfer/commands/ and turns typed
errors into one clear line and exit code 2. Imports no torch: commands import what they run."""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__
from .commands import MODULES
from .errors import MinferError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minfer", description="LLM inference for GGUF files")
    parser.add_argument("--version", action="version", version=f"minfer {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in MODULES:
        importlib.import_module(f"{__package__}.commands.{name}").add_parser(sub)
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
        return 0


if __name__ == "__main__":
    sys.exit(main())
