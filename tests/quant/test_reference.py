"""The torch reference codecs against the `gguf` package's numpy codecs (bit for bit).

Oracles: gguf.quants.dequantize / gguf.quants.quantize (ggml's reference rules, written by
others), float64 error bounds for round trips, and hand-worked values.
"""

from __future__ import annotations

import math
import warnings

import gguf.quants
import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType

from minfer.errors import QuantError, UnsupportedError
from minfer.quant import QUANT_TABLE, GGMLType, quant_info
from minfer.quant.reference import dequantize, quantize

N_BLOCKS = 640

FLOAT_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
BLOCK_TYPES = tuple(t for t, q in QUANT_TABLE.items() if q.f16_offsets or q.e8m0_offsets)
ALL_TYPES = FLOAT_TYPES + BLOCK_TYPES
assert len(ALL_TYPES) == 16

# f16 bit patterns of scales worth hitting on purpose
F16_SPECIAL = np.array(
    [0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0000, 0x8000, 0x3C00, 0xBC00, 0x0400], dtype=np.uint16
)


def _finite_f16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """n f16 bit patterns: one third specials (max, subnormal, zero, +-1), the rest random finite."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    bits = np.where((bits & 0x7C00) == 0x7C00, bits & 0xFBFF, bits)  # inf/NaN exponent -> 30
    special = rng.random(n) < 1 / 3
    return np.where(special, rng.choice(F16_SPECIAL, size=n), bits).astype(np.uint16)


def random_blocks(qtype: GGMLType, seed: int) -> np.ndarray:
    """[N_BLOCKS, block_bytes] uint8: random payload bits, finite scales, some all-0 / all-1 blocks."""
    info = quant_info(qtype)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(N_BLOCKS, info.block_bytes), dtype=np.uint8)
    raw[:8] = 0  # all-zero blocks
    raw[8:16] = 0xFF  # every quant at its maximum (scales are set below)
    for off in QUANT_TABLE[qtype].f16_offsets:
        raw[:, off : off + 2] = _finite_f16_bits(rng, N_BLOCKS).view(np.uint8).reshape(-1, 2)
        raw[:8, off : off + 2] = 0
        raw[8:12, off : off + 2] = np.array([0x7BFF], dtype=np.uint16).view(np.uint8)  # +65504
        raw[12:16, off : off + 2] = np.array([0xFBFF], dtype=np.uint16).view(np.uint8)  # -65504
    for off in QUANT_TABLE[qtype].e8m0_offsets:  # every finite exponent: 2^(e - 128) * 12 < 2^128 for e <= 252
        raw[:, off] = rng.integers(0, 253, size=N_BLOCKS, dtype=np.uint8)
        raw[:8, off] = 0  # the subnormal 2^-128
        raw[8:16, off] = 252  # the largest: 1.5 * 2^127
    return raw


def gguf_dequant(raw: np.ndarray, qtype: GGMLType) -> torch.Tensor:
    with np.errstate(all="ignore"):
        ref = gguf.quants.dequantize(raw, GGMLQuantizationType(int(qtype)))
    return torch.from_numpy(np.ascontiguousarray(ref, dtype=np.float32)).reshape(-1)


def assert_bit_equal(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Same float32 values; NaNs (only possible from NaN inputs) in the same places."""
    assert out.dtype == torch.float32 and out.shape == ref.shape
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(out), nan)
    assert torch.equal(out[~nan], ref[~nan])


# ------------------------------------------------------------------------------------ dequantize


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_dequantize_bit_exact_vs_gguf(qtype):
    raw = random_blocks(qtype, seed=int(qtype))
    out = dequantize(raw, qtype)
    assert_bit_equal(out, gguf_dequant(raw, qtype))
    if qtype in BLOCK_TYPES:  # the blocks with the largest scales reach large finite values
        assert torch.isfinite(out).all() and out.abs().max() > 1e5


def test_extreme_and_hand_worked_blocks():
    # Q4_0 block: d = -65504 (f16 0xFBFF), nibbles 0 and 15 -> x = d*(0-8) and d*(15-8).
    block = np.zeros(18, np.uint8)
    block[0:2] = np.array([0xFBFF], np.uint16).view(np.uint8)
    block[2] = 0xF0  # elem 0: nibble 0, elem 16: nibble 15
    out = dequantize(block.tobytes(), GGMLType.Q4_0)
    assert out[0].item() == 524032.0 and out[16].item() == -458528.0 and out[1].item() == 524032.0
    # Q8_0 with the smallest subnormal scale 2**-24: x = q * 2**-24 exactly.
    block = np.zeros(34, np.uint8)
    block[0:2] = np.array([0x0001], np.uint16).view(np.uint8)
    block[2:] = np.arange(-16, 16, dtype=np.int8).view(np.uint8)
    out = dequantize(block, GGMLType.Q8_0)
    assert torch.equal(out, torch.arange(-16, 16, dtype=torch.float64).mul(2.0**-24).float())


