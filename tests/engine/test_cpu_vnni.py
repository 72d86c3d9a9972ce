"""The C kernels of the cpu backend (minfer/kernels/cpu/q4_vnni.c) against float64, on fresh
random inputs: the int4 x int8 matmul in one and two activation passes, rows independent of
each other, and the one-call decode attention against the SDPA reference op."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from minfer.backends.cpu import ops as cpu_ops
from minfer.kernels.cpu import vnni as cpu_vnni
from minfer.quant.reference import dequantize, quantize
from minfer.quant.types import GGMLType

needs_vnni = pytest.mark.skipif(not cpu_vnni.available(), reason="needs AVX512-VNNI and a C compiler")


@pytest.mark.parametrize("env", [{"MINFER_CPU_VNNI": "0"}, {"CC": "/bin/false", "MINFER_CACHE": "{tmp}"}])
def test_without_the_c_kernels_every_type_takes_torchs(tmp_path, env):
    """Turned off, or no compiler that works: the picker drops the C contracts, nothing fails."""
    code = ("from minfer.backends.cpu.weights import kernel_name\n"
            "from minfer.kernels.cpu import vnni as cpu_vnni\n"
            "from minfer.quant.types import GGMLType as T\n"
            "print(cpu_vnni.available(), kernel_name(T.Q4_K), kernel_name(T.Q8_0))")
    env = {**os.environ, **{k: v.format(tmp=tmp_path) for k, v in env.items()}}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "cpu_int4pack_mm", "cpu_int4pack_mm_pair32"]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm())


@needs_vnni
@pytest.mark.parametrize("qtype", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0])
def test_matmul_matches_float64_and_rows_are_independent(qtype):
    gen = torch.Generator().manual_seed(7)
    n, k = 40, 1024  # 40: not a multiple of the 32-column tile (padded, sliced off)
    raw = quantize(torch.randn(n, k, generator=gen), qtype)
    w = dequantize(raw, qtype, (n, k)).double()
    mm = cpu_vnni.Q4Vnni([(raw, qtype, n, k)])
    x = torch.randn(19, k, generator=gen)
    want = x.double() @ w.T
    one, two = mm(x, 1), mm(x, 2)
    assert one.shape == (19, n) and one.dtype == torch.float32
    assert 2e-3 < _rel(one, want) < 1e-2  # int8 activations: ~5e-3, llama.cpp's Q8_0 scheme
    assert _rel(two, want) < 1e-4  # the second pass quantizes the first's rounding error: ~2e-5
    assert _rel(mm(x.bfloat16(), 2), x.bfloat16().double() @ w.T) < 1e-4
    for passes, y in ((1, one), (2, two)):
        alone = torch.cat([mm(x[i:i + 1].clone(), passes) for i in range(19)])
        assert torch.equal(alone, y), passes  # bit for bit: a row's result ignores the other rows
        assert torch.equal(mm(x[3:11], passes), y[3:11])


@needs_vnni
def test_stacked_parts_of_different_4bit_types():
    gen = torch.Generator().manual_seed(3)
    k = 256
    parts, dense = [], []
    for qtype, n in ((GGMLType.Q4_1, 24), (GGMLType.Q4_0, 40)):
        raw = quantize(torch.randn(n, k, generator=gen), qtype)
        parts.append((raw, qtype, n, k))
        dense.append(dequantize(raw, qtype, (n, k)))
    mm = cpu_vnni.Q4Vnni(parts)
    x = torch.randn(3, k, generator=gen)
    assert _rel(mm(x, 2), x.double() @ torch.cat(dense).double().T) < 1e-4


@needs_vnni
@pytest.mark.parametrize("lens", [[1], [33], [5, 100, 600, 17]])
def test_decode_attention_matches_sdpa_and_ignores_the_other_rows(lens):
    gen = torch.Generator().manual_seed(len(lens))
    n_slots, n_kv, n_ctx, hd, n_head = 5, 2, 640, 32, 6
    kc, vc = torch.randn(n_slots, n_kv, n_ctx, hd, generator=gen), torch.randn(n_slots, n_kv, n_ctx, hd, generator=gen)
    b = len(lens)
    q = torch.randn(b, n_head * hd + 16, generator=gen)[:, :n_head * hd]  # a strided view, as the graph's q
    slots = torch.tensor([4, 0, 2, 3][:b], dtype=torch.int32)
    ln = torch.tensor(lens, dtype=torch.int32)
    got = cpu_vnni.attention_decode(q, kc, vc, slots, ln, n_head, hd ** -0.5)
    for i in range(b):
        s, L = int(slots[i]), lens[i]
        want = cpu_ops.attention_one(q[i].reshape(n_head, hd), kc[s, :, :L], vc[s, :, :L], hd ** -0.5)
        assert torch.allclose(got[i:i + 1], want, atol=2e-6, rtol=1e-5), i
        alone = cpu_vnni.attention_decode(q[i:i + 1], kc, vc, slots[i:i + 1], ln[i:i + 1], n_head, hd ** -0.5)
        assert torch.equal(alone, got[i:i + 1])
