"""cpu weight preparation against the `gguf` package's codecs (an oracle we did not write).

Quantized types run torch's int4 packed matmul on their int4 digits (minfer/kernels/cpu/matmul.py), or
the C kernels where they run (Q4_x, Q5_x, Q8_0: minfer/kernels/cpu/vnni.py): the digits must encode
the exact dequantized values, the packing must equal torch's own, and the matmul must agree with
float64 x @ W^T to its documented precision (bfloat16 activations and scales: ~2^-8 relative; int8
activations of prompt rows ~5e-3, decode rows' two passes < 1e-3), each row independent of the others.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import quants

from minfer.backends.cpu.weights import (
    VNNI_DECODE,
    VNNI_KERNELS,
    EmbeddingTable,
    Matrix,
    dense_f32,
    kernel_name,
    prepared_bytes,
)
from minfer.gguf.reader import GGUFReader
from minfer.gguf.writer import write_gguf
from minfer.kernels.cpu.matmul import PLAIN, int4_codes, int_form, pack_int4, pack_plain
from minfer.quant.types import QUANT_TABLE, GGMLType

N, K = 48, 512  # 48 rows: not a whole int4 tile of 64 (the padding path)
QUANTIZED = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
             "MXFP4"]
TYPES = QUANTIZED + ["F16", "BF16", "F32"]
# relative error of x @ W^T against float64 (bfloat16 activations and scales; Q2_K/Q3_K's
# random blocks have large offsets relative to their values, which the bfloat16 zero rounds)
TOL = {"F32": 1e-6, "F16": 1e-6, "BF16": 8e-3, "Q2_K": 2.5e-2, "Q3_K": 2.5e-2}


def _blocks(rng: np.random.Generator, qt: GGMLType, n_blocks: int) -> np.ndarray:
    """Random block bytes with sane f16 scale fields (for the types gguf cannot quantize)."""
    info = QUANT_TABLE[qt]
    b = rng.integers(0, 256, (n_blocks, info.block_bytes), dtype=np.uint8)
    for off in info.f16_offsets:
        b[:, off:off + 2] = (rng.uniform(0.5, 1.5, (n_blocks, 1)) * 2e-3).astype(np.float16).view(np.uint8)
    for off in info.e8m0_offsets:
        b[:, off] = rng.integers(115, 120, n_blocks)  # 2^-13 .. 2^-9
    return b


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A GGUF holding one [N, K] matrix per type and the oracle values (gguf.quants.dequantize)."""
    rng = np.random.default_rng(1)
    tensors, oracle = [], {}
    for name in TYPES:
        t, qt = GGMLType[name], gguf.GGMLQuantizationType[name]
        x = (rng.standard_normal((N, K)) * 0.05 + rng.standard_normal((N, 1)) * 0.02).astype(np.float32)
        try:
            raw = quants.quantize(x, qt)
        except NotImplementedError:
            info = QUANT_TABLE[t]
            raw = _blocks(rng, t, N * K // info.block_elems).reshape(N, -1)
        oracle[name] = torch.from_numpy(quants.dequantize(raw, qt).astype(np.float32)).reshape(N, K)
        tensors.append((name, (K, N), t, raw))
    path = write_gguf(tmp_path_factory.mktemp("w") / "w.gguf", {"general.architecture": "test"}, tensors)
    return GGUFReader(path), oracle


@pytest.mark.parametrize("name", TYPES)
def test_dense_f32_is_bit_exact(weights, name):
    reader, oracle = weights
    got = dense_f32(reader, reader.tensors[name])
    assert got.shape == (N, K)
    assert torch.equal(got, oracle[name])


@pytest.mark.parametrize("name", QUANTIZED)
def test_int_form_is_the_exact_weight(weights, name):
    """weight = S * v + M0 per group, bit for bit the dequantized value."""
    reader, oracle = weights
    t = GGMLType[name]
    info = QUANT_TABLE[t]
    raw = torch.from_numpy(reader.tensor_bytes(name)).view(-1, info.block_bytes)
    v, s, m0, g = int_form(raw, t)
    groups = info.block_elems // g
    w = v.float().view(-1, groups, g) * s.view(-1, groups, 1) + m0.view(-1, groups, 1)
    assert torch.equal(w.view(N, K), oracle[name])


@pytest.mark.parametrize("name", [t.name for t in PLAIN])
def test_packing_equals_torchs(weights, name):
    """Our byte-level packers make the layout torch's own converter makes from int32 codes."""
    reader, _ = weights
    t = GGMLType[name]
    raw = torch.from_numpy(reader.tensor_bytes(name)).view(N, -1)
    raw = torch.cat([raw, raw[:16]])  # 64 rows: one whole tile
    codes = int4_codes(raw, t, K)
    want = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.codes.int(), 2)
    assert torch.equal(pack_int4(codes.codes), want)
    packed, scale, zero = pack_plain(raw, t, K)
    assert torch.equal(packed, want) and torch.equal(scale, codes.scale) and torch.equal(zero, codes.zero)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize("name", TYPES)