def test_lookup_types_hand_worked():
    # IQ4_NL, d = 0.5: x = kvalues_iq4nl[nib] / 2; byte j low nibble = elem j, high = elem j + 16
    block = np.zeros(18, np.uint8)
    block[0:2] = np.array([0x3800], np.uint16).view(np.uint8)  # f16 0.5
    block[2:18] = np.arange(16, dtype=np.uint8) | (np.arange(15, -1, -1, dtype=np.uint8) << 4)
    out = dequantize(block, GGMLType.IQ4_NL)
    kv = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
    assert out.tolist() == [v / 2 for v in kv] + [v / 2 for v in kv[::-1]]
    # MXFP4: e = 128 -> scale 1 (the doubled e2m1 values as they are); e = 0 -> 2^-128 (subnormal)
    block = np.zeros(17, np.uint8)
    block[0] = 128
    block[1:17] = np.arange(16, dtype=np.uint8) | (7 << 4)
    out = dequantize(block, GGMLType.MXFP4)
    assert out[:16].tolist() == [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12] and out[16:].eq(12).all()
    block[0] = 0
    assert dequantize(block, GGMLType.MXFP4)[7].item() == 12 * 2.0**-128
    # IQ4_XS: sub-block i's scale = (low nibble i % 2 of byte 4 + i / 2) | (bits 2i, 2i+1 of the u16 at 2) << 4,
    # minus 32; d = 1, every code 8 (value 1): x = ls_i - 32
    block = np.zeros(136, np.uint8)
    block[0:2] = np.array([0x3C00], np.uint16).view(np.uint8)
    ls = np.array([0, 63, 32, 33, 31, 17, 48, 5])
    block[4:8] = (ls[0::2] & 15) | ((ls[1::2] & 15) << 4)
    block[2:4] = np.array([sum(int(v >> 4) << (2 * i) for i, v in enumerate(ls))], np.uint16).view(np.uint8)
    block[8:] = 0x88
    out = dequantize(block, GGMLType.IQ4_XS).reshape(8, 32)
    assert torch.equal(out, torch.tensor(ls - 32, dtype=torch.float32)[:, None].expand(8, 32))


def test_float_types_keep_nan_inf_and_signed_zero():
    vals = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 65504.0, 6e-8, 1.5], dtype=np.float32)
    for qtype, raw in [
        (GGMLType.F32, vals.view(np.uint8)),
        (GGMLType.F16, vals.astype(np.float16).view(np.uint8)),
        (GGMLType.BF16, (vals.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)),
    ]:
        out = dequantize(raw, qtype)
        assert_bit_equal(out, gguf_dequant(raw, qtype))
        assert torch.isnan(out[0]) and out[1] == np.inf and out[2] == -np.inf
        assert torch.signbit(out[3]) and not torch.signbit(out[4])


