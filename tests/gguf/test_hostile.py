"""Hand-crafted malformed GGUF files: each must fail with GGUFError naming the bad field.

A superset of the classes of llama.cpp's tests/test-gguf.cpp (bad magic/version/counts, bad key
size/type, duplicate key, bad alignment, bad tensor name/n_dims/shape/type/offset, duplicate
names, inconsistent alignment, not enough data), the 2026 CVE classes (llama.cpp CVE-2026-27940's
size computations that wrap, Ollama CVE-2026-7482's offset + size past the file), plus truncation
at every byte of a valid file.
Files are built field by field with writer.HeaderBuilder, which can write any value.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from minfer.errors import GGUFError
from minfer.gguf.reader import MAX_STRING_BYTES, GGUFReader, ValueType
from minfer.gguf.writer import (
    HeaderBuilder,
    TensorSpec,
    Value,
    array,
    build_header,
    enc_u32,
    enc_u64,
    string,
    u32,
)

V = ValueType
F32, Q4_0, Q8_0, Q6_K, I8 = 0, 2, 8, 14, 24
BIG = 4 * (2**31 - 1)  # llama.cpp's NE_TOO_BIG dimension


def H(n_tensors: int = 0, n_kv: int = 0, **kw) -> HeaderBuilder:
    return HeaderBuilder().header(n_tensors, n_kv, **kw)


def kv_file(key, value, *, tail: bytes = b"", n_kv: int = 1) -> bytes:
    """A file with one key/value (value: a Value, or raw bytes written after an u32 type)."""
    return H(0, n_kv).kv(0, key, value).bytes() + tail


def tensor_file(*infos, data: bytes | None = None, kvs=(), pad: bool = True) -> bytes:
    """Tensor infos (name, shape, type, offset[, n_dims]) + padding + data (default: 64 zero bytes)."""
    hb = H(len(infos), len(kvs))
    for i, (k, v) in enumerate(kvs):
        hb.kv(i, k, v)
    for i, info in enumerate(infos):
        hb.tensor_info(i, *info)
    align = dict(kvs).get("general.alignment", u32(32)).value
    if pad:
        hb.pad(align if isinstance(align, int) and align > 0 else 32)
    return hb.bytes() + (b"\0" * 64 if data is None else data)


def raw_kv(key: str, vtype: int, payload: bytes, n_kv: int = 1) -> bytes:
    """A key/value with an arbitrary type id and payload bytes."""
    return H(0, n_kv).string(key, "kv[0].key").raw(enc_u32(vtype)).raw(payload).bytes()


CASES = [
    # ---------------------------------------------------------------- header
    ("empty_file", b"", "magic", "empty"),
    ("short_magic", b"GGU", "magic", "expected b'GGUF'"),
    ("bad_magic", H(magic=b"FUGG").bytes(), "magic", "found b'FUGG'"),
    ("ggml_legacy_magic", H(magic=b"lmgg").bytes(), "magic", "expected b'GGUF'"),
    ("version_0", H(version=0).bytes(), "version", "version 0 is not supported"),
    ("version_1", H(version=1).bytes(), "version", "version 1 is not supported"),
    ("version_future", H(version=4).bytes(), "version", "version 4 is not supported"),
    ("version_big_endian", H(version=3 << 24).bytes(), "version", "big-endian"),
    ("truncated_after_version", b"GGUF" + enc_u32(3) + b"\0\0", "n_tensors", "needs 8 bytes"),
    ("truncated_n_kv", b"GGUF" + enc_u32(3) + enc_u64(0) + b"\0" * 7, "n_kv", "needs 8 bytes"),
    ("n_tensors_minus_1", H(-1, 0).bytes(), "n_tensors", "exceeds the limit"),
    ("n_tensors_cannot_fit", H(1000, 0).bytes() + b"\0" * 100, "n_tensors", "cannot fit"),
    ("n_kv_minus_1", H(0, -1).bytes(), "n_kv", "exceeds the limit"),
    ("n_kv_2pow31", H(0, 2**31).bytes(), "n_kv", "exceeds the limit"),
    ("n_kv_cannot_fit", H(0, 50).bytes() + b"\0" * 100, "n_kv", "cannot fit"),
    # ---------------------------------------------------------------- keys
    ("key_length_minus_1", H(0, 1).string("k", "kv[0].key", length=-1).bytes() + b"\0" * 16,
     "kv[0].key.length", "exceeds"),
    ("key_length_past_eof", H(0, 1).string("abc", "kv[0].key", length=1000).bytes() + b"\0" * 16,
     "kv[0].key", "needs 1000 bytes"),
    ("key_empty", kv_file("", u32(1)), "kv[0].key", "empty key"),
    ("key_not_utf8", kv_file(b"\xff\xfekey", u32(1)), "kv[0].key", "not valid UTF-8"),
    ("key_duplicate", H(0, 2).kv(0, "a", u32(1)).kv(1, "a", u32(2)).bytes(), "kv[1].key",
     "duplicate key 'a'"),
    # ---------------------------------------------------------------- value types and values
    ("value_type_13", raw_kv("k", 13, b"\0" * 8), "k.type", "unknown value type 13"),
    ("value_type_minus_1", raw_kv("k", -1, b"\0" * 8), "k.type", "unknown value type 4294967295"),
    ("array_of_arrays", kv_file("k", Value(V.ARRAY, [[1]], V.ARRAY), tail=b"\0" * 16),
     "k.elem_type", "arrays of arrays"),
    ("array_elem_type_99", raw_kv("k", V.ARRAY, enc_u32(99) + enc_u64(1) + b"\0" * 8), "k.elem_type",
     "unknown value type 99"),
    ("array_count_2pow62", raw_kv("k", V.ARRAY, enc_u32(V.UINT8) + enc_u64(2**62)), "k.count",
     "exceeds the limit"),
    ("array_count_minus_1", raw_kv("k", V.ARRAY, enc_u32(V.STRING) + enc_u64(-1)), "k.count",
     "exceeds the limit"),
    ("array_count_past_eof", raw_kv("k", V.ARRAY, enc_u32(V.UINT32) + enc_u64(1000) + b"\0" * 40), "k.count",
     "1000 elements of UINT32 cannot fit"),
    ("string_array_count_past_eof", raw_kv("k", V.ARRAY, enc_u32(V.STRING) + enc_u64(100) + enc_u64(0) * 3),
     "k.count", "cannot fit"),
    ("string_array_elem_length_huge", raw_kv("k", V.ARRAY, enc_u32(V.STRING) + enc_u64(2) + enc_u64(1) + b"a"
                                             + enc_u64(2**40) + b"\0" * 8), "k[1].length", "exceeds"),
    ("string_array_elem_past_eof", raw_kv("k", V.ARRAY, enc_u32(V.STRING) + enc_u64(2) + enc_u64(1) + b"a"
                                          + enc_u64(100) + b"\0" * 8), "k[1]", "needs 100 bytes"),
    ("string_array_elem_truncated", raw_kv("k", V.ARRAY, enc_u32(V.STRING) + enc_u64(3) + enc_u64(1) + b"a"
                                           + enc_u64(0) + b"\0" * 7), "k[2].length", "needs 8 bytes"),
    ("string_length_minus_1", raw_kv("k", V.STRING, enc_u64(-1) + b"abc"), "k.length", "exceeds"),
    ("string_length_over_limit", raw_kv("k", V.STRING, enc_u64(MAX_STRING_BYTES + 1) + b"abc"), "k.length",
     "exceeds"),
    ("string_past_eof", raw_kv("k", V.STRING, enc_u64(50) + b"0123456789"), "k", "needs 50 bytes"),
    ("bool_2", raw_kv("k", V.BOOL, b"\x02"), "k", "bool value 2"),
    ("bool_array_elem_255", raw_kv("k", V.ARRAY, enc_u32(V.BOOL) + enc_u64(3) + b"\x01\x00\xff"), "k[2]",
     "bool value 255"),
    ("scalar_truncated", raw_kv("k", V.UINT64, b"\0\0\0"), "k", "needs 8 bytes"),
    ("kv_section_truncated", H(0, 2).kv(0, "a", u32(1)).bytes() + enc_u64(5) + b"ab", "kv[1].key",
     "needs 5 bytes"),
    # ---------------------------------------------------------------- general.alignment
    ("alignment_float", kv_file("general.alignment", Value(V.FLOAT32, 32.0)), "general.alignment",
     "must be an integer, found FLOAT32"),
    ("alignment_string", kv_file("general.alignment", string("32")), "general.alignment",
     "must be an integer"),
    ("alignment_0", kv_file("general.alignment", u32(0)), "general.alignment", "0 is not a power of two"),
    ("alignment_13", kv_file("general.alignment", u32(13)), "general.alignment", "13 is not a power of two"),
    ("alignment_2pow31", kv_file("general.alignment", u32(2**31)), "general.alignment", "not a power of two"),
    ("alignment_negative", kv_file("general.alignment", Value(V.INT32, -32)), "general.alignment",
     "-32 is not a power of two"),
    # ---------------------------------------------------------------- tensor infos
    ("name_empty", tensor_file(("", [8], F32, 0)), "tensor[0].name", "expected 1..63"),
    ("name_64_bytes", tensor_file(("n" * 64, [8], F32, 0)), "tensor[0].name", "64 bytes"),
    ("name_length_minus_1", H(1, 0).string("t", "tensor[0].name", length=-1).bytes() + b"\0" * 40,
     "tensor[0].name.length", "exceeds"),
    ("name_not_utf8", tensor_file((b"t\xc3", [8], F32, 0)), "tensor[0].name", "not valid UTF-8"),
    ("name_duplicate", tensor_file(("t", [8], F32, 0), ("t", [8], F32, 32)), "tensor[1].name",
     "duplicate tensor name 't'"),
    ("n_dims_0", tensor_file(("t", [], F32, 0)), "t.n_dims", "0 dims"),
    ("n_dims_5", tensor_file(("t", [8, 1, 1, 1, 1], F32, 0)), "t.n_dims", "5 dims"),
    ("n_dims_minus_1", tensor_file(("t", [8], F32, 0, -1)), "t.n_dims", "4294967295 dims"),
    ("ne_0", tensor_file(("t", [8, 0], F32, 0)), "t.ne[1]", "dimension is 0"),
    ("ne_minus_1", tensor_file(("t", [-1], F32, 0)), "t.ne[0]", "dimension -1 is negative"),
    ("ne_2pow63", tensor_file(("t", [8, 2**63], F32, 0)), "t.ne[1]", "is negative"),
    ("ne_overflow", tensor_file(("t", [BIG, BIG], F32, 0)), "t.ne[1]", "overflows"),
    ("ne_overflow_4d", tensor_file(("t", [2**16] * 4, F32, 0)), "t.ne[3]", "overflows"),
    ("ne_huge_past_eof", tensor_file(("t", [2**31, 2**30], F32, 0)), "t.offset", "extends past the file end"),
    ("ne0_not_block_multiple", tensor_file(("t", [33, 2], Q4_0, 0)), "t.ne[0]",
     "not a multiple of Q4_0's block"),
    ("ne0_not_superblock_multiple", tensor_file(("t", [128], Q6_K, 0)), "t.ne[0]", "Q6_K's block size 256"),
    ("type_4_removed", tensor_file(("t", [32], 4, 0)), "t.type", "unknown ggml type id 4"),
    # MXFP4 (39) is the last type ggml has
    ("type_40_past_the_table", tensor_file(("t", [32], 40, 0)), "t.type", "unknown ggml type id 40"),
    ("type_minus_1", tensor_file(("t", [32], -1, 0)), "t.type", "unknown ggml type id 4294967295"),
    ("offset_misaligned", tensor_file(("t", [8], F32, 1)), "t.offset", "offset 1 is not aligned to 32"),
    ("offset_minus_1", tensor_file(("t", [8], F32, -1)), "t.offset", "not aligned"),
    ("offset_aligned_huge", tensor_file(("t", [8], F32, 2**64 - 32)), "t.offset",
     "extends past the file end"),
    ("offset_past_eof", tensor_file(("t", [8], F32, 64)), "t.offset", r"data \[\d+, \d+\) extends past"),
    ("offset_inconsistent_alignment", tensor_file(("a", [8], F32, 0), ("t", [8], F32, 32),
                                                  kvs=[("general.alignment", u32(64))], data=b"\0" * 128),
     "t.offset", "not aligned to 64"),
    ("tensors_overlap", tensor_file(("a", [16], F32, 0), ("t", [8], F32, 32), data=b"\0" * 96), "t.offset",
     "overlaps tensor 'a'"),
    ("tensors_same_offset", tensor_file(("a", [8], F32, 0), ("t", [8], F32, 0)), "t.offset",
     "overlaps tensor 'a'"),
    ("tensor_info_truncated", H(1, 0).string("t", "tensor[0].name").raw(enc_u32(2) + enc_u64(8)).bytes()
     + b"\0" * 7, "t.ne[1]", "needs 8 bytes"),
    # ---------------------------------------------------------------- data section
    ("data_one_byte_short", tensor_file(("t", [8], F32, 0), data=b"\0" * 31), "t.offset", "extends past"),
    ("data_missing", tensor_file(("t", [8], F32, 0), data=b""), "t.offset", "extends past"),
    ("data_start_past_eof", tensor_file(("t", [8], F32, 0), data=b"", pad=False), "data",
     "starts past the end of the file"),
    ("data_second_tensor_cut", tensor_file(("a", [8], F32, 0), ("t", [32], Q4_0, 32), data=b"\0" * 40),
     "t.offset", "extends past"),
    # ---------------------------------------------------------------- the 2026 CVE classes
    # llama.cpp CVE-2026-27940: a tensor-size computation that wraps in 64 bits past the earlier
    # checks (ne0 * type size / block size; the element count; the row stride times ne1). Sizes
    # here are Python integers (they cannot wrap) and each is bounded before it is used.
    ("cve_27940_q4_0_nbytes_wraps", tensor_file(("t", [5124095576030431008], Q4_0, 0)), "t.ne[0]",
     r"element count overflows"),  # ne0 * 18 = 64 mod 2^64: "2 bytes"
    ("cve_27940_nelements_negative", tensor_file(("t", [2**63 - 1, 2], I8, 0)), "t.ne[0]",
     r"element count overflows"),  # INT64_MAX * 2: negative in int64
    ("cve_27940_nelements_wraps", tensor_file(("t", [2**62, 4], F32, 0)), "t.ne[1]", r"element count overflows"),
    ("cve_27940_stride_wraps", tensor_file(("t", [1152, 2**42 + 1], Q8_0, 0)), "t.offset",
     r"data \[96, 5383208929592616\) extends past"),  # (2^42) * stride = 2^64: 0 bytes in int64
    ("cve_27940_q8_row_bytes_wrap", tensor_file(("t", [2**61, 1], Q8_0, 0)), "t.offset", "extends past"),
    # Ollama CVE-2026-7482: a declared offset + size beyond the file's length, read past the buffer
    ("cve_7482_size_past_eof", tensor_file(("t", [1 << 18], F32, 0)), "t.offset",
     r"data \[64, 1048640\) extends past the file end \(128\)"),
    ("cve_7482_offset_plus_size_wraps", tensor_file(("a", [8], F32, 0), ("t", [16], F32, 2**64 - 32)), "t.offset",
     "extends past the file end"),
    ("cve_7482_second_offset_past_eof", tensor_file(("a", [8], F32, 0), ("t", [8], F32, 1 << 40)), "t.offset",
     "extends past the file end"),
]


@pytest.mark.parametrize("data,field,reason", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_file_is_rejected_at_its_field(tmp_path, data, field, reason):
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(GGUFError) as info:
        GGUFReader(path)
    e = info.value
    assert e.field == field, e
    assert re.search(reason, e.reason), e
    assert 0 <= e.offset <= len(data)


@pytest.mark.parametrize("kind", ["missing", "directory", "fifo"])
def test_not_a_gguf_file(tmp_path, kind):
    path = tmp_path / "x"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)  # must be refused at once, not block in open()
    with pytest.raises(GGUFError) as info:
        GGUFReader(path)
    assert info.value.field == "file"
    assert ("cannot open" if kind == "missing" else "not a regular file") in info.value.reason


# -------------------------------------------------------------------- valid edge cases are accepted
def _read(tmp_path, data: bytes) -> GGUFReader:
    path = tmp_path / "ok.gguf"
    path.write_bytes(data)
    return GGUFReader(path)

assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)  # (a collection error, not a test)


def test_accepts_the_empty_model(tmp_path):
    r = _read(tmp_path, H(0, 0).bytes())
    assert (r.version, r.kv, r.tensors, r.data_offset) == (3, {}, {}, 32)


def test_accepts_version_2_custom_alignment_and_any_tensor_order(tmp_path):
    hb = H(2, 1, version=2).kv(0, "general.alignment", u32(1))
    hb.tensor_info(0, "late", [8], F32, 33).tensor_info(1, "early", [2], F32, 1)
    body = hb.bytes()
    data = bytes(1) + np.float32([1, 2]).tobytes() + bytes(24) + np.arange(8, dtype=np.float32).tobytes()
    r = _read(tmp_path, body + data)
    assert r.version == 2 and r.alignment == 1 and r.data_offset == len(body)
    assert r.tensor_bytes("early").view(np.float32).tolist() == [1, 2]
    assert r.tensor_bytes("late").view(np.float32).tolist() == list(range(8))


def test_accepts_odd_but_valid_values(tmp_path):
    md = {"empty": string(""), "raw": Value(V.STRING, "\udcff"), "none": array(V.STRING, []),
          "e": Value(V.UINT8, 0), "name": string("x" * 1000)}
    r = _read(tmp_path, build_header(md, [])[0].bytes())
    assert r.metadata == {"empty": "", "raw": "\udcff", "none": [], "e": 0, "name": "x" * 1000}


# -------------------------------------------------------------------- truncation at every byte
def test_truncation_at_every_byte_names_the_cut_field(tmp_path):
    md = {"general.alignment": u32(64), "a.u8": Value(V.UINT8, 7), "a.str": string("hello"),
          "a.f64": Value(V.FLOAT64, 0.5), "a.bool": Value(V.BOOL, True),
          "a.toks": array(V.STRING, ["x", "yz"]),
          "a.ids": array(V.INT32, [1, 2, 3])}
    tensors = [TensorSpec("t0", (64, 2), 0, b""), TensorSpec("t1", (32, 3), Q4_0, b""),
               TensorSpec("t2", (256,), Q6_K, b"")]
    hb, layout = build_header(md, tensors, alignment=64, map_fields=True)
    head = hb.bytes()
    data = bytearray()
    ends = {}
    for (name, *_), (off, n) in zip(tensors, layout, strict=True):
        data += bytes(off - len(data)) + bytes(range(256)) * (n // 256) + bytes(n % 256)
        ends[name] = len(head) + off + n
    full = head + bytes(data)
    assert len(_read(tmp_path, full).tensors) == 3
    path = tmp_path / "cut.gguf"
    for cut in range(len(full)):
        path.write_bytes(full[:cut])
        with pytest.raises(GGUFError) as info:
            GGUFReader(path)
        got = info.value.field
        if cut >= len(head):  # in the data section: a tensor whose bytes are cut
            assert got in {f"{n}.offset" for n, end in ends.items() if end > cut}, (cut, info.value)
            continue
        f = next(f for f in hb.fields if f.start <= cut < f.end)
        allowed = {f.label, "n_kv", "n_tensors", f.count_label}  # a count that promises the cut bytes
        if cut == 0:
            allowed = {"magic"}
        assert got in allowed, (cut, f, info.value)


def test_reading_a_closed_file_is_a_typed_error(tmp_path):
    r = _read(tmp_path, tensor_file(("t", [8], F32, 0)))
    r.close()
    with pytest.raises(GGUFError, match="is closed"):
        r.tensor_bytes("t")


# -------------------------------------------------------------------- names shown on a terminal
ESC_KEY = "general.\x1b]0;owned\x07\x1b[2J\nname"  # retitle the terminal, clear it, break the line


def test_error_field_with_control_characters_is_escaped(tmp_path):
    """A hostile key reaches the error message (and the terminal) with its control characters
    escaped, not as raw bytes; the exception keeps the raw field for programs."""
    path = tmp_path / "bad.gguf"
    path.write_bytes(raw_kv(ESC_KEY, 99, b""))
    with pytest.raises(GGUFError) as info:
        GGUFReader(path)
    e = info.value
    assert e.field == f"{ESC_KEY}.type"
    assert str(e).isprintable(), str(e)
    assert r"general.\x1b]0;owned\x07\x1b[2J\nname.type" in str(e)


def test_inspect_text_escapes_control_characters(tmp_path):
    from minfer.inspect import inspect_file

    hb = H(1, 2).kv(0, "general.architecture", string("llama\x1b[31m")).kv(1, "general.name", string(ESC_KEY))
    hb.tensor_info(0, "tok\x1b[2Jen", [8], F32, 0).pad(32)
    path = tmp_path / "names.gguf"
    path.write_bytes(hb.bytes() + b"\0" * 64)
    out = inspect_file(path, tensors=True)
    assert all(line.isprintable() for line in out.splitlines()), out
    assert r"general.\x1b]0;owned\x07\x1b[2J\nname" in out and r"tok\x1b[2Jen" in out
