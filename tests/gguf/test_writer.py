"""The GGUF writer, checked against files and a reader nobody here wrote.

Oracles: the SmolLM2 file (written by llama.cpp's converter) must come back byte for byte, and
the official `gguf` package must read what we write with the values, types and bytes we meant.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from minfer.errors import GGUFError, QuantError, UnsupportedError
from minfer.gguf.reader import GGUFReader, ValueType
from minfer.gguf.writer import (
    HeaderBuilder,
    Value,
    array,
    enc_u32,
    enc_u64,
    f32,
    reencode_header,
    write_gguf,
)
from minfer.quant.types import GGMLType

ALL_TYPES = {
    "u8": Value(ValueType.UINT8, 255),
    "i8": Value(ValueType.INT8, -128),
    "u16": Value(ValueType.UINT16, 65535),
    "i16": Value(ValueType.INT16, -32768),
    "u32": Value(ValueType.UINT32, 2**32 - 1),
    "i32": Value(ValueType.INT32, -(2**31)),
    "f32": f32(0.1),
    "bool": Value(ValueType.BOOL, True),
    "str": Value(ValueType.STRING, "héllo ✓"),
    "u64": Value(ValueType.UINT64, 2**64 - 1),
    "i64": Value(ValueType.INT64, -(2**63)),
    "f64": Value(ValueType.FLOAT64, 1e300),
    "arr_str": array(ValueType.STRING, ["a", "", "Ġb"]),
    "arr_i32": array(ValueType.INT32, [-1, 0, 7]),
    "arr_f32": array(ValueType.FLOAT32, [0.5, -2.0]),
    "arr_bool": array(ValueType.BOOL, [True, False]),
    "arr_u8_empty": array(ValueType.UINT8, []),
}


def _tensors(rng):
    """One tensor of several block types, as (name, ne shape, type, raw bytes)."""
    f32_data = rng.standard_normal((3, 64)).astype(np.float32)
    q8 = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    q4k = rng.integers(0, 256, size=(1, 144), dtype=np.uint8)
    f16_data = rng.standard_normal(5).astype(np.float16)
    return [("a.f32", (64, 3), GGMLType.F32, f32_data), ("b.q8", (64, 2), GGMLType.Q8_0, q8),
            ("c.q4k", (256,), GGMLType.Q4_K, q4k), ("d.f16", (5,), GGMLType.F16, f16_data.tobytes())]


def test_smollm2_header_reencodes_byte_for_byte(smollm2_path):
    r = GGUFReader(smollm2_path)
    ours = reencode_header(r, map_fields=False).bytes()
    with open(smollm2_path, "rb") as f:
        assert ours == f.read(r.data_offset)


@pytest.mark.parametrize("alignment", [32, 1, 64, 4096])
def test_gguf_package_reads_what_we_write(tmp_path, alignment):
    rng = np.random.default_rng(1)
    tensors = _tensors(rng)
    path = write_gguf(tmp_path / "x.gguf", ALL_TYPES, tensors, alignment=alignment)
    g = gguf.GGUFReader(path)
    assert g.alignment == alignment
    for key, v in ALL_TYPES.items():
        field = g.fields[key]
        assert int(field.types[0]) == v.type
        if v.type == ValueType.ARRAY and not v.value:
            assert field.contents() == []  # the gguf package records no element type for []
        elif v.type == ValueType.ARRAY:
            assert int(field.types[1]) == v.elem_type
            assert list(field.contents()) == pytest.approx(v.value)
        elif v.type == ValueType.FLOAT32:
            assert field.contents() == np.float32(v.value)
        else:
            assert field.contents() == v.value
    if alignment != 32:
        assert g.fields["general.alignment"].contents() == alignment
    for (name, shape, qtype, data), t in zip(tensors, g.tensors, strict=True):
        assert (t.name, list(t.shape), int(t.tensor_type)) == (name, list(shape), int(qtype))
        assert t.data_offset % alignment == 0
        raw = data if isinstance(data, bytes) else np.asarray(data).tobytes()
        assert bytes(g.data[t.data_offset:t.data_offset + t.n_bytes]) == raw
    # our reader agrees on every value and view
    r = GGUFReader(path)
    assert r.alignment == alignment
    assert {k: r.kv[k].type for k in ALL_TYPES} == {k: v.type for k, v in ALL_TYPES.items()}
    assert r.metadata["str"] == "héllo ✓" and r.metadata["u64"] == 2**64 - 1
    assert r.metadata["arr_str"] == ["a", "", "Ġb"]
    for t in g.tensors:
        assert r.tensor_bytes(t.name).tobytes() == bytes(g.data[t.data_offset:t.data_offset + t.n_bytes])


def test_plain_values_get_llamacpp_types(tmp_path):
    md = {"n": 30, "neg": -3, "big": 2**40, "eps": 1e-5, "name": "x", "flag": False,
          "toks": ["a", "b"], "types": [1, 3], "scores": [0.5, 1], "wide": [2**40, 1]}
    g = gguf.GGUFReader(write_gguf(tmp_path / "x.gguf", md, []))
    got = {k: [int(t) for t in g.fields[k].types] for k in md}
    V = ValueType
    assert got == {"n": [V.UINT32], "neg": [V.INT32], "big": [V.UINT64], "eps": [V.FLOAT32],
                   "name": [V.STRING], "flag": [V.BOOL], "toks": [V.ARRAY, V.STRING],
                   "types": [V.ARRAY, V.INT32],
                   "scores": [V.ARRAY, V.FLOAT32], "wide": [V.ARRAY, V.UINT64]}


def test_triple_form_metadata(tmp_path):
    md = [("a", ValueType.UINT16, 7), ("b", ValueType.ARRAY, (ValueType.INT64, [1, -2])), ("c", 8, "s")]
    r = GGUFReader(write_gguf(tmp_path / "x.gguf", md, []))
    assert (r.kv["a"].type, r.kv["a"].value) == (ValueType.UINT16, 7)
    assert (r.kv["b"].elem_type, r.kv["b"].value) == (ValueType.INT64, [1, -2])
    assert r.get_str("c") == "s"


def test_streams_chunks_lazily(tmp_path):
    calls = []
    rows = [np.full(64, i, np.float32) for i in range(4)]

    def data():
        calls.append("started")
        yield from rows

    path = write_gguf(tmp_path / "x.gguf", {}, [("t", (64, 4), GGMLType.F32, data)])
    assert calls == ["started"]
    assert np.array_equal(GGUFReader(path).tensor_bytes("t").view(np.float32).reshape(4, 64), np.stack(rows))


@pytest.mark.parametrize("nbytes", [31, 33, 0])
def test_wrong_byte_count_is_typed_and_leaves_no_file(tmp_path, nbytes):
    out = tmp_path / "x.gguf"
    with pytest.raises(QuantError, match="needs 32"):
        write_gguf(out, {}, [("t", (8,), GGMLType.F32, b"\0" * nbytes)])
    assert list(tmp_path.iterdir()) == []


def test_bad_inputs_are_typed(tmp_path):
    out = tmp_path / "x.gguf"
    with pytest.raises(QuantError, match="block size 32"):
        write_gguf(out, {}, [("t", (33,), GGMLType.Q4_0, b"")])
    with pytest.raises(UnsupportedError, match="unknown ggml type id 4"):
        write_gguf(out, {}, [("t", (32,), 4, b"")])
    with pytest.raises(GGUFError, match="not a valid UINT8"):
        write_gguf(out, {"k": Value(ValueType.UINT8, 256)}, [])
    with pytest.raises(GGUFError, match="cannot infer"):
        write_gguf(out, {"k": []}, [])
    with pytest.raises(GGUFError, match="power of two"):
        write_gguf(out, {}, [], alignment=48)
    with pytest.raises(GGUFError, match="cannot write"):
        write_gguf(tmp_path / "no" / "such" / "dir.gguf", {}, [])
    assert list(tmp_path.iterdir()) == []


def test_raw_encoders_wrap_like_c():
    assert enc_u32(-1) == b"\xff" * 4 and enc_u64(-1) == b"\xff" * 8
    assert enc_u64(2**63) == b"\0" * 7 + b"\x80"


def test_field_map_names_match_byte_ranges():
    hb = HeaderBuilder().header(1, 1).kv(0, "k", array(ValueType.STRING, ["ab"]))
    hb.tensor_info(0, "t", [32], 0, 0)
    b = hb.bytes()
    spans = {f.label: b[f.start:f.end] for f in hb.fields}
    assert spans["magic"] == b"GGUF" and spans["n_kv"] == enc_u64(1)
    assert spans["kv[0].key.length"] == enc_u64(1) and spans["kv[0].key"] == b"k"
    assert spans["k.type"] == enc_u32(9) and spans["k.elem_type"] == enc_u32(8)
    assert spans["k.count"] == enc_u64(1)
    assert spans["k[0].length"] == enc_u64(2) and spans["k[0]"] == b"ab"
    assert spans["t.ne[0]"] == enc_u64(32) and spans["t.offset"] == enc_u64(0)
    assert hb.fields[-1].end == len(b)
