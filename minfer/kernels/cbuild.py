"""Build a C source of minfer's once per machine and load it (ctypes): the cpu backend's VNNI kernels
(q4_vnni.c) and the vulkan backend's replay encoder (kernels/wgpu/replay.c).

The system C compiler (`cc`, or $CC) writes the library into minfer's cache directory (the
backend's EngineConfig.cache_dir: $MINFER_CACHE, else ~/.cache/minfer; `use_cache_dir`) under a
name that hashes the source, the flags and the compiler, so an edit rebuilds and concurrent
builds write the same bytes (the rename is atomic). Where there is no compiler, no writable
cache, or the build fails, `build` returns None and the caller keeps its pure-Python or torch
path.

A library is code this process runs, so the cache is treated like a place others could write to:
- the directory is created private to the user (0700); one that another user owns, or that
  group or others can write, is not used at all (the build returns None, with a warning);
- a library is loaded only from the file whose name carries the hash of its source, flags and
  compiler; an entry there that another user owns, that group or others can write, or that is
  a symbolic link is rebuilt over, never loaded;
- what the compiler writes is made 0700 before it is renamed into place.

`MINFER_SANITIZE=1` builds every library with AddressSanitizer and UBSan (`SANITIZE_FLAGS`, in the
hash: their own cache entries). Such a library loads only into a process whose first library is
libasan (`LD_PRELOAD`; scripts/sanitize.sh does it), and any report aborts the process.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import warnings
from pathlib import Path

from ..config import c_compiler, c_sanitize
from ..config import cache_dir as default_cache_dir
from ..errors import MinferError

SANITIZE_FLAGS = ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                  "-fno-sanitize-recover=all"]

_CACHE: list[Path | None] = [None]  # None: minfer's cache directory ($MINFER_CACHE, else ~/.cache/minfer)


def use_cache_dir(path: str | Path) -> None:
    """Where libraries are built from now on (a backend passes its EngineConfig.cache_path)."""
    _CACHE[0] = Path(path)


def cache_dir() -> Path:
    return _CACHE[0] or default_cache_dir()


def compiler() -> str | None:
    return c_compiler() or shutil.which("cc") or shutil.which("gcc")


def _insecure(st: os.stat_result) -> str | None:
    """Why a file or directory with this stat must not be trusted, or None."""
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not this user ({os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def private_dir(path: Path) -> Path | None:
    """`path` created 0700 if missing; None (with a warning) when it is not private to this user."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        why = _insecure(path.stat())
    except OSError:
        return None
    if why is not None:
        warnings.warn(f"minfer: the build cache {path} is {why}: no library is loaded from it "
                      "(set MINFER_CACHE to a directory of your own)", stacklevel=3)
        return None
    return path


def _trusted(lib: Path) -> bool:
    """Whether the cache entry exists as a regular file of this user's that only this user can write."""
    try:
        st = lib.lstat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and _insecure(st) is None


def sanitizing() -> bool:
    return c_sanitize()


def _check_asan_loaded() -> None:
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    if "libasan" not in maps:
        raise MinferError("MINFER_SANITIZE=1: the sanitized C helpers need libasan loaded first "
                          "(LD_PRELOAD=$(cc -print-file-name=libasan.so); scripts/sanitize.sh)")


def library_path(source: Path, flags: list[str], cc: str) -> Path:
    """Where the library of `source` built by `cc` with `flags` lives in the cache."""
    tag = hashlib.sha256(source.read_bytes() + "\0".join([cc, *flags]).encode()).hexdigest()[:16]
    return cache_dir() / f"{source.stem}-{tag}.so"


def build(source: Path, flags: list[str], fallback: str) -> ctypes.CDLL | None:
    """source compiled with flags (plus -shared -fPIC) and loaded, or None; `fallback` names what
    the caller does instead (said in the warning a failed build gives)."""
    cc = compiler()
    if cc is None:
        return None
    if sanitizing():
        _check_asan_loaded()
        flags = [f for f in flags if not f.startswith("-O")] + SANITIZE_FLAGS
    flags = [*flags, "-shared", "-fPIC"]
    try:
        lib = library_path(source, flags, cc)
    except OSError:  # an install without the C source
        return None
    if private_dir(lib.parent) is None:
        return None
    try:
        if not _trusted(lib):
            with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
                out = Path(tmp) / lib.name
                done = subprocess.run([cc, *flags, str(source), "-o", str(out)], capture_output=True, text=True,
                                      timeout=300)
                if done.returncode != 0:
                    warnings.warn(f"minfer: {source.name} did not compile ({cc}: {done.stderr.strip()[-300:]}); "
                                  f"{fallback}", stacklevel=2)
                    return None
                out.chmod(0o700)
                os.replace(out, lib)  # atomic, and over any untrusted entry: a concurrent build writes the same bytes
        return ctypes.CDLL(str(lib))
    except (OSError, subprocess.SubprocessError):  # no writable cache, a compiler that hangs, a bad library
        return None
