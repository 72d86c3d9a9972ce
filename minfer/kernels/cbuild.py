"""Build a C source of minfer's once per machine and load it (ctypes): the cpu backend's VNNI kernels
(q4_vnni.c) and the vulkan backend's replay encoder (kernels/wgpu/replay.c).

The system C compiler (`cc`, or $CC) writes the library into minfer's cache directory (the
backend's EngineConfig.cache_dir: $MINFER_CACHE, else ~/.cache/minfer; `use_cache_dir`) under a
name that hashes the source and flags, so an edit
rebuilds and concurrent builds write the same bytes (the rename is atomic). Where there is no
compiler, no writable cache, or the build fails, `build` returns None and the caller keeps its
pure-Python or torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

from ..config import c_compiler

_CACHE = [Path.home() / ".cache" / "minfer"]


def use_cache_dir(path: str | Path) -> None:
    """Where libraries are built from now on (a backend passes its EngineConfig.cache_path)."""
    _CACHE[0] = Path(path)


def cache_dir() -> Path:
    return _CACHE[0]


def build(source: Path, flags: list[str], fallback: str) -> ctypes.CDLL | None:
    """source compiled with flags (plus -shared -fPIC) and loaded, or None; `fallback` names what
    the caller does instead (said in the warning a failed build gives)."""
    cc = c_compiler() or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    try:
        src = source.read_bytes()
    except OSError:  # an install without the C source
        return None
    flags = [*flags, "-shared", "-fPIC"]
    tag = hashlib.sha256(src + " ".join(flags).encode()).hexdigest()[:16]
    lib = cache_dir() / f"{source.stem}-{tag}.so"
    try:
        if not lib.exists():
            lib.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
                out = Path(tmp) / lib.name
                done = subprocess.run([cc, *flags, str(source), "-o", str(out)], capture_output=True, text=True,
                                      timeout=300)
                if done.returncode != 0:
                    warnings.warn(f"minfer: {source.name} did not compile ({cc}: {done.stderr.strip()[-300:]}); "
                                  f"{fallback}", stacklevel=3)
                    return None
                os.replace(out, lib)  # atomic: a concurrent build writes the same bytes
        return ctypes.CDLL(str(lib))
    except (OSError, subprocess.SubprocessError):  # no writable cache, a compiler that hangs, a bad library
        return None
