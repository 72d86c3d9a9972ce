"""The cpu backend's prepared weights, kept in a cache file and memory-mapped on the next load.

Preparing a model's matrices for the cpu kernels (the VNNI layout, torch's int4 packing) is byte
shuffling over every weight: ~3 s for SmolLM2-135M, ~20 s for an 8B file on this machine. The
result depends only on the file's bytes and on the layout code, so the first load writes it to
`<cache>/weights/<model>-<key>.mwc` (the load's EngineConfig.cache_path: $MINFER_CACHE, else
~/.cache/minfer) and later loads map that file (no copy: pages are read as
the kernels touch them) instead of packing.

The file is flat, not a pickle (torch.save's format took ~0.15 s to unpickle SmolLM2's ~1,500
objects, a tenth of a start): `MAGIC`, the tensors' bytes, each at a page boundary, then a JSON
header naming every prepared matrix's tensors (dtype, shape, offset) and integers, its length
(u64) and `MAGIC` again. A load maps the file once and makes each tensor a view of the map.

The first load writes it as it prepares (`put`): each prepared matrix's bytes go to a temporary
file at once and the matrix continues from a map of them, so its packed copy is freed and the
load never holds every prepared weight in memory (gpt-oss-20b: 14.3 GB peak before, the file's
12.1 GB plus the VNNI form's extra 1.8 GB); `save` appends the header and renames the file.

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
import math
import mmap
import os
import re
import struct
import sys
import tempfile
from pathlib import Path

import torch

# 6: Q4_K / Q5_K with their own scales (vnni.py KM_TYPES); 5: the 5-/6-bit codes' high bits in byte planes;
# 4: 5-/6-bit VNNI codes, no zeros for the symmetric types;
# 3: the header last (2: first)
LAYOUT_VERSION = 6
MAGIC = b"MINFERWC"
ALIGN = mmap.ALLOCATIONGRANULARITY  # each tensor on a page: a prepared matrix maps its own range while written
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


class Writer:
    """A cache file being written: `add` appends an entry's tensors (each at an ALIGN boundary) and
    returns the entry with every tensor a view of a copy-on-write map of what was written;
    `finish` appends the header."""

    def __init__(self, path: Path):
        self.path = path
        self.f = path.open("w+b")
        self.f.write(MAGIC)
        self.at = len(MAGIC)
        self.index: dict[str, dict] = {}

    def add(self, name: str, fields: dict) -> dict:
        ints, where, blobs = {}, {}, []
        for k, v in fields.items():
            if isinstance(v, torch.Tensor):
                v = v.detach().contiguous()
                self.at = -(-self.at // ALIGN) * ALIGN
                where[k] = [str(v.dtype).removeprefix("torch."), list(v.shape), self.at]
                blobs.append((self.at, v))
                self.at += v.numel() * v.element_size()
            else:
                ints[k] = int(v)
        for off, t in blobs:
            if t.numel():
                self.f.seek(off)
                self.f.write(memoryview(t.view(-1).view(torch.uint8).numpy()))
        self.f.truncate(self.at)
        self.f.flush()
        self.index[name] = {"ints": ints, "tensors": where}
        return _views(self.f, self.index[name]) if blobs else dict(fields)

    def finish(self) -> None:
        header = json.dumps({"version": LAYOUT_VERSION, "data_bytes": self.at, "entries": self.index}).encode()
        self.f.seek(self.at)
        self.f.write(header + struct.pack("<Q", len(header)) + MAGIC)
        self.f.truncate()
        self.f.close()

    def abandon(self) -> None:
        self.f.close()
        self.path.unlink(missing_ok=True)


def _views(f, entry: dict, mm: mmap.mmap | None = None) -> dict:
    """An entry's fields with each tensor a view of `mm` (or of a map of the file's range it lies in)."""
    fields: dict = dict(entry["ints"])
    spans = [(off, off + math.prod(shape) * getattr(torch, dt).itemsize)
             for dt, shape, off in entry["tensors"].values()]
    base = 0
    if mm is None and spans:
        base = min(a for a, _ in spans) // ALIGN * ALIGN
        end = max(b for _, b in spans)
        mm = mmap.mmap(f.fileno(), end - base, access=mmap.ACCESS_COPY, offset=base) if end > base else None
    for k, (dtype, shape, off) in entry["tensors"].items():
        dt, count = getattr(torch, dtype), math.prod(shape)
        fields[k] = (torch.frombuffer(mm, dtype=dt, count=count, offset=off - base).view(shape) if count
                     else torch.empty(shape, dtype=dt))
    return fields


def map_file(path: Path) -> dict[str, dict]:
    """The entries of a cache file, every tensor a view of one copy-on-write map of it (nothing is
    read here but the header). CacheFileError when the file is not one this code wrote."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        tail = len(MAGIC) + 8
        if size < len(MAGIC) + tail or f.read(len(MAGIC)) != MAGIC:
            raise CacheFileError(f"expected a file starting with {MAGIC!r}")
        f.seek(size - tail)
        lead = f.read(tail)
        (n,) = struct.unpack("<Q", lead[:8])
        if lead[8:] != MAGIC or n > size - tail - len(MAGIC):
            raise CacheFileError("no header at its end (a file cut short, or another layout)")
        f.seek(size - tail - n)
        try:
            meta = json.loads(f.read(n))
        except ValueError as e:
            raise CacheFileError(f"the header is not JSON ({e})") from None
        if meta.get("version") != LAYOUT_VERSION or meta.get("data_bytes", -1) + n + tail != size:
            raise CacheFileError(f"expected layout {LAYOUT_VERSION} and {meta.get('data_bytes', 0) + n + tail} bytes, "
                                 f"found layout {meta.get('version')} and {size} bytes")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # writable: no torch warning
        return {name: _views(f, e, mm) for name, e in meta["entries"].items()}


