"""The cpu backend's prepared weights, kept in a cache file and memory-mapped on the next load.

Preparing a model's matrices for the cpu kernels (the VNNI layout, torch's int4 packing) is byte
shuffling over every weight: ~3 s for SmolLM2-135M, ~20 s for an 8B file on this machine. The
result depends only on the file's bytes and on the layout code, so the first load writes it to
`<cache>/weights/<model>-<key>.mwc` (the load's EngineConfig.cache_path: $MINFER_CACHE, else
~/.cache/minfer) and later loads map that file (no copy: pages are read as
the kernels touch them) instead of packing.

The file is flat, not a pickle (torch.save's format took ~0.15 s to unpickle SmolLM2's ~1,500
objects, a tenth of a start): `MAGIC`, the header's length (u64), a JSON header naming every
prepared matrix's tensors (dtype, shape, offset) and integers, then the tensors' bytes, each at a
64-byte boundary. A load maps the file once and makes each tensor a view of the map.

The key hashes what the prepared bytes depend on: `LAYOUT_VERSION` (bump it with any change to
a packed layout), torch's version (its int4 packing is torch's own), which kernels this machine
runs (VNNI or int4), and the file: its size, modification time, its whole header (metadata and
tensor table) and 1 MiB sampled across the tensor data. Reading the whole file to hash it would
cost more than the cache saves (an 8B file is 4.6 GB); the sampled hash plus size and mtime
tells a rewritten or replaced file apart. A cache file that cannot be read is ignored (and
rewritten); one that cannot be written only costs the next load its speed. EngineConfig.weight_cache
(`MINFER_WEIGHT_CACHE=0`) turns it off. A tensor-parallel rank (a sharded reader) does not use it.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import struct
import sys
import tempfile
from pathlib import Path

import torch

LAYOUT_VERSION = 2  # 2: the flat file (1 was torch.save's)
MAGIC = b"MINFERWC"
ALIGN = 64
SUFFIX = ".mwc"
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


class CacheFileError(ValueError):
    """A cache file that is not what this code writes (truncated, foreign, another version)."""


def write_file(path: Path, entries: dict[str, dict]) -> None:
    """Write `entries` (name -> {field: tensor or int}) as the flat file (module docstring)."""
    index: dict[str, dict] = {}
    blobs: list[tuple[int, torch.Tensor]] = []
    at = 0
    for name, fields in entries.items():
        ints, tensors = {}, {}
        for k, v in fields.items():
            if isinstance(v, torch.Tensor):
                v = v.detach().contiguous()
                tensors[k] = [str(v.dtype).removeprefix("torch."), list(v.shape), at]
                blobs.append((at, v))
                at += -(-v.numel() * v.element_size() // ALIGN) * ALIGN
            else:
                ints[k] = int(v)
        index[name] = {"ints": ints, "tensors": tensors}
    header = json.dumps({"version": LAYOUT_VERSION, "data_bytes": at, "entries": index}).encode()
    start = -(-(len(MAGIC) + 8 + len(header)) // ALIGN) * ALIGN
    with path.open("wb") as f:
        f.write(MAGIC + struct.pack("<Q", len(header)) + header)
        for off, t in blobs:
            f.seek(start + off)
            if t.numel():
                f.write(memoryview(t.view(-1).view(torch.uint8).numpy()))
        f.truncate(start + at)


def map_file(path: Path) -> dict[str, dict]:
    """The entries of a flat file, every tensor a view of one copy-on-write map of it (nothing is
    read here but the header). CacheFileError when the file is not one this code wrote."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        lead = f.read(len(MAGIC) + 8)
        if len(lead) < len(MAGIC) + 8 or lead[:len(MAGIC)] != MAGIC:
            raise CacheFileError(f"expected a file starting with {MAGIC!r}")
        (n,) = struct.unpack("<Q", lead[len(MAGIC):])
        if n > size:
            raise CacheFileError(f"a header of {n} bytes in a file of {size}")
        try:
            meta = json.loads(f.read(n))
        except ValueError as e:
            raise CacheFileError(f"the header is not JSON ({e})") from None
        start = -(-(len(MAGIC) + 8 + n) // ALIGN) * ALIGN
        if meta.get("version") != LAYOUT_VERSION or start + meta.get("data_bytes", -1) != size:
            raise CacheFileError(f"expected layout {LAYOUT_VERSION} and {start + meta.get('data_bytes', 0)} bytes, "
                                 f"found layout {meta.get('version')} and {size} bytes")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else None  # writable: no torch warning
    entries = {}
    for name, e in meta["entries"].items():
        fields: dict = dict(e["ints"])
        for k, (dtype, shape, off) in e["tensors"].items():
            dt = getattr(torch, dtype)
            count = 1
            for d in shape:
                count *= d
            fields[k] = (torch.frombuffer(mm, dtype=dt, count=count, offset=start + off).view(shape) if count
                         else torch.empty(shape, dtype=dt))
        entries[name] = fields
    return entries


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
                self._stored = map_file(path)
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # prepare again, rewrite it
                print(f"minfer: ignoring the weight cache {path} ({type(e).__name__}: {e})", file=sys.stderr)

    @classmethod
    def for_file(cls, path: Path, data_offset: int, machine: str, directory: str | Path) -> WeightCache:
        """The cache of the GGUF file at `path` (tensor data from `data_offset`) under `directory`."""
        key = file_key(path, data_offset, machine)
        return cls(Path(directory) / "weights" / f"{path.stem}-{key}{SUFFIX}")

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
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tmp-", suffix=SUFFIX)
        os.close(fd)
        try:
            write_file(Path(tmp), merged)
            os.replace(tmp, self.path)
        except OSError as e:
            print(f"minfer: could not write the weight cache {self.path} ({e.strerror or e}); the next load "
                  "prepares the weights again", file=sys.stderr)
            Path(tmp).unlink(missing_ok=True)
            return
        finally:
            self._new.clear()
        # this model's files of other keys (or of the torch.save format): `-<32 hex>` after the
        # stem, so another model whose name starts with this one's keeps its file
        ours = re.compile(re.escape(self.path.name.rsplit("-", 1)[0]) + r"-[0-9a-f]{32}\.(mwc|pt)")
        for old in self.path.parent.iterdir():
            if old != self.path and ours.fullmatch(old.name):
                old.unlink(missing_ok=True)
