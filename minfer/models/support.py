"""Which backend runs which architecture: the table `minfer inspect` prints and
docs/SUPPORT-MATRIX.md shows (tests/models/test_support.py keeps it equal to the registry).

"yes": runs, tested against llama.cpp or HF transformers; "pending": the architecture needs ops
or params the backend's kernels do not implement yet (graph/ir.py EXTENDED_OPS / EXTENDED_PARAMS:
backends/calls.py `require_base_features` refuses the model at load with a typed error).
"""

from __future__ import annotations

BACKENDS = ("cpu", "cuda", "vulkan")
_ALL, _CPU_ONLY = ("yes", "yes", "yes"), ("yes", "pending", "pending")
SUPPORT: dict[str, tuple[str, ...]] = {
    "llama": _ALL,
    "qwen2": _ALL,
    "qwen3": _CPU_ONLY,
    "gemma2": _CPU_ONLY,
    "gemma3": _CPU_ONLY,
    "phi3": _CPU_ONLY,
}


def support(arch: str) -> dict[str, str] | None:
    """backend -> "yes" / "pending" for `arch`, None when no backend runs it."""
    row = SUPPORT.get(arch)
    return dict(zip(BACKENDS, row, strict=True)) if row else None


def matrix_text() -> str:
    """The whole table, one architecture a line."""
    w = max(map(len, SUPPORT))
    lines = [f"{'architecture':<{max(w, 12)}}  " + "  ".join(f"{b:<8}" for b in BACKENDS)]
    for arch, row in SUPPORT.items():
        lines.append(f"{arch:<{max(w, 12)}}  " + "  ".join(f"{s:<8}" for s in row))
    return "\n".join(line.rstrip() for line in lines)
