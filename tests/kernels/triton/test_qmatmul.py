"""Q4_0 GEMV and tiled matmul against float64 math on the reference-decoded weights."""

from __future__ import annotations

import pytest
import torch

from minfer.errors import UnsupportedError
from minfer.kernels.triton import gemv, int4, planes, q4_0, qmatmul
from minfer.kernels.triton.q4_0 import Q4_0Packed, q4_0_gemv, q4_0_matmul, repack_q4_0
from minfer.quant import reference
from minfer.quant.types import GGMLType

GEMV_CONFIG = gemv.GemvConfig(r=2, lr=8, wk=1)  # 16 rows x 4 blocks per step: small for the interpreter
MATMUL_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 128, "GROUP_M": 2, "num_warps": 4}


def _weight(n, k, gen):
    """Q4_0 bytes of normal weights [n, k] (scaled per row, as real layers are) and their float64 value."""
    w = torch.randn(n, k, generator=gen) * torch.rand(n, 1, generator=gen)
    raw = reference.quantize(w, GGMLType.Q4_0).reshape(-1)
    return raw, reference.dequantize(raw, GGMLType.Q4_0, (n, k)).double()


# (n, k): one row and one block; odd n with K not a multiple of the K step; whole K steps
@pytest.mark.parametrize("n, k", [(1, 32), (37, 160), (24, 256)])
def test_gemv(n, k, device, gen, check):
    raw, w = _weight(n, k, gen)
    x = torch.randn(k, generator=gen)
    packed = repack_q4_0(raw.to(device), n, k)
    ref = (w @ x.double())[None, :]
    for xs in (x, x[None, :]):  # [k] and [1, k]
        out = check.poisoned((1, n), torch.float32, device)
        q4_0_gemv(xs.to(device), packed, n, k, out=out, config=GEMV_CONFIG)
        assert check.rel_err(out, ref) < 1e-5  # f32 accumulation over k <= 256 terms


def test_gemv_raw_bytes_and_whole_k_steps(device, gen, check):
    n, k = 20, 32 * 8
    raw, w = _weight(n, k, gen)
    x = torch.randn(1, k, generator=gen)
    config = {"r": 2, "lr": 4, "wk": 1}  # 8 blocks per row: one K step, no tail
    out = q4_0_gemv(x.to(device), raw.to(device), n, k, config=config)  # raw GGUF bytes: repacked per call
    assert check.rel_err(out, x.double() @ w.T) < 1e-5


@pytest.mark.parametrize("compute, tol", [(torch.float16, 2e-3), (torch.bfloat16, 1.5e-2)])
@pytest.mark.parametrize("m, n, k", [(2, 16, 128), (5, 37, 160), (33, 24, 256)])
def test_matmul(m, n, k, compute, tol, device, gen, check):
    raw, w = _weight(n, k, gen)
    x = torch.randn(m, k, generator=gen)
    out = q4_0_matmul(
        x.to(device), repack_q4_0(raw.to(device), n, k), n, k,
        out=check.poisoned((m, n), torch.float32, device), config=MATMUL_CONFIG, compute_dtype=compute,
    )
    # x and W are rounded to the compute type (2^-11 / 2^-8 relative), products summed in f32
    assert check.rel_err(out, x.double() @ w.T) < tol


@pytest.mark.parametrize(
    "config",
    [gemv.GemvConfig(), gemv.GemvConfig(split=2), gemv.GemvConfig(split=3),
     gemv.GemvConfig(split=3, prefetch=True, maxnreg=128), gemv.GemvConfig(wk=2, prefetch=True, maxnreg=128)],
    ids=["default", "split2", "split3", "split3-prefetch", "prefetch"],
)
def test_gemv_production_configs(config, device, gen, check):
    """The production tile (32 rows x 16 blocks per step), alone and with K split across programs
    (uneven splits, a partial last step): one launch, then a second one that reuses the self-reset
    arrival counters."""
    n, k = 70, 32 * 72
    raw, w = _weight(n, k, gen)
    packed = repack_q4_0(raw.to(device), n, k)
    for _ in range(2 if config.split > 1 else 1):
        x = torch.randn(1, k, generator=gen)
        out = check.poisoned((1, n), torch.float32, device)
        q4_0_gemv(x.to(device), packed, n, k, out=out, config=config)
        assert check.rel_err(out, x.double() @ w.T) < 1e-5
    assert not packed.counters.any()


