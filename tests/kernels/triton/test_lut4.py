"""The lookup types' GEMV (IQ4_NL, IQ4_XS, MXFP4: kernels/triton/lut4.py) against float64 math on the
reference-decoded weights: f32 activations (exact table values and scales: f32 rounding only) and
the int8 activations above Q8_MIN_WEIGHTS (one and two passes), split K, raw bytes, the word order
the int8 activations meet, and what the launcher refuses. Weights are fresh random blocks (every
code, random scales: harness.random_blocks); outputs are poisoned before each launch."""

from __future__ import annotations

import pytest
import torch

from minfer.contracts.harness import random_blocks
from minfer.errors import UnsupportedError
from minfer.kernels.triton import gemv, lut4
from minfer.kernels.triton.qmatmul import gemv_default_config, q8_passes, repack_gemv
from minfer.quant import reference
from minfer.quant.types import QUANT_TABLE, GGMLType

TYPES = lut4.LUT4_TYPES
SMALL = gemv.GemvConfig(r=2, lr=8, wk=1)  # 16 rows x 4 blocks per step: small for the interpreter


def _weight(t: GGMLType, n: int, k: int, gen):
    raw = random_blocks(QUANT_TABLE[t], n, k, gen).reshape(-1)
    return raw, reference.dequantize(raw, t, (n, k)).double()


# (type, n, k, config): each type at the small tile, split K (uneven splits, prefetching) on two of them
F32_CASES = [(GGMLType.IQ4_NL, 37, 384, SMALL), (GGMLType.IQ4_XS, 5, 256, SMALL), (GGMLType.MXFP4, 24, 512, SMALL),
             (GGMLType.IQ4_XS, 20, 768, gemv.GemvConfig(r=2, lr=8, wk=1, split=3, prefetch=True)),
             (GGMLType.MXFP4, 21, 640, gemv.GemvConfig(r=2, lr=8, wk=1, split=2))]


@pytest.mark.parametrize("t, n, k, config", F32_CASES, ids=lambda v: v.name if isinstance(v, GGMLType) else None)
def test_gemv_f32_activations(t, n, k, config, device, gen, check):
    raw, w = _weight(t, n, k, gen)
    x = torch.randn(k, generator=gen)
    packed = lut4.repack_lut4(raw.to(device), n, k, t)
    extra = n * k // 256 * 2 if t == GGMLType.IQ4_XS else 0  # IQ4_XS's 6-bit scales a byte each: +1.5 %
    assert packed.nbytes == raw.numel() + extra  # the file's bytes, re-laid
    out = check.poisoned((1, n), torch.float32, device)
    lut4.lut4_gemv(x.to(device), packed, n, k, t, out=out, config=config)
    assert check.rel_err(out, (w @ x.double())[None, :]) < 1e-5  # f32 sums of exact products
    again = lut4.lut4_gemv(x.to(device), raw.to(device), n, k, t, config=config)  # raw bytes, repacked per call
    assert torch.equal(again, out)
    if config.split > 1:
        assert not packed.counters.any()  # the split's arrival counters reset themselves


@pytest.mark.parametrize("t, passes, tol", [(GGMLType.IQ4_NL, 2, 1e-4), (GGMLType.IQ4_XS, 1, 1.5e-2),
                                            (GGMLType.MXFP4, 2, 1e-4)],
                         ids=lambda v: v.name if isinstance(v, GGMLType) else None)
def test_gemv_int8_activations(t, passes, tol, device, gen, check):
    """x as int8 codes per 32 (quantize_act_q8, or records made before the call): the table bytes
    meet the codes in dp4a dots, the -128 offset through the block sum; two passes ~2e-5, one ~5e-3."""
    from minfer.kernels.triton.quantize import quantize_act_q8

    n, k = 20, 256
    raw, w = _weight(t, n, k, gen)
    x = torch.randn(1, k, generator=gen)
    packed = lut4.repack_lut4(raw.to(device), n, k, t)
    cfg = gemv.GemvConfig(r=2, lr=8, wk=1, q8=passes, split=2)
    out = check.poisoned((1, n), torch.float32, device)
    lut4.lut4_gemv(x.to(device), packed, n, k, t, out=out, config=cfg)
    assert check.rel_err(out, x.double() @ w.T) < tol
    xq = quantize_act_q8(x.to(device), passes)
    made = lut4.lut4_gemv(x.to(device), packed, n, k, t, config=cfg, xq=xq)  # records written before the call
    assert torch.equal(made, out)


