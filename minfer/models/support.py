"""Which backend runs which architecture: the table `minfer inspect` prints and
docs/SUPPORT-MATRIX.md shows (tests/models/test_support.py keeps it equal to the registry).

"yes": runs, tested against llama.cpp or HF transformers (on cuda and vulkan: the tiny synthetic
files of each family against their llama.cpp fixtures, tests/backends/test_families_gpu.py).
An architecture with no row is refused at load with one typed error naming the supported list
(models/registry.py).
"""

from __future__ import annotations

BACKENDS = ("cpu", "cuda", "vulkan")
_ALL = ("yes", "yes", "yes")
SUPPORT: dict[str, tuple[str, ...]] = {
    "llama": _ALL,
    "qwen2": _ALL,
    "qwen3": _ALL,
    "qwen3moe": _ALL,
    "gemma2": _ALL,
    "gemma3": _ALL,
    "phi3": _ALL,
}


def support(arch: str) -> dict[str, str] | None:
    """backend -> "yes" for `arch`, None when no backend runs it."""
    row = SUPPORT.get(arch)
    return dict(zip(BACKENDS, row, strict=True)) if row else None


def matrix_text() -> str:
    """The whole table, one architecture a line."""
    w = max(map(len, SUPPORT))
    lines = [f"{'architecture':<{max(w, 12)}}  " + "  ".join(f"{b:<8}" for b in BACKENDS)]
    for arch, row in SUPPORT.items():
        lines.append(f"{arch:<{max(w, 12)}}  " + "  ".join(f"{s:<8}" for s in row))
    return "\n".join(line.rstrip() for line in lines)
