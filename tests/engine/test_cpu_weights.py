"""cpu weight preparation against the `gguf` package's codecs (an oracle we did not write).

The float32 weight copies must equal the exact dequantized values; the int4 and f16 decode paths must
agree with float64 x @ W^T to their documented precision (bfloat16 activations and scales for
int4: ~2^-8 relative; f16 weights: ~2^-11).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import quants

from minfer.backends.cpu_weights import EmbeddingTable, Matrix, dense_f32, native_bf16
from minfer.gguf.reader import GGUFReader
from minfer.gguf.writer import write_gguf
from minfer.quant.types import GGMLType

N, K = 48, 96
TYPES = {"Q4_0": GGMLType.Q4_0, "Q4_1": GGMLType.Q4_1, "Q8_0": GGMLType.Q8_0, "F16": GGMLType.F16,
         "F32": GGMLType.F32}


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A GGUF holding one [N, K] matrix per type (bytes from gguf.quants) and the oracle values."""
    rng = np.random.default_rng(1)
    tensors, oracle = [], {}
    for name, t in TYPES.items():
        x = (rng.standard_normal((N, K)) * 0.05 + rng.standard_normal((N, 1)) * 0.02).astype(np.float32)
        qt = gguf.GGMLQuantizationType[name]
        raw = quants.quantize(x, qt)
        oracle[name] = torch.from_numpy(quants.dequantize(raw, qt).astype(np.float32))
        tensors.append((name, (K, N), t, raw))
    path = write_gguf(tmp_path_factory.mktemp("w") / "w.gguf", {"general.architecture": "test"}, tensors)
    return GGUFReader(path), oracle


@pytest.mark.parametrize("name", list(TYPES))
def test_dense_f32_is_bit_exact(weights, name):
    reader, oracle = weights
    got = dense_f32(reader, reader.tensors[name])
    assert got.shape == (N, K)
    assert torch.equal(got, oracle[name])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm())


Q8_0_DECODE = ("torch.linear_bf16", 6e-3) if native_bf16() else ("torch.linear_f16", 1e-3)


@pytest.mark.parametrize("name,kernel,tol", [("Q4_0", "torch.int4pack_mm_bf16", 8e-3),
                                             ("Q4_1", "torch.int4pack_mm_bf16", 8e-3),
                                             ("Q8_0", *Q8_0_DECODE),
                                             ("F16", "torch.linear_f32", 1e-6)])
def test_decode_path_matches_float64(weights, name, kernel, tol):
    reader, oracle = weights
    bias = torch.randn(N)
    m = Matrix(reader, [reader.tensors[name]], bias, keep_dense=True)
    x = torch.randn(16, K)
    want = x.double() @ oracle[name].double().T + bias.double()
    assert m.kernel(decode=True) == kernel
    assert _rel(m(x, decode=True), want) < tol
    # prefill rows, any number of them, take the exact float32 path
    for rows in (1, 5, 19):
        xl = torch.randn(rows, K)
        assert m.kernel(decode=False) == "torch.linear_f32"
        assert _rel(m(xl), xl.double() @ oracle[name].double().T + bias.double()) < 1e-6


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0", "F16", "F32"])
def test_a_decode_row_does_not_depend_on_the_other_rows(weights, name):
    """Batch invariance: decode row i of a call with M rows equals the same row computed alone,
    bit for bit, for every M and wherever it sits in the batch."""
    reader, _ = weights
    m = Matrix(reader, [reader.tensors[name]], None, keep_dense=True)
    x = torch.randn(40, K)
    alone = torch.cat([m(torch.randn(1, K).copy_(x[i:i + 1]), decode=True) for i in range(40)])
    for rows in (2, 3, 7, 8, 9, 16, 33, 40):
        assert torch.equal(m(x[:rows], decode=True), alone[:rows]), rows
    assert torch.equal(m(x[11:29], decode=True), alone[11:29])


def test_fused_parts_stack_rows(weights):
    reader, oracle = weights
    infos = [reader.tensors["Q4_1"], reader.tensors["Q4_0"]]  # mixed int4 types share one packed matrix
    m = Matrix(reader, infos, None, keep_dense=False)  # decoded per call: the same values
    w = torch.cat([oracle["Q4_1"], oracle["Q4_0"]])
    assert torch.equal(m.dense, w)
    x = torch.randn(1, K)
    assert m.kernel(decode=True) == "torch.int4pack_mm_bf16"
    assert _rel(m(x, decode=True), x.double() @ w.double().T) < 8e-3


@pytest.mark.parametrize("name", ["Q8_0", "Q4_1", "F32"])
def test_embedding_rows(weights, name):
    reader, oracle = weights
    table = EmbeddingTable(reader, reader.tensors[name])
    ids = torch.tensor([5, 0, 47, 5], dtype=torch.int32)
    assert torch.equal(table(ids), oracle[name][ids.long()])
