"""`minfer trace ...` subcommands.

- `minfer trace view FILE [--port P] [--open]`: serve the viewer and FILE on 127.0.0.1 until Ctrl-C.
- `minfer trace demo OUT [--preset P] [--quant Q] [--tokens N] [--seed S]`: record a real engine
  run on a synthetic model (`minfer synth`, written to a temporary directory) to OUT, to try the
  viewer without a model file.

Each handler takes the parsed args and returns a process exit code; errors are MinferError.
"""

from __future__ import annotations

import argparse

DEFAULT_PORT = 0  # a free port (printed), unless --port names one


def cmd_trace_view(args: argparse.Namespace) -> int:
    """Serve the viewer with `args.file` preloaded; block until interrupted."""
    import threading
    import webbrowser

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


DEMO_PROMPT = "the quick brown fox jumps over the lazy dog, and then"


def run_demo(out, *, preset: str = "tiny-llama", quant: str = "q4_1", new_tokens: int = 24, prompt: str = DEMO_PROMPT,
             seed: int = 0, vocab: int | None = 300):
    """Record `new_tokens` greedy steps of a synthetic `preset` model to `out` (the engine's own
    TraceRecorder on the cpu backend: one prefill step, then a decode step per token); its path.
    The model file lives in a temporary directory for the run only."""
    import tempfile
    from pathlib import Path

    from ..api import load
    from ..gguf.synth import synth

    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="minfer-demo-") as tmp:
        model = synth(preset, quant, Path(tmp) / f"{preset}-{quant}.gguf", seed=seed, vocab=vocab, progress=False)
        with load(model, "cpu", n_ctx=max(256, 64 + new_tokens), n_slots=1, trace=out, progress=False) as m:
            m.generate(prompt, max_tokens=new_tokens, temperature=0, ignore_eos=True)
    return out


def cmd_trace_demo(args: argparse.Namespace) -> int:
    """Record the demo run to `args.out`."""
    path = run_demo(args.out, preset=args.preset, quant=args.quant, new_tokens=args.tokens, seed=args.seed)
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

    demo = sub.add_parser("demo", help="record a run of a synthetic model (minfer synth) to try the viewer")
    demo.add_argument("out", help="trace JSON to write")
    demo.add_argument("--preset", default="tiny-llama", help="minfer synth preset (default tiny-llama)")
    demo.add_argument("--quant", default="q4_1", help="its quantization (default q4_1)")
    demo.add_argument("--tokens", type=_positive, default=24, help="tokens to generate (a step each)")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=cmd_trace_demo)
    return trace