def test_input_kinds_and_shape():
    raw = random_blocks(GGMLType.Q4_K, seed=7)[:8]  # 8 blocks = 2048 elements
    ref = gguf_dequant(raw, GGMLType.Q4_K)
    as_bytes = raw.tobytes()
    for kind in (raw, raw.reshape(-1), torch.from_numpy(raw), as_bytes, bytearray(as_bytes), memoryview(as_bytes)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # read-only buffers must not warn
            out = dequantize(kind, GGMLType.Q4_K, shape=(4, 512))
        assert out.shape == (4, 512)
        assert_bit_equal(out.reshape(-1), ref)
    assert dequantize(raw, int(GGMLType.Q4_K)).shape == (2048,)
    assert dequantize(b"", GGMLType.Q6_K, shape=(0, 256)).shape == (0, 256)


def test_f32_output_does_not_alias_input():
    raw = np.arange(8, dtype=np.float32).view(np.uint8).copy()
    out = dequantize(raw, GGMLType.F32)
    out.fill_(-1.0)
    assert raw.view(np.float32).tolist() == list(range(8))


def test_real_model_tensors(smollm2_path):
    """Q8_0 token-embedding rows, a Q4_1 matrix and an F32 norm of SmolLM2, against gguf.quants."""
    from minfer.gguf.reader import GGUFReader

    cases = [("token_embd.weight", GGMLType.Q8_0, 64), ("blk.0.ffn_down.weight", GGMLType.Q4_1, None),
             ("blk.0.attn_norm.weight", GGMLType.F32, None)]
    with GGUFReader(smollm2_path) as reader:
        for name, qtype, max_rows in cases:
            info = reader.tensors[name]
            assert info.ggml_type == qtype
            cols = info.torch_shape[-1]
            rows = max_rows or math.prod(info.torch_shape[:-1])
            raw = reader.tensor_bytes(name)[: rows * quant_info(qtype).nbytes(cols)]
            out = dequantize(raw, qtype, shape=(rows, cols))
            assert_bit_equal(out.reshape(-1), gguf_dequant(raw, qtype))
            assert torch.isfinite(out).all() and out.abs().max() > 0


# ------------------------------------------------------------------------------------ quantize

QUANTIZED = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0, GGMLType.MXFP4)


