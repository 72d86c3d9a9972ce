"""Our own GGUF v3 writer, and the field-level encoders the hostile-input tests build on.

`write_gguf(path, metadata, tensors)` writes the header in one piece, then streams each
tensor's data chunk by chunk, so a 4 GB synthetic model never sits in memory. The file is
written under a temporary name and renamed at the end: a failed write leaves no half file.

Below it sit the pieces the header is made of. `HeaderBuilder` appends encoded fields and
records where each one lies, named the way reader.py names it in its errors ("n_kv",
"general.name.length", "blk.0.attn_q.weight.ne[1]", ...); the hostile suite and the fuzzer use
that map to cut or corrupt exactly one field. The raw encoders take any integer and wrap it
like C does (-1 -> all ones), so a test can write values no valid file holds.

Layout and value types: see reader.py.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..errors import GGUFError, QuantError
from ..quant.types import GGMLType, quant_info
from .reader import DEFAULT_ALIGNMENT, MAGIC, MAX_ALIGNMENT, SCALAR_DTYPES, GGUFReader, ValueType

GGUF_VERSION = 3


# ------------------------------------------------------------------------------ typed values
@dataclass(frozen=True)
class Value:
    """A metadata value with its GGUF type; `elem_type` for arrays."""

    type: ValueType
    value: Any
    elem_type: ValueType | None = None


def u32(v: int) -> Value:
    return Value(ValueType.UINT32, v)


def i32(v: int) -> Value:
    return Value(ValueType.INT32, v)


def f32(v: float) -> Value:
    return Value(ValueType.FLOAT32, v)


def string(v: str) -> Value:
    return Value(ValueType.STRING, v)


def boolean(v: bool) -> Value:
    return Value(ValueType.BOOL, v)


def array(elem_type: ValueType, values: Sequence) -> Value:
    return Value(ValueType.ARRAY, list(values), elem_type)


def _int_scalar_type(v: int) -> ValueType:
    if 0 <= v < 1 << 32:
        return ValueType.UINT32
    if -(1 << 31) <= v < 0:
        return ValueType.INT32
    return ValueType.INT64 if v < 0 else ValueType.UINT64


def _int_array_type(values: Sequence[int]) -> ValueType:
    lo, hi = min(values), max(values)
    if -(1 << 31) <= lo and hi < 1 << 31:
        return ValueType.INT32
    return ValueType.INT64 if lo < 0 else ValueType.UINT64


def infer(value: Any) -> Value:
    """The GGUF type llama.cpp's converters give a plain python value.

    bool -> BOOL, int -> UINT32 (INT32 if negative, 64-bit if wider), float -> FLOAT32,
    str -> STRING, list -> ARRAY of STRING, BOOL, INT32 (64-bit if wider) or FLOAT32.
    """
    if isinstance(value, Value):
        return value
    if isinstance(value, bool):
        return boolean(value)
    if isinstance(value, int):
        return Value(_int_scalar_type(value), value)
    if isinstance(value, float):
        return f32(value)
    if isinstance(value, str):
        return string(value)
    if isinstance(value, list | tuple) and value:
        kinds = {type(v) for v in value}
        if kinds == {str}:
            return array(ValueType.STRING, value)
        if kinds == {bool}:
            return array(ValueType.BOOL, value)
        if kinds == {int}:
            return array(_int_array_type(value), value)
        if kinds <= {int, float}:
            return array(ValueType.FLOAT32, value)
    raise GGUFError("metadata", 0, f"cannot infer a GGUF type for {type(value).__name__} {value!r:.60}; "
                                   "wrap it in writer.Value")


# ------------------------------------------------------------------------------ raw encoders
def enc_u32(v: int) -> bytes:
    """u32, wrapped modulo 2^32 like a C cast (so -1 writes 0xFFFFFFFF)."""
    return struct.pack("<I", v & 0xFFFFFFFF)


def enc_u64(v: int) -> bytes:
    """u64, wrapped modulo 2^64 (so -1 writes 0xFF x 8)."""
    return struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)


_PACK_U64 = struct.Struct("<Q").pack


def _utf8(s: str | bytes) -> bytes:
    return s if isinstance(s, bytes) else s.encode("utf-8", "surrogateescape")


def enc_str(s: str | bytes, length: int | None = None) -> bytes:
    """GGUF string: u64 length + bytes. `length` overrides the stored length (to lie about it)."""
    b = _utf8(s)
    return enc_u64(len(b) if length is None else length) + b


def enc_scalar(vtype: ValueType, value: Any) -> bytes:
    """One fixed-size value; typed error if it does not fit the type."""
    try:
        return np.array(value, dtype=SCALAR_DTYPES[vtype]).tobytes()
    except (OverflowError, ValueError, TypeError) as e:
        raise GGUFError("metadata", 0, f"{value!r:.60} is not a valid {vtype.name}: {e}") from None


def enc_array_payload(elem_type: ValueType, values: Sequence) -> bytes:
    """The elements of an array (after its elem type and count)."""
    if elem_type == ValueType.STRING:
        # enc_str for each, in C-level maps: a 262k-token vocabulary in ~0.1 s instead of ~1 s
        encoded = [v if isinstance(v, bytes) else v.encode("utf-8", "surrogateescape") for v in values]
        return b"".join(chain.from_iterable(zip(map(_PACK_U64, map(len, encoded)), encoded, strict=True)))
    if elem_type == ValueType.ARRAY:
        raise GGUFError("metadata", 0, "arrays of arrays are not supported")
    try:
        return np.asarray(values, dtype=SCALAR_DTYPES[elem_type]).tobytes()
    except (OverflowError, ValueError, TypeError) as e:
        raise GGUFError("metadata", 0, f"array elements are not valid {elem_type.name}: {e}") from None


# ------------------------------------------------------------------------------ header builder
class Field(NamedTuple):
    """Where one encoded field lies in a header, and the name reader.py gives it."""

    start: int
    end: int
    label: str
    kind: str  # magic|version|count|length|string|vtype|scalar|elems|n_dims|dim|ggml_type|offset|pad
    count_label: str | None = None  # the array count that covers this field, for array elements


class HeaderBuilder:
    """Appends GGUF header fields, any value allowed, and maps each field's byte range.

    Methods return self so a test can chain them; `bytes()` gives the header so far.
    `map_fields=False` skips the map (a 150k-token vocabulary then encodes ~5x faster).
    """

    def __init__(self, map_fields: bool = True) -> None:
        self._parts: list[bytes] = []
        self.size = 0
        self.fields: list[Field] = []
        self.map_fields = map_fields

    def raw(self, b: bytes, label: str = "raw", kind: str = "raw",
            count_label: str | None = None) -> HeaderBuilder:
        if self.map_fields:
            self.fields.append(Field(self.size, self.size + len(b), label, kind, count_label))
        self._parts.append(b)
        self.size += len(b)
        return self

    def u32(self, v: int, label: str, kind: str) -> HeaderBuilder:
        return self.raw(enc_u32(v), label, kind)

    def u64(self, v: int, label: str, kind: str) -> HeaderBuilder:
        return self.raw(enc_u64(v), label, kind)

    def string(self, s: str | bytes, label: str, length: int | None = None,
               count_label: str | None = None) -> HeaderBuilder:
        b = _utf8(s)
        self.raw(enc_u64(len(b) if length is None else length), f"{label}.length", "length", count_label)
        return self.raw(b, label, "string", count_label)

    def header(self, n_tensors: int, n_kv: int, version: int = GGUF_VERSION,
               magic: bytes = MAGIC) -> HeaderBuilder:
        self.raw(magic, "magic", "magic")
        self.u32(version, "version", "version")
        self.u64(n_tensors, "n_tensors", "count")
        return self.u64(n_kv, "n_kv", "count")

    def kv(self, index: int, key: str | bytes, value: Value | Any) -> HeaderBuilder:
        """One key/value; `value.type` may be any u32 (an unknown type id writes no payload)."""
        value = infer(value)
        self.string(key, f"kv[{index}].key")
        name = _utf8(key).decode("utf-8", "replace")
        self.u32(value.type, f"{name}.type", "vtype")
        return self.value(name, value)

    def value(self, name: str, value: Value) -> HeaderBuilder:
        """The payload of a value whose type field is already written."""
        vtype = value.type
        if vtype == ValueType.STRING:
            return self.string(value.value, name)
        if vtype == ValueType.ARRAY:
            self.u32(value.elem_type, f"{name}.elem_type", "vtype")
            values = value.value
            self.u64(len(values), f"{name}.count", "count")
            if value.elem_type == ValueType.STRING and self.map_fields:
                for i, s in enumerate(values):
                    self.string(s, f"{name}[{i}]", count_label=f"{name}.count")
                return self
            if value.elem_type in SCALAR_DTYPES or value.elem_type == ValueType.STRING:
                self.raw(enc_array_payload(value.elem_type, values), f"{name}[*]", "elems", f"{name}.count")
            return self
        if vtype in SCALAR_DTYPES:
            return self.raw(enc_scalar(vtype, value.value), name, "scalar")
        return self  # an unknown type id: nothing a reader could parse follows

    def tensor_info(self, index: int, name: str | bytes, shape: Sequence[int], ggml_type: int,
                    offset: int, n_dims: int | None = None) -> HeaderBuilder:
        """One tensor info; `n_dims` overrides the stored dim count (shape is written as given)."""
        self.string(name, f"tensor[{index}].name")
        label = _utf8(name).decode("utf-8", "replace")
        self.u32(len(shape) if n_dims is None else n_dims, f"{label}.n_dims", "n_dims")
        for d, ne in enumerate(shape):
            self.u64(ne, f"{label}.ne[{d}]", "dim")
        self.u32(ggml_type, f"{label}.type", "ggml_type")
        return self.u64(offset, f"{label}.offset", "offset")

    def pad(self, alignment: int = DEFAULT_ALIGNMENT) -> HeaderBuilder:
        """Zero bytes up to the next multiple of `alignment` (the start of the data section)."""
        return self.raw(b"\0" * ((-self.size) % alignment), "data", "pad")

    def bytes(self) -> bytes:
        return b"".join(self._parts)


def reencode_header(reader: GGUFReader, max_array: int | None = None,
                    map_fields: bool = True) -> HeaderBuilder:
    """An open reader's header encoded again, padded to its data section.

    Byte-identical to the original for files that follow the format's conventions (llama.cpp's
    writers do). `max_array` keeps only the first elements of longer arrays: a real header
    with a small vocabulary, which the fuzzer mutates much faster. Tensor offsets are kept.
    """
    hb = HeaderBuilder(map_fields).header(len(reader.tensors), len(reader.kv), version=reader.version)
    for i, (key, kv) in enumerate(reader.kv.items()):
        value = kv.value[:max_array] if max_array is not None and kv.type == ValueType.ARRAY else kv.value
        hb.kv(i, key, Value(kv.type, value, kv.elem_type))
    for i, t in enumerate(reader.tensors.values()):
        hb.tensor_info(i, t.name, t.shape, t.ggml_type, t.offset - reader.data_offset)
    return hb.pad(reader.alignment)


# ------------------------------------------------------------------------------ whole files
Metadata = Mapping[str, Value | Any] | Sequence[tuple[str, ValueType, Any]]
# raw bytes / one array, or an iterable of chunks, or a callable returning such (called lazily)
TensorData = bytes | bytearray | memoryview | np.ndarray | Iterable | Callable[[], Any]


class TensorSpec(NamedTuple):
    """One tensor to write. `shape` is in GGUF order (ne0 first); `data` its raw block bytes."""

    name: str
    shape: Sequence[int]
    ggml_type: GGMLType
    data: TensorData


def _metadata_items(metadata: Metadata) -> list[tuple[str, Value]]:
    """(key, Value) pairs from a dict (plain values inferred) or (key, type, value) triples.

    In the triple form an ARRAY's value is (elem_type, values).
    """
    if isinstance(metadata, Mapping):
        return [(k, infer(v)) for k, v in metadata.items()]
    items = []
    for key, vtype, value in metadata:
        vtype = ValueType(vtype)
        if vtype == ValueType.ARRAY:
            elem_type, values = value
            items.append((key, array(ValueType(elem_type), values)))
        else:
            items.append((key, Value(vtype, value)))
    return items


def _chunks(data: TensorData) -> Iterable:
    if callable(data):
        data = data()
    if isinstance(data, bytes | bytearray | memoryview | np.ndarray):
        return (data,)
    return data


def _as_bytes(chunk) -> memoryview:
    if isinstance(chunk, np.ndarray):
        if chunk.dtype.byteorder == ">":
            chunk = chunk.astype(chunk.dtype.newbyteorder("<"))
        chunk = np.ascontiguousarray(chunk)
    return memoryview(chunk).cast("B")


def data_layout(tensors: Sequence[TensorSpec], alignment: int) -> list[tuple[int, int]]:
    """(offset in the data section, nbytes) of each tensor, packed in order and aligned."""
    out, offset = [], 0
    for t in tensors:
        info = quant_info(t.ggml_type)
        shape = [int(n) for n in t.shape]
        if not 1 <= len(shape) <= 4 or min(shape) < 1 or shape[0] % info.block_elems:
            raise QuantError(f"{t.name}: shape {shape} is not 1..4 positive dims with ne0 a multiple of "
                             f"{info.name}'s block size {info.block_elems}")
        nbytes = info.nbytes(math.prod(shape))
        out.append((offset, nbytes))
        offset += nbytes + (-nbytes) % alignment
    return out


def build_header(metadata: Metadata, tensors: Sequence[TensorSpec], alignment: int = DEFAULT_ALIGNMENT,
                 map_fields: bool = False) -> tuple[HeaderBuilder, list[tuple[int, int]]]:
    """The header of a valid file (padded to the data section) and each tensor's (offset, nbytes).

    A `general.alignment` key is added when `alignment` is not the default.
    """
    if not (0 < alignment <= MAX_ALIGNMENT) or alignment & (alignment - 1):
        raise GGUFError("general.alignment", 0, f"{alignment} is not a power of two in 1..{MAX_ALIGNMENT}")
    items = _metadata_items(metadata)
    keys = [k for k, _ in items]
    if len(set(keys)) != len(keys):
        raise GGUFError("metadata", 0, "duplicate keys")
    if "general.alignment" in keys:
        stated = dict(items)["general.alignment"].value
        if stated != alignment:
            raise GGUFError("general.alignment", 0, f"metadata says {stated}, the argument {alignment}")
    elif alignment != DEFAULT_ALIGNMENT:
        items.append(("general.alignment", u32(alignment)))
    layout = data_layout(tensors, alignment)
    hb = HeaderBuilder(map_fields).header(len(tensors), len(items))
    for i, (key, value) in enumerate(items):
        hb.kv(i, key, value)
    for i, (t, (offset, _)) in enumerate(zip(tensors, layout, strict=True)):
        hb.tensor_info(i, t.name, [int(n) for n in t.shape], int(t.ggml_type), offset)
    return hb.pad(alignment), layout


def write_gguf(path: str | os.PathLike, metadata: Metadata, tensors: Sequence[TensorSpec | tuple],
               alignment: int = DEFAULT_ALIGNMENT, progress: Callable[[int], None] | None = None,
               sparse: bool = False) -> Path:
    """Write a GGUF v3 file; returns its path.

    `tensors`: (name, shape in ne order, GGMLType, data) where data is the tensor's raw bytes
    (bytes-like or an ndarray, written as its little-endian bytes), an iterable of such chunks,
    or a callable returning one (called only when that tensor is written). The byte count must
    be exactly the type's size for the shape (QuantError otherwise). `progress(n)` is called
    with each chunk's byte count. An unwritable path or a full disk is a GGUFError("file").
    `sparse`: write the header only and leave the data a hole of zero bytes (the tensors' data is
    never asked for): a file of the real size in no disk space, for shape and plan checks.
    """
    path = Path(path)
    specs = [TensorSpec(name, shape, quant_info(qtype).type, data) for name, shape, qtype, data in tensors]
    hb, layout = build_header(metadata, specs, alignment)
    tmp = path.with_name(path.name + ".partial")
    try:
        with open(tmp, "wb") as f:
            f.write(hb.bytes())
            if sparse:
                f.truncate(f.tell() + sum(nbytes + (-nbytes) % alignment for _, nbytes in layout))
            for t, (_, nbytes) in zip([] if sparse else specs, [] if sparse else layout, strict=True):
                written = 0
                for chunk in _chunks(t.data):
                    mv = _as_bytes(chunk)
                    written += len(mv)
                    if written > nbytes:
                        break
                    f.write(mv)
                    if progress is not None:
                        progress(len(mv))
                if written != nbytes:
                    more = "more than " if written > nbytes else ""
                    raise QuantError(f"{t.name}: data has {more}{written} bytes; "
                                     f"{t.ggml_type.name} {list(t.shape)} needs {nbytes}")
                f.write(b"\0" * ((-nbytes) % alignment))
        os.replace(tmp, path)
    except BaseException as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise GGUFError("file", 0, f"cannot write {path}: {e.strerror or e}") from None
        raise
    return path


def rewrite_gguf(src: str | os.PathLike, dst: str | os.PathLike, *, drop: Sequence[str] = (),
                 meta: Mapping[str, Any] | None = None, shapes: Mapping[str, tuple] | None = None,
                 add: Sequence[tuple] = ()) -> Path:
    """A copy of the GGUF file `src` at `dst` with tensors dropped, metadata values replaced or
    added (key -> value, kept in the key's type, or key -> (ValueType, value)), tensors declared
    with another shape of the same size, or tensors added ((name, shape, type, bytes)): hostile
    variants of a valid file, for the tests and the fuzzers."""
    from .reader import GGUFReader

    meta, shapes = dict(meta or {}), dict(shapes or {})
    with GGUFReader(src) as r:
        md = []
        for k, kv in r.kv.items():
            if k in meta:
                new = meta.pop(k)
                md.append((k, *new) if isinstance(new, tuple) else (k, kv.type, new))
            elif kv.type == ValueType.ARRAY:
                md.append((k, kv.type, (kv.elem_type, kv.value)))
            else:
                md.append((k, kv.type, kv.value))
        md += [(k, *v) for k, v in meta.items()]
        tensors = [(n, shapes.get(n, t.shape), t.ggml_type, bytes(r.tensor_bytes(n)))
                   for n, t in r.tensors.items() if n not in drop]
    return write_gguf(dst, md, tensors + list(add))
