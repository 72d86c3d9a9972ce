"""The cpu backend's prepared weights, kept in a cache file and memory-mapped on the next load.

Preparing a model's matrices for the cpu kernels (the VNNI layout, torch's int4 packing) is byte
shuffling over every weight: ~3 s for SmolLM2-135M, ~20 s for an 8B file on this machine. The
result depends only on the file's bytes and on the layout code, so the first load writes it to
`cache_dir()/weights/<model>-<key>.pt` (torch's zip format) and later loads map that file
(`torch.load(mmap=True)`: no copy, pages read as the kernels touch them) instead of packing.

The key hashes what the prepared bytes depend on: `LAYOUT_VERSION` (bump it with any change to
a packed layout), torch's version (its int4 packing is torch's own), which kernels this machine
runs (VNNI or int4), and the file: its size, modification time, its whole header (metadata and
tensor table) and 1 MiB sampled across the tensor data. Reading the whole file to hash it would
cost more than the cache saves (an 8B file is 4.6 GB); the sampled hash plus size and mtime
tells a rewritten or replaced file apart. A cache file that cannot be read is ignored (and
rewritten); one that cannot be written only costs the next load its speed. `MINFER_WEIGHT_CACHE=0`
turns it off. A tensor-parallel rank (a sharded reader) does not use it.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

import torch

from ..config import cache_dir

LAYOUT_VERSION = 1
SAMPLES = 16
SAMPLE_BYTES = 64 << 10
HEADER_LIMIT = 64 << 20  # a header past this is hashed by its first 64 MiB (a vocabulary of ~1M tokens)


def file_key(path: Path, data_offset: int, machine: str) -> str:
    """The hex key of a model file's prepared weights (module docstring)."""
    st = path.stat()
    h = hashlib.sha256(f"{LAYOUT_VERSION}|{torch.__version__}|{machine}|{st.st_size}|{st.st_mtime_ns}".encode())
    with path.open("rb") as f:
        h.update(f.read(min(data_offset, HEADER_LIMIT)))
        span = max(st.st_size - data_offset - SAMPLE_BYTES, 0)
        for i in range(SAMPLES):
            f.seek(data_offset + span * i // max(SAMPLES - 1, 1))
            h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()[:32]


class WeightCache:
    """Prepared tensors by name: `get(name)` from the cache file, `put(name, tensors)` for the
    next load, `save()` once the load is done (only when something new was prepared)."""

    def __init__(self, path: Path | None):
        self.path = path
        self._stored: dict | None = None
        self._new: dict[str, dict] = {}
        self.hits = self.misses = 0
        if path is not None and path.is_file():
            try:
                self._stored = torch.load(path, mmap=True, weights_only=True)
            except Exception as e:  # noqa: BLE001 (a truncated or foreign file: prepare again, rewrite it)
                print(f"minfer: ignoring the weight cache {path} ({type(e).__name__}: {e})", file=sys.stderr)

    @classmethod
    def for_reader(cls, reader, machine: str, enabled: bool = True) -> WeightCache:
        """The cache of `reader`'s file (a disabled one for a sharded reader or when turned off)."""
        path = getattr(reader, "path", None)
        if not enabled or path is None or not hasattr(reader, "data_offset") or type(reader).__name__ != "GGUFReader":
            return cls(None)
        key = file_key(Path(path), reader.data_offset, machine)
        return cls(cache_dir() / "weights" / f"{Path(path).stem}-{key}.pt")

    def get(self, name: str) -> dict | None:
        got = None if self._stored is None else self._stored.get(name)
        self.hits += got is not None
        self.misses += got is None and self.path is not None
        return got

    def put(self, name: str, tensors: dict) -> None:
        if self.path is not None:
            self._new[name] = tensors

    def save(self) -> None:
        """Write everything prepared by this load (atomically: a temporary file renamed), and
        remove this model's cache files of other keys. Errors are a warning."""
        if self.path is None or not self._new:
            return
        merged = {**(self._stored or {}), **self._new}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tmp-", suffix=".pt")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(merged, f)
            os.replace(tmp, self.path)
        except OSError as e:
            print(f"minfer: could not write the weight cache {self.path} ({e.strerror or e}); the next load "
                  "prepares the weights again", file=sys.stderr)
            Path(tmp).unlink(missing_ok=True)
            return
        finally:
            self._new.clear()
        stem = self.path.name.rsplit("-", 1)[0]
        for old in self.path.parent.glob(f"{stem}-*.pt"):
            if old != self.path:
                old.unlink(missing_ok=True)