def quant_inputs(seed: int) -> np.ndarray:
    """[rows, 256] float32: normal data at many scales, zero blocks, ties and rounding edges."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((96, 256)).astype(np.float32)
    x *= np.float32(10.0) ** rng.integers(-6, 5, size=(96, 1)).astype(np.float32)
    x[0] = 0.0  # all-zero row
    x[1, :32] = 0.0
    x[1, 32:64] = 5.0  # constant block
    x[2, :32] = np.linspace(-1, 1, 32)  # +max and -max tie: the first one wins
    x[2, 32:64] = -np.linspace(-1, 1, 32)
    x[3, :32] = [127.0] + [k + 0.5 for k in range(-16, 15)]  # Q8_0: d = 1, exact halves
    x[4, :32] = rng.integers(-8, 8, size=32)  # Q4_0: exact integer grid
    x[5, :32] = np.float32(1e-30) * rng.standard_normal(32)  # tiny: f16 scale underflows
    x[6, :32] = 60000.0 * rng.standard_normal(32)  # large
    x[7, :32] = np.float32(2.0) ** np.arange(-16, 16)  # MXFP4: max|x| a power of two, values on the grid
    x[7, 32:64] = np.nextafter(np.float32(4.0), np.float32(0))  # just below a power of two: floor(log2) = 1
    x[7, 64:96] = rng.choice([-6.0, -3.0, -1.0, 0.25, 0.75, 2.5, 5.0], size=32)  # ties between e2m1 levels
    return x


@pytest.mark.parametrize("qtype", QUANTIZED, ids=lambda t: t.name)
def test_quantize_bit_exact_vs_gguf(qtype):
    x = quant_inputs(seed=int(qtype))
    with np.errstate(all="ignore"):  # row 6 overflows the f16 minimum of Q4_1 to -inf, in both
        ref = gguf.quants.quantize(x, GGMLQuantizationType(int(qtype)))
    out = quantize(torch.from_numpy(x), qtype)
    assert out.dtype == torch.uint8 and tuple(out.shape) == ref.shape
    assert np.array_equal(out.numpy(), ref)
    # leading dims are kept; numpy input is accepted
    out3 = quantize(x.reshape(8, 12, 256), qtype)
    assert tuple(out3.shape) == (8, 12, ref.shape[-1]) and torch.equal(out3.reshape(out.shape), out)


def test_quantize_float_types_vs_gguf():
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 1 << 32, size=(16, 64), dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x[0, :6] = [np.inf, -np.inf, -0.0, 65520.0, 1e-8, np.nan]
    for qtype in FLOAT_TYPES:
        y = x
        if qtype == GGMLType.F16:
            # numpy keeps signalling NaNs signalling; torch (like the F16C instruction ggml uses) quiets them
            y = np.where(np.isnan(x), np.float32(np.nan), x)
        with np.errstate(all="ignore"):
            ref = np.ascontiguousarray(gguf.quants.quantize(y, GGMLQuantizationType(int(qtype)))).view(np.uint8)
        out = quantize(torch.from_numpy(y), qtype)
        assert np.array_equal(out.numpy(), ref), qtype.name
        assert_bit_equal(dequantize(out, qtype), gguf_dequant(ref, qtype))


def _roundtrip_bound(x: np.ndarray, qtype: GGMLType) -> np.ndarray:
    """Per-block worst-case |x - dequant(quant(x))| from the format, in float64.

    Half a quant step (a full step for the clipped Q4_0 code 16 -> 15), plus the f16 rounding of
    the stored scale (relative 2**-11) times the largest code, plus that of the Q4_1 minimum.
    """
    b = x.astype(np.float64).reshape(-1, 32)
    amax = np.abs(b).max(axis=1)
    eps = 2.0**-11
    if qtype == GGMLType.MXFP4:
        # the scale 2^(floor(log2 amax) - 2) is exact; levels 0, 0.5, 1, 1.5, 2, 3, 4, 6 of it (max gap 2), and
        # amax / scale in [4, 8) may clip at 6: at most 2 scale units away
        return 2.0 ** (np.floor(np.log2(np.maximum(amax, 1e-38))) - 1) * (1 + 1e-6)
    if qtype == GGMLType.Q8_0:
        step = amax / 127
        bound = step / 2 + 127 * step * eps
    elif qtype == GGMLType.Q4_0:
        step = amax / 8
        bound = step + 8 * step * eps
    else:
        lo = b.min(axis=1)
        step = (b.max(axis=1) - lo) / 15
        bound = step / 2 + 15 * step * eps + np.abs(lo) * eps
    return bound * (1 + 1e-5) + 1e-7 * np.maximum(amax, 1e-30)  # f32 arithmetic slack


@pytest.mark.parametrize("qtype", QUANTIZED, ids=lambda t: t.name)
def test_quantize_roundtrip_error_bound(qtype):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((64, 512)) * rng.uniform(1e-3, 1e3, size=(64, 1))).astype(np.float32)
    back = dequantize(quantize(torch.from_numpy(x), qtype), qtype, shape=x.shape).numpy()
    err = np.abs(back.astype(np.float64) - x).reshape(-1, 32).max(axis=1)
    assert (err <= _roundtrip_bound(x, qtype)).all()
    # and the bound is not vacuous: the error is a visible fraction of it
    assert err.max() > 0.25 * _roundtrip_bound(x, qtype).min()


def test_q8_0_rounds_half_away_from_zero():
    x = np.zeros(32, np.float32)
    x[:5] = [127.0, 2.5, -2.5, 0.5, -1.5]
    q = quantize(torch.from_numpy(x), GGMLType.Q8_0).numpy()
    assert q[:2].view(np.float16)[0] == 1.0
    assert q[2:7].view(np.int8).tolist() == [127, 3, -3, 1, -2]


# ------------------------------------------------------------------------------------ errors


def test_typed_errors():
    good = bytes(18 * 4)
    with pytest.raises(UnsupportedError):
        dequantize(good, 99)
    with pytest.raises(UnsupportedError):
        dequantize(good, 4)  # Q4_2: removed from ggml, not in the table
    with pytest.raises(QuantError, match="whole number"):
        dequantize(good[:-1], GGMLType.Q4_0)
    with pytest.raises(QuantError, match="shape"):
        dequantize(good, GGMLType.Q4_0, shape=(3, 32))
    with pytest.raises(QuantError, match="shape"):
        dequantize(good, GGMLType.Q4_0, shape=(-4, -32))
    with pytest.raises(QuantError, match="block size"):
        dequantize(good, GGMLType.Q4_0, shape=(8, 16))
    with pytest.raises(QuantError, match="uint8"):
        dequantize(torch.zeros(36, dtype=torch.int8), GGMLType.Q4_0)
    with pytest.raises(QuantError, match="uint8"):
        dequantize(np.zeros(18, dtype=np.float32), GGMLType.Q4_0)
    with pytest.raises(QuantError):
        dequantize([0] * 18, GGMLType.Q4_0)
    with pytest.raises(UnsupportedError, match="Q4_K"):
        quantize(torch.zeros(256), GGMLType.Q4_K)
    with pytest.raises(UnsupportedError, match="IQ4_XS"):  # gguf has no encoder to match: none here
        quantize(torch.zeros(256), GGMLType.IQ4_XS)
    with pytest.raises(QuantError, match="block size"):
        quantize(torch.zeros(2, 48), GGMLType.Q8_0)
    with pytest.raises(QuantError, match="float"):
        quantize(torch.zeros(32, dtype=torch.int32), GGMLType.Q8_0)
    with pytest.raises(QuantError):
        quantize(torch.tensor(1.0), GGMLType.F32)
