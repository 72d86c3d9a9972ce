"""`minfer trace ...` subcommands.

- `minfer trace view FILE [--port P] [--open]`: serve the viewer and FILE on 127.0.0.1 until Ctrl-C.
- `minfer trace demo OUT [--layers N] [--tokens N] [--seed S]`: record a synthetic run to OUT,
  to try the viewer without a model file.

Each handler takes the parsed args and returns a process exit code; errors are MinferError.
"""

from __future__ import annotations

import argparse
import threading
import webbrowser

DEFAULT_PORT = 0  # a free port (printed), unless --port names one


def cmd_trace_view(args: argparse.Namespace) -> int:
    """Serve the viewer with `args.file` preloaded; block until interrupted."""
    from ..trace.server import TraceServer

    server = TraceServer(args.file, port=args.port).start()
    print(f"minfer trace view: {server.url}  (serving {args.file}; Ctrl-C stops)", flush=True)
    if args.open:
        webbrowser.open(server.url)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def cmd_trace_demo(args: argparse.Namespace) -> int:
    """Record the synthetic demo run to `args.out`."""
    from ..trace.demo import DemoShape, run_demo  # torch: imported only for this command

    path = run_demo(args.out, shape=DemoShape(layers=args.layers), new_tokens=args.tokens, seed=args.seed)
    print(f"wrote {path}; view it with: minfer trace view {path}")
    return 0


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return v


def _port(text: str) -> int:
    v = int(text)
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 0..65535, got {text}")
    return v


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `trace` (with `view` and `demo`) to a CLI's subparsers; handlers are set as `func`."""
    trace = subparsers.add_parser("trace", help="record/view traces (MINFER_TRACE=path.json records a run)",
                                  description="Trace tools. Record a run with MINFER_TRACE=path.json.")
    sub = trace.add_subparsers(dest="trace_command", metavar="{view,demo}", required=True)

    view = sub.add_parser("view", help="open a trace in the viewer web page (127.0.0.1 only)")
    view.add_argument("file", help="trace JSON written by MINFER_TRACE=... or `minfer trace demo`")
    view.add_argument("--port", type=_port, default=DEFAULT_PORT, help="port (default: a free one, printed)")
    view.add_argument("--open", action="store_true", help="open the page in a browser")
    view.set_defaults(func=cmd_trace_view)

    demo = sub.add_parser("demo", help="record a synthetic run (random tiny llama) to try the viewer")
    demo.add_argument("out", help="trace JSON to write")
    demo.add_argument("--layers", type=_positive, default=4)
    demo.add_argument("--tokens", type=_positive, default=24, help="steps to record (1 prefill + decodes)")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=cmd_trace_demo)
    return trace