def test_words_meet_the_int8_activations_code_words():
    """Word j of a block: nibble i (bits 4 i) is element 8 i + j, nibble 4 + i element 8 i + 4 + j: the
    elements of quantize_act_q8's code words j and 4 + j, byte for byte."""
    codes = torch.arange(32, dtype=torch.uint8).remainder(16).view(1, 32)
    elems = torch.arange(32).view(1, 32)
    words = lut4.lut_words(codes)
    for j in range(4):
        got = [(int(words[0, j]) >> (4 * e)) & 15 for e in range(8)]
        want = [int(elems[0, 8 * i + 4 * h + j]) % 16 for h in range(2) for i in range(4)]
        assert got == want


def test_table_words_hold_the_values_plus_128():
    for t in TYPES:
        words = lut4.table_words(t)
        got = [((words[q // 4] >> (8 * (q % 4))) & 0xFF) - 128 for q in range(16)]
        assert got == list(QUANT_TABLE[t].lut)


def test_default_config_and_pairing():
    """Above 2^24 weights the lookup GEMVs read x in the default int8 passes (what the norm before
    them may write, q8_passes), at the affine Q4 types' tile; small weights keep f32 x."""
    for t in TYPES:
        big, small = gemv_default_config(18944, 3584, t), gemv_default_config(576, 1536, t)
        assert big.q8 == gemv.ACT_Q8_PASSES and small.q8 == 0
        assert q8_passes(18944, 3584, t) == gemv.ACT_Q8_PASSES and q8_passes(576, 1536, t) == 0
        f32 = gemv._gemv_config(18944, 3584, affine=True)
        assert (big.r, big.lr, big.wk, big.split) == (f32.r, f32.lr, f32.wk, f32.split)


def test_refuses_what_it_cannot_read(device, gen):
    raw, _ = _weight(GGMLType.IQ4_XS, 4, 256, gen)
    raw = raw.to(device)
    x = torch.zeros(256, device=device)
    with pytest.raises(UnsupportedError, match="IQ4_XS needs k a multiple of 256"):
        lut4.lut4_gemv(torch.zeros(64, device=device), raw[:4 * 34], 4, 64, GGMLType.IQ4_XS)
    with pytest.raises(UnsupportedError, match="needs 544 bytes"):
        lut4.lut4_gemv(x, raw[:-1], 4, 256, GGMLType.IQ4_XS)
    with pytest.raises(UnsupportedError, match="reads IQ4_NL, IQ4_XS, MXFP4"):
        lut4.lut4_gemv(x, raw, 4, 256, GGMLType.Q4_0)
    with pytest.raises(UnsupportedError, match="1 <= m <= 8"):  # more rows than a small batch
        lut4.lut4_gemv(torch.zeros(9, 256, device=device), raw, 4, 256, GGMLType.IQ4_XS)
    packed = lut4.repack_lut4(raw, 4, 256, GGMLType.IQ4_XS)
    with pytest.raises(UnsupportedError, match=r"packed IQ4_XS \[4, 256\], the call says MXFP4"):
        lut4.lut4_gemv(x, packed, 4, 256, GGMLType.MXFP4)
    with pytest.raises(UnsupportedError, match="dtype int8"):  # a plane of the wrong dtype, refused when made
        lut4.Lut4Packed(GGMLType.IQ4_XS, packed.qs, packed.d.view(torch.uint8), packed.m, 4, 256, packed.counters,
                        packed.partials)
    assert isinstance(repack_gemv(raw, 4, 256, GGMLType.IQ4_XS), lut4.Lut4Packed)
