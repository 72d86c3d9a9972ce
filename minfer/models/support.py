"""Which backend runs which architecture: the table `minfer inspect` prints and
docs/SUPPORT-MATRIX.md shows (tests/models/test_support.py keeps it equal to the registry).

"yes": runs, tested against llama.cpp or HF transformers (on cuda and vulkan: the tiny synthetic
files of each family against their llama.cpp fixtures, tests/backends/test_families_gpu.py).
"no": the backend lacks an op the family needs (no row says it today: gpt-oss's attention sinks,
clamped SwiGLU and expert biases run on every backend since 2026-12-03); `check_backend` refuses
such a backend at load with a typed error, before any weight is read. An architecture with no row
is refused at load with one typed error naming the supported list (models/registry.py).
"""

from __future__ import annotations

from ..errors import UnsupportedError

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
    "gpt-oss": _ALL,
}
DEVICE_BACKEND = {"cpu": "cpu", "cuda": "cuda", "vulkan": "vulkan", "gpu": "vulkan"}  # config.device -> column


def support(arch: str) -> dict[str, str] | None:
    """backend -> "yes" for `arch`, None when no backend runs it."""
    row = SUPPORT.get(arch)
    return dict(zip(BACKENDS, row, strict=True)) if row else None


def check_backend(arch: str, device: str) -> None:
    """UnsupportedError when the table says the backend of `device` does not run `arch`."""
    row = support(arch)
    backend = DEVICE_BACKEND.get(device, device)
    if row is not None and row.get(backend, "yes") != "yes":
        runs = ", ".join(b for b, v in row.items() if v == "yes") or "none"
        raise UnsupportedError(f"architecture {arch!r} does not run on the {backend} backend yet "
                               f"(device {device!r}); backends that run it: {runs}")


def matrix_text() -> str:
    """The whole table, one architecture a line."""
    w = max(map(len, SUPPORT))
    lines = [f"{'architecture':<{max(w, 12)}}  " + "  ".join(f"{b:<8}" for b in BACKENDS)]
    for arch, row in SUPPORT.items():
        lines.append(f"{arch:<{max(w, 12)}}  " + "  ".join(f"{s:<8}" for s in row))
    return "\n".join(line.rstrip() for line in lines)
