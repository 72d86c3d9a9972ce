"""A validating GGUF reader.

The file is memory-mapped and the whole header (key/values and tensor infos) is parsed and
validated before any tensor byte is touched. Every bound is checked against the bytes that
are actually left, and counts are capped far above any real model, so a hostile file can
neither make us allocate much more than its own size nor loop longer than its length allows.
Every failure is a GGUFError(field, offset, reason); `field` names the exact field
("n_kv", "general.name.length", "tokenizer.ggml.tokens[7]", "blk.0.attn_q.weight.ne[1]", ...).

Layout (GGUF v2/v3, little-endian):
    magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
    n_kv x (key: string, type: u32, value)
    n_tensors x (name: string, n_dims: u32, ne[n_dims]: u64, type: u32, offset: u64)
    padding to `general.alignment` (default 32) | tensor data
    string = u64 length + UTF-8 bytes; array = elem type u32 + count u64 + elements

Like llama.cpp's gguf.cpp we reject arrays of arrays (no model uses them); unlike it we also
reject empty keys, empty tensors (a dimension of 0), n_dims 0, bool bytes other than 0/1 and
tensors whose data overlap, and we do not require tensors to be stored in header order.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import GGUFError, MetadataError, UnsupportedError
from ..quant.types import GGMLType, quant_info

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 20
# One string value: the longest real ones are chat templates of tens of KB. Decoding can cost up
# to 4x the bytes (one astral character makes a str 4 bytes per char), so 16 MiB keeps one
# hostile string under ~64 MB. (The spec's optional embedded tokenizer.json is not written by
# llama.cpp's converters.)
MAX_STRING_BYTES = 16 << 20
MAX_DIMS = 4
MAX_NAME_BYTES = 63  # ggml's GGML_MAX_NAME is 64 including the terminating NUL
MAX_ELEMS = 1 << 62
# Counts far above any real model (the largest vocabularies hold ~260k tokens, the largest
# files a few thousand tensors and ~100 keys). They bound the Python objects a hostile file can
# make us build, on top of the bound that the bytes left in the file already give.
MAX_KV = 1 << 16
MAX_TENSORS = 1 << 16
MAX_ARRAY_ELEMS = 1 << 22


class ValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# numpy little-endian dtype of each fixed-size scalar type
SCALAR_DTYPES = {
    ValueType.UINT8: np.dtype("<u1"),
    ValueType.INT8: np.dtype("<i1"),
    ValueType.UINT16: np.dtype("<u2"),
    ValueType.INT16: np.dtype("<i2"),
    ValueType.UINT32: np.dtype("<u4"),
    ValueType.INT32: np.dtype("<i4"),
    ValueType.FLOAT32: np.dtype("<f4"),
    ValueType.BOOL: np.dtype("<u1"),
    ValueType.UINT64: np.dtype("<u8"),
    ValueType.INT64: np.dtype("<i8"),
    ValueType.FLOAT64: np.dtype("<f8"),
}
_INT_TYPES = {ValueType.UINT8, ValueType.INT8, ValueType.UINT16, ValueType.INT16, ValueType.UINT32,
              ValueType.INT32, ValueType.UINT64, ValueType.INT64}
_FLOAT_TYPES = {ValueType.FLOAT32, ValueType.FLOAT64}
# smallest encoded size of one element of each type (bounds counts by the bytes left)
_MIN_SIZE = {**{t: d.itemsize for t, d in SCALAR_DTYPES.items()}, ValueType.STRING: 8}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry. `shape` is in GGUF order (ne0 = the contiguous, input dim)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: GGMLType
    offset: int  # absolute byte offset in the file
    nbytes: int
    n_elems: int

    @property
    def torch_shape(self) -> tuple[int, ...]:
        """Row-major shape, outermost first: GGUF [in, out] -> torch (out, in)."""
        return tuple(reversed(self.shape))


@dataclass(frozen=True)
class KV:
    """One metadata entry: its python value and its stored GGUF type(s)."""

    value: Any
    type: ValueType
    elem_type: ValueType | None = None  # for arrays
    offset: int = 0


class _Cursor:
    """Bounds-checked little-endian reads over the mapped header."""

    def __init__(self, buf, size: int):
        self.buf = buf
        self.size = size
        self.pos = 0

    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, field: str) -> None:
        if n < 0 or n > self.left():
            raise GGUFError(field, self.pos, f"needs {n} bytes but only {self.left()} remain in the file")

    def take(self, n: int, field: str) -> bytes:
        self.need(n, field)
        self.pos += n
        return self.buf[self.pos - n:self.pos]

    def _fixed(self, st: struct.Struct, field: str) -> int:
        self.need(st.size, field)
        (v,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return v

    def u32(self, field: str) -> int:
        return self._fixed(_U32, field)

    def u64(self, field: str) -> int:
        return self._fixed(_U64, field)

    def string(self, field: str, *, strict: bool) -> str:
        start = self.pos
        n = self.u64(f"{field}.length")
        if n > MAX_STRING_BYTES:
            raise GGUFError(f"{field}.length", start,
                            f"string length {n} exceeds the {MAX_STRING_BYTES}-byte limit")
        self.need(n, field)
        self.pos += n
        try:
            # decoded straight from the map: a long string costs its str, not a bytes copy too
            raw = memoryview(self.buf)[self.pos - n:self.pos]
            return str(raw, "utf-8", "strict" if strict else "surrogateescape")
        except UnicodeDecodeError as e:
            raise GGUFError(field, start, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None

    def string_array(self, count: int, field: str) -> list[str]:
        """`count` strings in a row (a vocabulary): the loop of string() with locals hoisted."""
        buf, size, pos = self.buf, self.size, self.pos
        unpack = _U64.unpack_from
        out: list[str] = []
        append = out.append
        for i in range(count):
            if size - pos < 8:
                self.pos = pos
                self.need(8, f"{field}[{i}].length")
            (n,) = unpack(buf, pos)
            if n > size - pos - 8 or n > MAX_STRING_BYTES:
                self.pos = pos
                self.string(f"{field}[{i}]", strict=False)  # raises the precise error
            a, b = pos + 8, pos + 8 + n
            # short strings decode fastest from a bytes slice; long ones without that copy
            append(buf[a:b].decode("utf-8", "surrogateescape") if n < 4096
                   else str(memoryview(buf)[a:b], "utf-8", "surrogateescape"))
            pos = b
        self.pos = pos
        return out


class GGUFReader:
    """Validated, memory-mapped view of one GGUF file.

    `metadata` maps key -> python value (lists for arrays); `kv` keeps the stored types;
    `tensors` maps name -> TensorInfo in file order. Tensor bytes are zero-copy views.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._mm = None
        try:
            # O_NONBLOCK: opening a FIFO must not hang; it is rejected just below
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            raise GGUFError("file", 0, f"cannot open {self.path}: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise GGUFError("file", 0, f"{self.path} is not a regular file")
            self.file_size = st.st_size
            if self.file_size == 0:
                raise GGUFError("magic", 0, "the file is empty")
            # ACCESS_COPY: writable copy-on-write pages, so torch/numpy views need no copy and
            # nothing can ever be written back to the file.
            self._mm = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
        except OSError as e:
            raise GGUFError("file", 0, f"cannot map {self.path}: {e.strerror}") from None
        finally:
            os.close(fd)
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ parsing
    def _parse(self) -> None:
        c = _Cursor(self._mm, self.file_size)
        magic = c.take(min(4, self.file_size), "magic")
        if magic != MAGIC:
            raise GGUFError("magic", 0, f"expected b'GGUF', found {magic!r}")
        self.version = c.u32("version")
        if self.version not in SUPPORTED_VERSIONS:
            swapped = int.from_bytes(self.version.to_bytes(4, "little"), "big")
            big_endian = swapped in SUPPORTED_VERSIONS
            hint = " (a big-endian file; only little-endian GGUF is supported)" if big_endian else ""
            raise GGUFError("version", 4, f"version {self.version} is not supported (expected 2 or 3){hint}")
        n_tensors = c.u64("n_tensors")
        n_kv = c.u64("n_kv")
        if n_tensors > MAX_TENSORS:
            raise GGUFError("n_tensors", 8, f"{n_tensors} tensors exceeds the limit of {MAX_TENSORS}")
        if n_kv > MAX_KV:
            raise GGUFError("n_kv", 16, f"{n_kv} key/values exceeds the limit of {MAX_KV}")
        # each kv needs >= 13 bytes (key length, type, 1-byte value); each tensor info >= 28
        if n_kv * 13 > c.left():
            raise GGUFError("n_kv", 16, f"{n_kv} key/values cannot fit in the {c.left()} bytes left")
        if n_tensors * 28 > c.left():
            raise GGUFError("n_tensors", 8,
                            f"{n_tensors} tensor infos cannot fit in the {c.left()} bytes left")

        self.kv: dict[str, KV] = {}
        for i in range(n_kv):
            key_off = c.pos
            key = c.string(f"kv[{i}].key", strict=True)
            if not key:
                raise GGUFError(f"kv[{i}].key", key_off, "empty key")
            if key in self.kv:
                raise GGUFError(f"kv[{i}].key", key_off, f"duplicate key {key!r}")
            vt_off = c.pos
            vtype = self._value_type(c.u32(f"{key}.type"), f"{key}.type", vt_off)
            value, elem = self._read_value(c, vtype, key)
            self.kv[key] = KV(value, vtype, elem, key_off)
        self.metadata: dict[str, Any] = {k: v.value for k, v in self.kv.items()}

        self.alignment = DEFAULT_ALIGNMENT
        if "general.alignment" in self.kv:
            a = self.kv["general.alignment"]
            if a.type not in _INT_TYPES:
                raise GGUFError("general.alignment", a.offset, f"must be an integer, found {a.type.name}")
            if not (0 < a.value <= MAX_ALIGNMENT) or a.value & (a.value - 1):
                raise GGUFError("general.alignment", a.offset,
                                f"{a.value} is not a power of two in 1..{MAX_ALIGNMENT}")
            self.alignment = int(a.value)

        raw_infos = []
        names: set[str] = set()
        for i in range(n_tensors):
            off = c.pos
            name = c.string(f"tensor[{i}].name", strict=True)
            if not name or len(name.encode()) > MAX_NAME_BYTES:
                raise GGUFError(f"tensor[{i}].name", off,
                                f"name is {len(name.encode())} bytes; expected 1..{MAX_NAME_BYTES}")
            if name in names:
                raise GGUFError(f"tensor[{i}].name", off, f"duplicate tensor name {name!r}")
            names.add(name)
            nd_off = c.pos
            n_dims = c.u32(f"{name}.n_dims")
            if not 1 <= n_dims <= MAX_DIMS:
                raise GGUFError(f"{name}.n_dims", nd_off, f"{n_dims} dims; expected 1..{MAX_DIMS}")
            dims = []
            n_elems = 1
            for d in range(n_dims):
                d_off = c.pos
                ne = c.u64(f"{name}.ne[{d}]")
                if ne < 1:
                    raise GGUFError(f"{name}.ne[{d}]", d_off, "dimension is 0")
                if ne >= 1 << 63:
                    raise GGUFError(f"{name}.ne[{d}]", d_off,
                                    f"dimension {ne - (1 << 64)} is negative (as int64)")
                n_elems *= ne
                if n_elems > MAX_ELEMS:
                    raise GGUFError(f"{name}.ne[{d}]", d_off, "element count overflows (> 2^62)")
                dims.append(ne)
            t_off = c.pos
            type_id = c.u32(f"{name}.type")
            try:
                info = quant_info(type_id)
            except UnsupportedError as e:
                raise GGUFError(f"{name}.type", t_off, str(e)) from None
            if dims[0] % info.block_elems:
                raise GGUFError(f"{name}.ne[0]", t_off,
                                f"{dims[0]} is not a multiple of {info.name}'s block size {info.block_elems}")
            o_off = c.pos
            rel = c.u64(f"{name}.offset")
            if rel % self.alignment:
                raise GGUFError(f"{name}.offset", o_off, f"offset {rel} is not aligned to {self.alignment}")
            raw_infos.append((name, tuple(dims), info, rel, n_elems, o_off))

        pad = (-c.pos) % self.alignment
        self.data_offset = c.pos + pad
        if self.data_offset > self.file_size and raw_infos:
            raise GGUFError("data", c.pos, "the data section starts past the end of the file")

        self.tensors: dict[str, TensorInfo] = {}
        spans = []
        for name, dims, info, rel, n_elems, o_off in raw_infos:
            nbytes = n_elems // info.block_elems * info.block_bytes
            start = self.data_offset + rel
            if start + nbytes > self.file_size:
                raise GGUFError(f"{name}.offset", o_off, f"data [{start}, {start + nbytes}) extends past "
                                                         f"the file end ({self.file_size})")
            spans.append((start, start + nbytes, name, o_off))
            self.tensors[name] = TensorInfo(name, dims, info.type, start, nbytes, n_elems)
        spans.sort()
        # sorted by start, any overlap shows up between neighbours
        for (s0, e0, n0, _), (s1, _e1, n1, o1) in zip(spans, spans[1:], strict=False):
            if s1 < e0:
                raise GGUFError(f"{n1}.offset", o1, f"data overlaps tensor {n0!r} ([{s0}, {e0}))")

    @staticmethod
    def _value_type(raw: int, field: str, offset: int) -> ValueType:
        try:
            return ValueType(raw)
        except ValueError:
            raise GGUFError(field, offset, f"unknown value type {raw} (expected 0..12)") from None

    def _read_value(self, c: _Cursor, vtype: ValueType, key: str):
        if vtype == ValueType.STRING:
            return c.string(key, strict=False), None
        if vtype == ValueType.ARRAY:
            start = c.pos
            et = self._value_type(c.u32(f"{key}.elem_type"), f"{key}.elem_type", start)
            if et == ValueType.ARRAY:
                raise GGUFError(f"{key}.elem_type", start, "arrays of arrays are not supported")
            count = c.u64(f"{key}.count")
            if count > MAX_ARRAY_ELEMS:
                raise GGUFError(f"{key}.count", start + 4,
                                f"{count} elements exceeds the limit of {MAX_ARRAY_ELEMS}")
            if count * _MIN_SIZE[et] > c.left():
                raise GGUFError(f"{key}.count", start + 4,
                                f"{count} elements of {et.name} cannot fit in the {c.left()} bytes left")
            if et == ValueType.STRING:
                return c.string_array(count, key), et
            dt = SCALAR_DTYPES[et]
            arr = np.frombuffer(self._mm, dtype=dt, count=count, offset=c.pos)
            if et == ValueType.BOOL and count and arr.max() > 1:
                bad = int(np.argmax(arr > 1))
                raise GGUFError(f"{key}[{bad}]", c.pos + bad,
                                f"bool value {int(arr[bad])} is neither 0 nor 1")
            c.pos += count * dt.itemsize
            if et == ValueType.BOOL:
                return [bool(x) for x in arr], et
            return arr.tolist(), et
        dt = SCALAR_DTYPES[vtype]
        c.need(dt.itemsize, key)
        v = np.frombuffer(self._mm, dtype=dt, count=1, offset=c.pos)[0]
        if vtype == ValueType.BOOL and v > 1:
            raise GGUFError(key, c.pos, f"bool value {int(v)} is neither 0 nor 1")
        c.pos += dt.itemsize
        if vtype == ValueType.BOOL:
            return bool(v), None
        return (float(v) if vtype in _FLOAT_TYPES else int(v)), None

    # ------------------------------------------------------------------ typed metadata access
    _MISSING = object()

    def _get(self, key: str, default: Any) -> KV | None:
        kv = self.kv.get(key)
        if kv is None and default is self._MISSING:
            raise MetadataError(key, "missing")
        return kv

    def get_str(self, key: str, default: Any = _MISSING) -> str:
        kv = self._get(key, default)
        if kv is None:
            return default
        if kv.type != ValueType.STRING:
            raise MetadataError(key, f"expected a string, found {kv.type.name}")
        return kv.value

    def get_int(self, key: str, default: Any = _MISSING) -> int:
        kv = self._get(key, default)
        if kv is None:
            return default
        if kv.type not in _INT_TYPES:
            raise MetadataError(key, f"expected an integer, found {kv.type.name}")
        return kv.value

    def get_float(self, key: str, default: Any = _MISSING) -> float:
        kv = self._get(key, default)
        if kv is None:
            return default
        if kv.type not in _FLOAT_TYPES | _INT_TYPES:
            raise MetadataError(key, f"expected a number, found {kv.type.name}")
        return float(kv.value)

    def get_bool(self, key: str, default: Any = _MISSING) -> bool:
        kv = self._get(key, default)
        if kv is None:
            return default
        if kv.type != ValueType.BOOL:
            raise MetadataError(key, f"expected a bool, found {kv.type.name}")
        return kv.value

    def get_array(self, key: str, elem: str, default: Any = _MISSING) -> list:
        """An array whose elements are `elem`: "str", "int", "float" or "bool"."""
        kv = self._get(key, default)
        if kv is None:
            return default
        allowed = {"str": {ValueType.STRING}, "int": _INT_TYPES, "float": _FLOAT_TYPES | _INT_TYPES,
                   "bool": {ValueType.BOOL}}[elem]
        if kv.type != ValueType.ARRAY or kv.elem_type not in allowed:
            found = kv.type.name if kv.type != ValueType.ARRAY else f"ARRAY of {kv.elem_type.name}"
            raise MetadataError(key, f"expected an array of {elem}, found {found}")
        return kv.value

    # ------------------------------------------------------------------ tensors
    def tensor_info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise MetadataError(name, "no such tensor in the file") from None

    def tensor_bytes(self, name: str) -> np.ndarray:
        """Zero-copy uint8 view of a tensor's raw (possibly quantized) bytes."""
        t = self.tensor_info(name)
        if self._mm is None:
            raise GGUFError("file", 0, f"{self.path} is closed; reopen it to read tensor {name!r}")
        return np.frombuffer(self._mm, dtype=np.uint8, count=t.nbytes, offset=t.offset)

    def release(self, name: str) -> None:
        """Drop the resident pages of a tensor's bytes (madvise DONTNEED) once a backend holds
        its own copy: resident memory stays the size of the model, not model + file. The
        bytes stay readable (a later read maps them from the file again)."""
        t = self.tensor_info(name)
        if self._mm is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        start = -(-t.offset // page) * page  # whole pages inside the tensor only
        end = (t.offset + t.nbytes) // page * page
        if end > start:
            self._mm.madvise(mmap.MADV_DONTNEED, start, end - start)

    def architecture(self) -> str:
        return self.get_str("general.architecture")

    def close(self) -> None:
        mm = self._mm
        if mm is not None:
            self._mm = None
            try:
                mm.close()
            except BufferError:
                # live numpy/torch views still reference the map; it is freed with them
                pass

    def __enter__(self) -> GGUFReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