class WeightCache:
    """Prepared tensors by name: `get(name)` from the cache file; `put(name, tensors)` writes them
    for the next load now and returns them mapped from what it wrote (the caller continues from
    those, freeing its own copy); `save()` once the load is done, `abandon()` if it failed."""

    def __init__(self, path: Path | None):
        self.path = path
        self._stored: dict | None = None
        self._writer: Writer | None = None
        self._failed = False
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

    def put(self, name: str, tensors: dict) -> dict | None:
        """Write `tensors` (a prepared matrix's state) for the next load; the same state mapped
        from the file, or None when there is no cache (or it could not be written: a warning)."""
        if self.path is None or self._failed:
            return None
        try:
            if self._writer is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tmp-", suffix=SUFFIX)
                os.close(fd)
                self._writer = Writer(Path(tmp))
            return self._writer.add(name, tensors)
        except OSError as e:
            self._fail(e)
            return None

    def _fail(self, e: OSError) -> None:
        print(f"minfer: could not write the weight cache {self.path} ({e.strerror or e}); the next load "
              "prepares the weights again", file=sys.stderr)
        self._failed = True
        self.abandon()

    def abandon(self) -> None:
        """Drop what this load wrote (a load that failed). The mapped tensors stay readable."""
        if self._writer is not None:
            self._writer.abandon()
            self._writer = None

    def save(self) -> None:
        """Finish the file this load wrote (the entries a cache file already held copied in
        first) and rename it over the old one; remove this model's cache files of other keys.
        Errors are a warning."""
        w = self._writer
        if self.path is None or w is None:
            return
        try:
            for name, fields in (self._stored or {}).items():
                if name not in w.index:
                    w.add(name, fields)
            w.finish()
            os.replace(w.path, self.path)
        except OSError as e:
            self._fail(e)
            return
        finally:
            self._writer = None
        # this model's files of other keys (or of the torch.save format): `-<32 hex>` after the
        # stem, so another model whose name starts with this one's keeps its file
        ours = re.compile(re.escape(self.path.name.rsplit("-", 1)[0]) + r"-[0-9a-f]{32}\.(mwc|pt)")
        for old in self.path.parent.iterdir():
            if old != self.path and ours.fullmatch(old.name):
                old.unlink(missing_ok=True)