@pytest.mark.parametrize("index", [0, -1])
def test_matmul_production_configs(index, device, gen, check):
    """The first and last autotune configs of the matmul, on a K with a partial last step."""
    n, k, m = 70, 960, 40
    raw, w = _weight(n, k, gen)
    x = torch.randn(m, k, generator=gen)
    cfg = q4_0._matmul_tuned.configs[index]
    config = dict(cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    out = check.poisoned((m, n), torch.float32, device)
    q4_0_matmul(x.to(device), repack_q4_0(raw.to(device), n, k), n, k, out=out, config=config)
    assert check.rel_err(out, x.double() @ w.T) < 2e-3, config


def test_repack_keeps_the_scales(device, gen):
    raw, _ = _weight(3, 64, gen)
    packed = repack_q4_0(raw.to(device), 3, 64)
    assert packed.qs.shape == (3, 8) and packed.qs.dtype == torch.int32
    assert torch.equal(packed.d.cpu().view(torch.uint8).reshape(-1, 2), raw.reshape(-1, 18)[:, :2])


def test_invariants(device, gen):
    raw, _ = _weight(4, 64, gen)
    raw = raw.to(device)
    x = torch.zeros(64, device=device)
    with pytest.raises(UnsupportedError, match="multiple of 32"):
        q4_0_gemv(x[:48].contiguous(), raw, 4, 48)
    with pytest.raises(UnsupportedError, match="needs 144 bytes"):
        q4_0_gemv(x, raw[:-1], 4, 64)
    with pytest.raises(UnsupportedError, match="dtype float32"):
        q4_0_gemv(x.half(), raw, 4, 64)
    with pytest.raises(UnsupportedError, match="1 <= m <= 8"):  # more rows than a small batch
        q4_0_gemv(torch.zeros(9, 64, device=device), raw, 4, 64)
    with pytest.raises(UnsupportedError, match="x must be"):
        q4_0_gemv(torch.zeros(32, device=device), raw, 4, 64)
    packed = repack_q4_0(raw, 4, 64)
    with pytest.raises(UnsupportedError, match=r"packed \[4, 64\] weight, the call says \[8, 32\]"):
        q4_0_matmul(torch.zeros(3, 32, device=device), packed, 8, 32)
    with pytest.raises(UnsupportedError, match=r"x must be \[m, 64\]"):
        q4_0_matmul(torch.zeros(3, 32, device=device), packed, 4, 64)
    with pytest.raises(UnsupportedError, match="compute_dtype"):
        q4_0_matmul(torch.zeros(3, 64, device=device), packed, 4, 64, compute_dtype=torch.float32)
    with pytest.raises(UnsupportedError, match="Q4_0Packed"):
        q4_0_gemv(x, "weights", 4, 64)
    with pytest.raises(UnsupportedError, match="dtype int32"):  # checked once, when made
        Q4_0Packed(qs=packed.qs.float(), d=packed.d, n=4, k=64)
    with pytest.raises(UnsupportedError, match="sizes do not match"):
        Q4_0Packed(qs=packed.qs, d=packed.d, n=4, k=96)


def test_gemv_config_choice():
    """The H200 sweep's rules (bench/NOTES.md): wide weights (>= 16384 rows) fill the GPU with row
    tiles alone, 2 warps, no split; mid-size ones with k <= 4096 split K up to 8 ways at 2 warps;
    long-K down projections up to 6 ways at 4 warps; small (latency-bound) ones take 16-row tiles."""
    for n, k in [(18944, 3584), (152064, 3584), (37888, 3584)]:
        cfg = gemv.gemv_config(n, k)
        assert (cfg.wk, cfg.split) == (2, 1)
    down = gemv.gemv_config(3584, 18944)  # 112 row tiles of 32 rows
    assert (down.block_n, down.wk, down.split) == (32, 4, 6)
    qkv = gemv.gemv_config(4608, 3584)
    assert (qkv.wk, qkv.split) == (2, 7)
    small = gemv.gemv_config(576, 1536)
    assert (small.r, small.lr, small.split, small.block_n) == (2, 4, 1, 8)
    mid = gemv.gemv_config(2048, 4096)  # 64 row tiles, 128 blocks: 8 splits of 2 K steps
    packed = repack_q4_0(torch.zeros(2048 * 4096 // 32 * 18, dtype=torch.uint8), 2048, 4096)
    assert mid.split == 8 and gemv._split_plan(mid, 2048, 4096)[1] == 8
    assert packed.partials.numel() == 8 * 2048 and packed.counters.numel() == 2048
    # prefetching (f32 activations): the attention projections (few K steps per program) and every
    # affine (Q4_1 / Q4_K) shape
    tile = gemv._gemv_config
    assert tile(4608, 3584).prefetch and tile(3584, 3584).prefetch
    assert not any(tile(n, k).prefetch for n, k in [(37888, 3584), (3584, 18944), (152064, 3584)])
    q4k_down = tile(4096, 14336, affine=True)
    assert (q4k_down.wk, q4k_down.split, q4k_down.prefetch, q4k_down.maxnreg) == (2, 8, True, 168)
    assert tile(28672, 4096, affine=True).prefetch
    # the default activations: two int8 passes, which never prefetch (registers); the tile is kept
    for n, k, affine in [(4608, 3584, False), (3584, 18944, False), (4096, 14336, True), (576, 1536, True),
                         (37888, 3584, False), (6144, 4096, True)]:
        cfg, f32 = gemv.gemv_config(n, k, affine), tile(n, k, affine)
        assert cfg.q8 == (gemv.ACT_Q8_PASSES if n * k > gemv.Q8_MIN_WEIGHTS else 0)  # small: latency-bound
        assert (cfg.r, cfg.lr, cfg.wk, cfg.split) == (f32.r, f32.lr, f32.wk, f32.split)
        assert cfg.prefetch == (f32.prefetch and cfg.q8 != 2)


def test_matmul_config_pruning():
    configs = q4_0._matmul_tuned.configs
    assert {c.kwargs["BLOCK_M"] for c in q4_0._prune_matmul(configs, {"M_BUCKET": 8})} == {16}
    assert max(c.kwargs["BLOCK_M"] for c in q4_0._prune_matmul(configs, {"M_BUCKET": 64})) == 64
    assert len(q4_0._prune_matmul(configs, {"M_BUCKET": 4096})) == len(configs)


# ---- int4_gemv: Q4_1 and Q4_K on the same tile ------------------------------------------------


def _int4_weight(qtype, n, k, gen):
    """Random valid blocks of qtype (every nibble and 6-bit scale pattern) and their float64 value."""
    from minfer.contracts.harness import random_blocks
    from minfer.quant.types import QUANT_TABLE

    raw = random_blocks(QUANT_TABLE[qtype], n, k, gen).reshape(-1)
    return raw, reference.dequantize(raw, qtype, (n, k)).double()


@pytest.mark.parametrize("qtype", [GGMLType.Q4_1, GGMLType.Q4_K])
@pytest.mark.parametrize("n, k, config", [(5, 256, GEMV_CONFIG), (37, 768, GEMV_CONFIG),
                                          (24, 1024, gemv.GemvConfig(r=2, lr=8, wk=1, split=3)),
                                          (40, 768, gemv.GemvConfig(r=2, lr=8, wk=1, split=2, prefetch=True))])
def test_int4_gemv(qtype, n, k, config, device, gen, check):
    raw, w = _int4_weight(qtype, n, k, gen)
    x = torch.randn(k, generator=gen)
    packed = int4.repack_int4(raw.to(device), n, k, qtype)
    laid = sum(t.numel() * t.element_size() for t in (packed.qs, packed.d, packed.m))
    assert raw.numel() <= laid <= 1.03 * raw.numel()  # about the file's bytes, re-laid
    out = check.poisoned((1, n), torch.float32, device)
    int4.int4_gemv(x.to(device), packed, n, k, qtype, out=out, config=config)
    assert check.rel_err(out, (w @ x.double())[None, :]) < 1e-5
    again = int4.int4_gemv(x.to(device), raw.to(device), n, k, qtype, config=config)  # raw bytes, repacked
    assert torch.equal(again, out)


def test_int4_gemv_refuses_what_it_cannot_read(device, gen):
    raw, _ = _int4_weight(GGMLType.Q4_K, 4, 256, gen)
    packed = int4.repack_int4(raw.to(device), 4, 256, GGMLType.Q4_K)
    x = torch.randn(256, device=device)
    with pytest.raises(UnsupportedError, match="reads Q4_1 or Q4_K weights"):
        int4.int4_gemv(x, packed, 4, 256, GGMLType.Q4_0)
    with pytest.raises(UnsupportedError, match="packed Q4_K \\[4, 256\\], the call says Q4_1"):
        int4.int4_gemv(x, packed, 4, 256, GGMLType.Q4_1)
    with pytest.raises(UnsupportedError, match="multiple of 256"):
        int4.repack_int4(raw.to(device)[:72], 2, 128, GGMLType.Q4_K)
    with pytest.raises(UnsupportedError, match="1 <= m <= 8"):  # more rows than a small batch
        int4.int4_gemv(torch.randn(9, 256, device=device), packed, 4, 256, GGMLType.Q4_K)


# ---- planes GEMVs: Q8_0, Q5_0, Q5_1, Q5_K, Q6_K, Q3_K, Q2_K ----------------------------------

PLANE_TYPES = list(planes.PLANE_TYPES)
PLANE_LAUNCHERS = {GGMLType.Q8_0: planes.q8_0_gemv, GGMLType.Q6_K: planes.q6_k_gemv, GGMLType.Q5_0: planes.q5_gemv,
                   GGMLType.Q5_1: planes.q5_gemv, GGMLType.Q5_K: planes.q5_gemv, GGMLType.Q3_K: planes.q3_k_gemv,
                   GGMLType.Q2_K: planes.q2_k_gemv}
FILE_BYTES_SLACK = {GGMLType.Q5_K: 1.03, GGMLType.Q3_K: 1.04}  # their 6-bit scales take a byte each


@pytest.mark.parametrize("qtype", PLANE_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n, k, config", [(5, 256, GEMV_CONFIG), (37, 768, GEMV_CONFIG),
                                          (24, 1024, gemv.GemvConfig(r=2, lr=8, wk=1, split=3)),
                                          (40, 768, gemv.GemvConfig(r=2, lr=8, wk=1, split=2, prefetch=True))],
                         ids=["one-step", "odd-rows", "split3", "split2-prefetch"])
def test_planes_gemv(qtype, n, k, config, device, gen, check):
    """Random valid blocks (every code and scale bit pattern, signed sub-block scales included)
    against float64 math on the reference decoder's weights; the layout is the file's bytes."""
    raw, w = _int4_weight(qtype, n, k, gen)
    x = torch.randn(k, generator=gen)
    packed = planes.repack_planes(raw.to(device), n, k, qtype)
    assert raw.numel() <= packed.nbytes <= FILE_BYTES_SLACK.get(qtype, 1.0) * raw.numel()
    out = check.poisoned((1, n), torch.float32, device)
    PLANE_LAUNCHERS[qtype](x.to(device), packed, n, k, qtype, out=out, config=config)
    assert check.rel_err(out, (w @ x.double())[None, :]) < 1e-5
    again = PLANE_LAUNCHERS[qtype](x.to(device), raw.to(device), n, k, qtype, config=config)  # raw bytes, repacked
    assert torch.equal(again, out)
    if config.split > 1:
        assert not packed.counters.any()  # the arrival counters reset themselves


@pytest.mark.parametrize("qtype", PLANE_TYPES, ids=lambda t: t.name)
def test_planes_gemv_reads_the_reference_weights_exactly(qtype, device, gen):
    """x = a unit vector e_i makes the GEMV return column i of W: every product and sum but one
    is of zeros, so the result is the kernel's dequantized weight, which must be the reference
    decoder's float32 value bit for bit (the same scale products in the same order)."""
    n, k = 12, 512
    raw, _ = _int4_weight(qtype, n, k, gen)
    ref = reference.dequantize(raw, qtype, (n, k))
    packed = planes.repack_planes(raw.to(device), n, k, qtype)
    cols = [0, 15, 16, 31, 255, 256 + 17, k - 1] + torch.randint(0, k, (3,), generator=gen).tolist()
    for i in cols:  # both halves of a 32-element block, both super-blocks, the last element
        x = torch.zeros(k)
        x[i] = 1.0
        out = planes.planes_gemv(x.to(device), packed, n, k, qtype, config=GEMV_CONFIG)
        assert torch.equal(out[0].cpu(), ref[:, i]), f"column {i}"


def test_planes_gemv_refuses_what_it_cannot_read(device, gen):
    raw, _ = _int4_weight(GGMLType.Q6_K, 4, 256, gen)
    packed = planes.repack_planes(raw.to(device), 4, 256, GGMLType.Q6_K)
    x = torch.randn(256, device=device)
    with pytest.raises(UnsupportedError, match="reads Q6_K weights"):
        planes.q6_k_gemv(x, packed, 4, 256, GGMLType.Q8_0)
    with pytest.raises(UnsupportedError, match="reads Q5_0, Q5_1, Q5_K weights"):
        planes.q5_gemv(x, packed, 4, 256, GGMLType.Q6_K)
    with pytest.raises(UnsupportedError, match=r"packed Q6_K \[4, 256\], the call says Q8_0"):
        planes.planes_gemv(x, packed, 4, 256, GGMLType.Q8_0)
    with pytest.raises(UnsupportedError, match="multiple of 256"):
        planes.repack_planes(raw.to(device)[:105], 1, 128, GGMLType.Q6_K)
    with pytest.raises(UnsupportedError, match="needs 840 bytes"):
        planes.repack_planes(raw.to(device)[:-1], 4, 256, GGMLType.Q6_K)
    with pytest.raises(UnsupportedError, match="1 <= m <= 8"):  # more rows than a small batch
        planes.q6_k_gemv(torch.randn(9, 256, device=device), packed, 4, 256)
    with pytest.raises(UnsupportedError, match="PlanesPacked or raw GGUF bytes"):
        planes.q6_k_gemv(x, "weights", 4, 256)
    with pytest.raises(UnsupportedError, match="reads Q8_0, Q5_0"):
        planes.repack_planes(raw.to(device), 4, 256, GGMLType.Q4_K)
    from dataclasses import replace

    with pytest.raises(UnsupportedError, match="lo must have dtype int32"):  # checked once, when made
        replace(packed, lo=packed.lo.to(torch.int16))
    with pytest.raises(UnsupportedError, match="planes must hold 128 words"):
        replace(packed, hi=packed.hi[:2])


def test_planes_config_register_caps():
    """The caps the sm_90 compile check passes without spills: prefetching tiles 168 registers;
    Q5_1 / Q5_K do not prefetch (their high words and offsets spill beside the prefetched words),
    nor do wide Q6_K weights (measured faster without)."""
    for t in PLANE_TYPES:
        for n, k in [(18944, 3584), (3584, 18944), (152064, 3584), (4608, 3584)]:
            cfg = planes.planes_config(n, k, t)
            base = gemv._gemv_config(n, k, True)
            assert (cfg.block_n, cfg.block_kb, cfg.split, cfg.q8) == (base.block_n, base.block_kb, base.split, 0)
            if t in (GGMLType.Q5_1, GGMLType.Q5_K) or (t == GGMLType.Q6_K and n >= gemv.WIDE_ROWS):
                assert not cfg.prefetch
            elif base.prefetch:
                assert cfg.prefetch and cfg.maxnreg == planes.PLANES_REGS


# ---- int8 activations (GemvConfig.q8): dp4a dots on x quantized per 32 in one or two passes ----


@pytest.mark.parametrize("qtype", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q4_K])
@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("n, k, config", [(37, 768, GEMV_CONFIG),
                                          (24, 1024, gemv.GemvConfig(r=2, lr=8, wk=1, split=3)),
                                          (40, 768, gemv.GemvConfig(r=2, lr=8, wk=1, split=2, prefetch=True))])
def test_gemv_int8_activations(qtype, passes, n, k, config, device, gen, check):
    """Exact on the quantized x (the sums are integers, the scales f32), and within the
    quantization's error of the f32 product."""
    from minfer.kernels.triton.quantize import quantize_act_q8

    from .test_quantize import decode_act

    if qtype == GGMLType.Q4_0:
        raw, w = _weight(n, k, gen)
    else:
        raw, w = _int4_weight(qtype, n, k, gen)
    x = torch.randn(k, generator=gen)
    packed = qmatmul.repack_gemv(raw.to(device), n, k, qtype)
    out = check.poisoned((1, n), torch.float32, device)
    qmatmul.launch_packed("test", x.to(device), packed, out, gemv.replace(config, q8=passes))
    x_hat = decode_act(*quantize_act_q8(x[None, :].to(device), passes), passes)[0]
    assert check.rel_err(out, (w @ x_hat)[None, :]) < 1e-5
    assert check.rel_err(out, (w @ x.double())[None, :]) < (1.5e-2 if passes == 1 else 1e-4)


def test_gemv_q8_switch(monkeypatch):
    """MINFER_GEMV_Q8 becomes EngineConfig.gemv_q8, which the GEMV configs take as their activation
    passes (the backend passes it down); bad values are typed errors."""
    from minfer.config import EngineConfig
    from minfer.errors import MinferError

    for raw, want in [("0", 0), ("1", 1), ("2", 2), ("", gemv.ACT_Q8_PASSES)]:
        monkeypatch.setenv("MINFER_GEMV_Q8", raw)
        passes = EngineConfig.from_env().gemv_q8
        assert passes == want
        assert gemv.gemv_config(37888, 3584, act_q8=passes).q8 == want  # (above Q8_MIN_WEIGHTS)
    monkeypatch.setenv("MINFER_GEMV_Q8", "3")
    with pytest.raises(MinferError, match="gemv_q8"):
        EngineConfig.from_env()
    with pytest.raises(UnsupportedError, match="0, 1 or 2"):
        gemv.gemv_config(37888, 3584, act_q8=3)


# ---- small batches (MB): up to gemv.SMALL_ROWS rows of x against the weight read once ----


@pytest.mark.parametrize("qtype, passes", [(GGMLType.Q4_0, 0), (GGMLType.Q4_0, 2), (GGMLType.Q4_K, 0),
                                           (GGMLType.Q4_K, 1), (GGMLType.Q6_K, 0), (GGMLType.MXFP4, 2)])
@pytest.mark.parametrize("rows, config", [(2, GEMV_CONFIG), (3, gemv.GemvConfig(r=2, lr=8, wk=1, split=3)),
                                          (8, gemv.GemvConfig(r=1, lr=8, wk=1, split=2, prefetch=True))])
def test_gemv_small_batches(qtype, passes, rows, config, device, gen, check):
    """m rows in one launch (each row its own programs): each row within f32 rounding of float64 math
    on the weight (and on its int8 x), and equal bit for bit to that row launched alone (the same sums
    in the same order), split K included (partial sums and arrival counters per row); nothing is
    stored past the m rows."""
    from minfer.contracts.harness import random_blocks
    from minfer.kernels.triton.quantize import quantize_act_q8
    from minfer.quant.types import QUANT_TABLE

    from .test_quantize import decode_act

    n, k = 37, 1024
    raw = random_blocks(QUANT_TABLE[qtype], n, k, gen).reshape(-1)
    w = reference.dequantize(raw, qtype, (n, k)).double()
    packed = qmatmul.repack_gemv(raw.to(device), n, k, qtype)
    x = torch.randn(rows, k, generator=gen)
    cfg = gemv.replace(config, q8=passes)
    out = check.poisoned((rows + 1, n), torch.float32, device)
    qmatmul.launch_packed("test", x.to(device), packed, out[:rows], cfg)
    assert torch.isnan(out[rows]).all()  # the row after the batch untouched
    x_hat = decode_act(*quantize_act_q8(x.to(device), passes), passes) if passes else x.double()
    assert check.rel_err(out[:rows], x_hat @ w.T) < 1e-5
    for i in range(rows):
        alone = check.poisoned((1, n), torch.float32, device)
        qmatmul.launch_packed("test", x[i:i + 1].to(device), packed, alone, cfg)
        assert torch.equal(out[i:i + 1], alone), i


def test_small_batch_bounds(device, gen):
    """More rows than SMALL_ROWS, or rows of another length, are typed errors, not a silent wrong launch;
    a small batch takes the weight's one-row tile (gemv_config), its rows its programs."""
    raw, _ = _weight(16, 64, gen)
    packed = repack_q4_0(raw.to(device), 16, 64)
    with pytest.raises(UnsupportedError, match="1 <= m <= 8"):
        q4_0_gemv(torch.zeros(gemv.SMALL_ROWS + 1, 64, device=device), packed, 16, 64)
    with pytest.raises(UnsupportedError, match="x must be"):
        q4_0_gemv(torch.zeros(2, 32, device=device), packed, 16, 64)
    x = torch.randn(gemv.SMALL_ROWS, 64, generator=gen).to(device)
    out = q4_0_gemv(x, packed, 16, 64, config=GEMV_CONFIG)
    assert out.shape == (gemv.SMALL_ROWS, 16)
    assert torch.equal(out[3:4], q4_0_gemv(x[3], packed, 16, 64, config=GEMV_CONFIG))