def test_matmul_matches_float64(weights, name):
    reader, oracle = weights
    bias = torch.randn(N)
    m = Matrix(reader, [reader.tensors[name]], bias)
    assert m.kernel() == kernel_name(GGMLType[name])
    tol = TOL.get(name, 8e-3)
    vnni = m.kernel() in VNNI_KERNELS
    # the C kernels: decode rows' two int8 passes of the activations ~2e-5; a prompt's one pass (the
    # types with a one-pass kernel) ~5e-3, llama.cpp's int8 activations (measured 3.6e-3..4.9e-3)
    one_pass = m.kernel() in VNNI_DECODE
    for rows, decode in ((16, True), (1, False), (5, False), (19, False)):
        x = torch.randn(rows, K)
        want = x.double() @ oracle[name].double().T + bias.double()
        bound = (1e-2 if one_pass and not decode else 1e-3) if vnni else tol
        assert _rel(m(x, decode=decode), want) < bound, (rows, decode)
    if one_pass:  # a prompt in two passes where the configuration asks: the decode rows' precision
        m2 = Matrix(reader, [reader.tensors[name]], bias, prompt_passes=2)
        x = torch.randn(5, K)
        assert _rel(m2(x), x.double() @ oracle[name].double().T + bias.double()) < 1e-3
        assert torch.equal(m2(x), m2(x, decode=True))


@pytest.mark.parametrize("name", TYPES)
def test_a_decode_row_does_not_depend_on_the_other_rows(weights, name):
    """Batch invariance: decode row i of a call with M rows equals the same row computed alone,
    bit for bit, for every M and wherever it sits in the batch."""
    reader, _ = weights
    m = Matrix(reader, [reader.tensors[name]], None)
    x = torch.randn(40, K)
    alone = torch.cat([m(torch.randn(1, K).copy_(x[i:i + 1]), decode=True) for i in range(40)])
    for rows in (2, 3, 7, 8, 9, 16, 33, 40):
        assert torch.equal(m(x[:rows], decode=True), alone[:rows]), rows
    assert torch.equal(m(x[11:29], decode=True), alone[11:29])


@pytest.mark.parametrize("names", [["Q4_1", "Q4_0", "Q4_K"], ["Q4_K", "Q6_K", "Q8_0"], ["Q6_K", "F32"],
                                   ["IQ4_NL", "IQ4_XS", "MXFP4", "Q4_0"]])  # (one table per VNNI run)
def test_fused_parts_stack_rows(weights, names):
    """Stacked weights (q/k/v, gate/up) of one or several kernel families: columns in order."""
    reader, oracle = weights
    m = Matrix(reader, [reader.tensors[n] for n in names], None)
    w = torch.cat([oracle[n] for n in names])
    assert torch.equal(m.dense, w)
    x = torch.randn(3, K)
    assert _rel(m(x, decode=True), x.double() @ w.double().T) < 8e-3


def test_prepared_bytes_are_what_the_matrix_holds(weights):
    reader, _ = weights
    for name in QUANTIZED:
        info = reader.tensors[name]
        m = Matrix(reader, [info], None)
        assert m.nbytes == prepared_bytes(info), name
        assert m.nbytes <= 1.25 * 64 * K + 64 * K // 16 * 4  # at most 1.25 bytes per weight (+ the tile padding)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_1", "Q6_K", "F32"])
def test_embedding_rows(weights, name):
    reader, oracle = weights
    table = EmbeddingTable(reader, reader.tensors[name])
    ids = torch.tensor([5, 0, 47, 5], dtype=torch.int32)
    assert torch.equal(table(ids), oracle[name][ids.long()])
