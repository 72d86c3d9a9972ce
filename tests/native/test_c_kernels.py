"""minfer's C code (kernels/cpu/q4_vnni.c, kernels/wgpu/replay.c) over random shapes and the
boundary shapes of its contracts,
and shapes outside them refused before any memory is touched.

These run in the ordinary suite (the results against float64 / the reference ops) and again under
AddressSanitizer + UBSan (scripts/sanitize.sh builds the same sources with
-fsanitize=address,undefined and runs this file with libasan preloaded: any out-of-bounds access,
overflow or misaligned load aborts it). Shapes stay small: the sanitized build runs ~5x slower.
"""

from __future__ import annotations

import ctypes
import random

import numpy as np
import pytest
import torch

from minfer.backends.cpu import ops as cpu_ops
from minfer.errors import UnsupportedError
from minfer.gguf.synth import random_blocks
from minfer.kernels.cpu import vnni as cpu_vnni
from minfer.quant.reference import dequantize, quantize
from minfer.quant.types import GGMLType, quant_info

pytestmark = pytest.mark.native
# every build (amx, avx512, avxvnni, avx2: cpu_vnni.ISAS) and the amx build with its tile unit emulated in C
# (cpu_vnni.TEST_ISAS: the AMX path's indexing and float order on any AVX-512 machine)
ISAS = (*cpu_vnni.ISAS, *cpu_vnni.TEST_ISAS)


@pytest.fixture(params=ISAS)
def isa(request):
    """Each build of the C kernels (ISAS) in turn, where this CPU has it."""
    with cpu_vnni.isa_forced(request.param) as got:
        if got is None:
            pytest.skip(f"this CPU (or compiler) has no {request.param} build")
        yield request.param


def needs_vnni(test):
    """A test of the C kernels: run on every ISA build this host has (the `isa` fixture)."""
    return pytest.mark.skipif(not cpu_vnni.available(), reason="needs AVX2 (or AVX512-VNNI) and a C compiler")(
        pytest.mark.usefixtures("isa")(test))
K_TYPES = (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ4_XS)
TYPES = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q4_K, GGMLType.Q8_0, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q5_K,
         GGMLType.Q6_K, GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.MXFP4)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm())


def _weight(qtype: GGMLType, n: int, k: int, seed: int) -> torch.Tensor:
    """uint8 [n, row bytes]: quantized normal weights where the reference quantizes the type,
    else random blocks with sane scales (gguf/synth.py)."""
    if qtype in (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0, GGMLType.MXFP4):
        return quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)), qtype)
    info = quant_info(qtype)
    blocks = random_blocks(np.random.default_rng(seed), qtype, n * k // info.block_elems)
    return torch.from_numpy(np.ascontiguousarray(blocks).view(np.uint8).reshape(n, info.nbytes(k)).copy())


def _matmul_case(qtype: GGMLType, n: int, k: int, m: int, seed: int, bf16: bool = False) -> None:
    gen = torch.Generator().manual_seed(seed)
    raw = _weight(qtype, n, k, seed)
    w = dequantize(raw, qtype, (n, k)).double()
    mm = cpu_vnni.Q4Vnni([(raw, qtype, n, k)])
    x = torch.randn(m, k, generator=gen)
    if bf16:
        x = x.bfloat16()
    want = x.double() @ w.T
    y = mm(x, 2)
    assert y.shape == (m, n)
    # (float16 scale and offset per group: with a few outputs the error is ~1e-4 more than the
    # ~2e-5 tests/engine/test_cpu_vnni.py sees on bigger ones)
    assert _rel(y, want) < 1e-3, (qtype.name, n, k, m)
    if qtype not in cpu_vnni.LUT_TYPES:  # (the lookup types have no one-pass contract: two passes only)
        assert _rel(mm(x, 1), want) < 3e-2, (qtype.name, n, k, m)


@needs_vnni
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_matmul_boundary_shapes(qtype):
    """The contract's edges: the smallest k (32, or 256 for the K types), n one column and one
    below/above the 32-column tile, m across the row tiles (AVX2's 4; AVX-512's 6 prompt rows, Q6_K's 4: 1, 3,
    4, 5, 6, 7, 8), bfloat16 input."""
    k = 256 if qtype in K_TYPES else 32
    for i, (n, m) in enumerate([(1, 1), (31, 3), (32, 4), (33, 5), (40, 6), (48, 7), (64, 8)]):
        _matmul_case(qtype, n, k, m, seed=i)
    _matmul_case(qtype, 16, k, 2, seed=9, bf16=True)


@needs_vnni
def test_matmul_random_shapes():
    rnd = random.Random(1234)
    for i in range(24):
        qtype = rnd.choice(TYPES)
        block = 256 if qtype in K_TYPES else 32
        _matmul_case(qtype, rnd.randint(1, 160), block * rnd.randint(1, 6), rnd.randint(1, 13), seed=100 + i,
                     bf16=rnd.random() < 0.3)


@needs_vnni
@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q4_0], ids=lambda t: t.name)
def test_many_rows_in_blocks_give_each_row_its_own_numbers(passes, qtype):
    """A prompt's rows run in blocks of 60 per work item (q4_vnni.c ROW_BLOCK), tiles of 6 or 4 rows: a row's
    result, with a bias too, is the one it gets alone, in every block and tile and at the edges (150 rows:
    blocks of 60, 60, 30).
    Q4_0 at one pass: each row's zero in integers from its own sums of q (tile()'s ZI)."""
    raw = _weight(qtype, 64, 256, seed=3)
    mm = cpu_vnni.Q4Vnni([(raw, qtype, 64, 256)])
    x = torch.randn(150, 256, generator=torch.Generator().manual_seed(4))
    y = mm(x, passes)
    for r in (0, 3, 5, 6, 59, 60, 100, 119, 120, 127, 149):
        assert torch.equal(y[r], mm(x[r:r + 1], passes)[0]), r


@needs_vnni
def test_matmul_refuses_what_is_outside_its_contract():
    raw = quantize(torch.randn(32, 64), GGMLType.Q4_0)
    with pytest.raises(UnsupportedError, match="k must be one multiple of 32"):
        cpu_vnni.Q4Vnni([(raw, GGMLType.Q4_0, 32, 48)])
    with pytest.raises(UnsupportedError, match="rows must be uint8"):  # bytes that are not [n, row bytes]
        cpu_vnni.Q4Vnni([(raw[:, :-2], GGMLType.Q4_0, 32, 64)])
    with pytest.raises(UnsupportedError, match="rows must be uint8"):
        cpu_vnni.Q4Vnni([(quantize(torch.randn(32, 64), GGMLType.Q4_0), GGMLType.Q4_K, 32, 64)])
    mm = cpu_vnni.Q4Vnni([(raw, GGMLType.Q4_0, 32, 64)])
    for bad in (torch.randn(2, 32), torch.randn(0, 64), torch.randn(64)):
        with pytest.raises(UnsupportedError, match=r"x must be \[m >= 1, 64\]"):
            mm(bad)
    with pytest.raises(UnsupportedError, match="outside the kernel's contract"):
        mm(torch.randn(2, 64), passes=3)


@needs_vnni
def test_device_tensors_are_refused_not_dereferenced():
    """A tensor not in host memory (here `meta`; on the H200 a CUDA one, which segfaulted the MoE
    conformance run of 2026-12-04) is a typed error at each C entry point, before any address is read."""
    off = "meta"
    raw = quantize(torch.randn(32, 64), GGMLType.Q4_0)
    with pytest.raises(UnsupportedError, match="host tensors"):
        cpu_vnni.Q4Vnni([(raw.to(off), GGMLType.Q4_0, 32, 64)])
    mm = cpu_vnni.Q4Vnni([(raw, GGMLType.Q4_0, 32, 64)])
    with pytest.raises(UnsupportedError, match="host tensors"):
        mm(torch.randn(2, 64, device=off))
    experts = cpu_vnni.vnni_experts(torch.cat([raw.flatten(), raw.flatten()]), 32, 64, GGMLType.Q4_0, 2)
    with pytest.raises(UnsupportedError, match="host tensors"):
        experts.run_experts(torch.randn(3, 64, device=off), torch.zeros(3, 1, dtype=torch.int32), 32, 2)
    with pytest.raises(UnsupportedError, match="host tensors"):
        cpu_vnni.rms_norm(torch.randn(2, 32, device=off), torch.ones(32), 1e-6)
    cos = torch.ones(2, 8)
    with pytest.raises(UnsupportedError, match="host tensors"):
        cpu_vnni.rope(torch.randn(2, 32, device=off), cos, cos, 2, 16, 16, False)
    kv = torch.randn(1, 1, 8, 16)
    lens = torch.tensor([4], dtype=torch.int32)
    with pytest.raises(UnsupportedError, match="host tensors"):
        cpu_vnni.attention_decode(torch.randn(1, 16), kv.to(off), kv.to(off), torch.zeros(1, dtype=torch.int32),
                                  lens, 1, 0.25)


@needs_vnni
def test_lookup_scales_beyond_float16_are_refused():
    """An MXFP4 exponent whose scale 2^(e - 128) overflows float16 is a typed error at load; the
    largest that fits (e = 143: S = 2^15; its zero -128 S = -2^22 is made in float32 by the kernel,
    no float16 zero is stored) packs and multiplies as the others."""
    raw = quantize(torch.randn(32, 64), GGMLType.MXFP4).view(32, 2, 17)
    raw[:, :, 0] = 144  # S = 2^16 > 65504
    with pytest.raises(UnsupportedError, match="float16"):
        cpu_vnni.Q4Vnni([(raw.reshape(32, 34), GGMLType.MXFP4, 32, 64)])
    raw[:, :, 0] = 143
    raw = raw.reshape(32, 34)
    mm = cpu_vnni.Q4Vnni([(raw, GGMLType.MXFP4, 32, 64)])
    x = torch.randn(3, 64)
    assert _rel(mm(x, 2), x.double() @ dequantize(raw, GGMLType.MXFP4, (32, 64)).double().T) < 1e-4


@needs_vnni
def test_pack_refuses_bad_sizes_in_c():
    """The C entry points check their own sizes (a caller that skips the Python checks)."""
    so = cpu_vnni._library()
    buf = torch.zeros(4096, dtype=torch.uint8)
    p = buf.data_ptr()
    assert so.q4_pack(p, 2, 1, 48, 0, p, p, p) == -1  # k not a multiple of 32
    assert so.q4_pack(p, 12, 1, 32, 0, p, p, p) == -1  # Q4_K: k not a multiple of 256
    assert so.q4_pack(p, 99, 1, 32, 0, p, p, p) == -1  # not a 4-bit type
    assert so.q4_pack(p, 23, 1, 32, 0, p, p, p) == -1  # IQ4_XS: k not a multiple of 256
    assert so.q8_pack(p, 13, 1, 32, 0, p, p, p) == -1  # Q5_K is not an 8-bit type
    assert so.q8_pack(p, 8, -1, 32, 0, p, p, p) == -1
    assert so.q56_pack(p, 8, 1, 32, 0, p, p, p) == -1  # Q8_0 is not a 5- or 6-bit type
    assert so.q56_pack(p, 14, 1, 32, 0, p, p, p) == -1  # Q6_K: k not a multiple of 256
    assert so.q56_pack(p, 6, 1, 48, 0, p, p, p) == -1
    for m, n, k, ldy in ((0, 32, 32, 32), (1, 16, 32, 32), (1, 32, 16, 32), (1, 32, 32, 16)):
        assert so.q4_gemm(p, p, p, 0.0, n, k, p, 0, m, p, ldy, 1, 4, None) == -1, (m, n, k, ldy)
    assert so.q4_gemm(p, p, p, 0.0, 32, 32, p, 0, 1, p, 32, 1, 8, p) == -1  # a table with 8-bit codes
    assert so.q4_gemm(p, p, None, 0.0, 32, 32, p, 0, 1, p, 32, 1, 4, None) == -1  # no zeros and no zero multiple
    assert so.q4_gemm(p, p, p, 0.0, 32, 32, p, 0, 1, p, 32, 1, 7, None) == -1  # no 7-bit codes
    assert so.rms_norm(p, 1, 0, p, 1e-5, p) == -1  # rows of no values
    assert so.rope_f32(p, 8, 1, 1, 8, 9, 0, p, p, p) == -1  # an odd rotated width


def _on(isa: str, fn):
    """fn() with the C kernels' `isa` build."""
    with cpu_vnni.isa_forced(isa):
        return fn()


def _builds() -> list[str]:
    """The ISA builds other than avx512 this host runs (their results are checked against avx512's)."""
    have = [i for i in ISAS if _on(i, cpu_vnni.isa) == i]
    if "avx512" not in have or len(have) < 2:
        pytest.skip(f"needs the avx512 build and another to compare (this host runs {have or 'none'})")
    return [i for i in have if i != "avx512"]


def _activations(m: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Random rows with the awkward groups too: all zero, one large value, tiny values."""
    x = torch.randn(m, k, generator=gen) * torch.exp(torch.randn(m, 1, generator=gen))
    x[0, :32] = 0.0
    if k >= 64:
        x[-1, 32:64] *= 1e-6
    x[m // 2, k - 1] = 300.0
    return x


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_isa_build_gives_the_avx512_bits(qtype):
    """The amx, avx2 and avxvnni builds (and the emulated amx one) against the avx512 one on fresh random
    inputs: the same packed bytes, and torch.equal products for float32 and bfloat16 x, one and two
    activation passes, row counts across the row tiles (4 and 6) and the amx build's blocks of 32 rows (45: one
    block + 13 rows on the vector tile; 160: blocks in two work items of 128), and the grouped experts call."""
    others = _builds()
    k = 512 if qtype in K_TYPES else 96
    n, n_expert = 72, 3
    for seed, m in enumerate((1, 3, 4, 5, 6, 7, 13, 45, 160)):
        gen = torch.Generator().manual_seed(1000 + seed)
        raw = _weight(qtype, n, k, seed)
        x = _activations(m, k, gen)
        ref = _on("avx512", lambda raw=raw: cpu_vnni.Q4Vnni([(raw, qtype, n, k)]))
        want = [ref(x, p) for p in (1, 2)] + [ref(x.bfloat16(), 2)]
        for isa in others:
            mm = _on(isa, lambda raw=raw: cpu_vnni.Q4Vnni([(raw, qtype, n, k)]))
            assert all(torch.equal(a, b) for a, b in zip(mm.state().values(), ref.state().values(), strict=True)
                       if isinstance(a, torch.Tensor)), (isa, "packing")
            got = [mm(x, p) for p in (1, 2)] + [mm(x.bfloat16(), 2)]
            for what, a, b in zip(("1 pass", "2 passes", "bf16"), got, want, strict=True):
                assert torch.equal(a, b), (isa, qtype.name, m, what, float((a - b).abs().max()))
    gen = torch.Generator().manual_seed(7)
    raw = _weight(qtype, n * n_expert, k, 77)
    x = _activations(9, k, gen)
    ids = torch.randint(0, n_expert, (9, 2), generator=gen, dtype=torch.int32)
    want = _on("avx512", lambda: cpu_vnni.vnni_experts(raw, n, k, qtype, n_expert)).run_experts(x, ids, n, n_expert)
    for isa in others:
        got = _on(isa, lambda: cpu_vnni.vnni_experts(raw, n, k, qtype, n_expert)).run_experts(x, ids, n, n_expert)
        assert torch.equal(got, want), (isa, qtype.name, "experts")


@pytest.mark.parametrize("qtype", [GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.IQ4_NL],
                         ids=lambda t: t.name)
def test_the_amx_units_give_the_avx512_bits(qtype):
    """The amx builds' work in units of 32 rows x 32 groups (q4_vnni.c amx_rows, the tile unit one unit ahead of
    the scaling): k over several units with a partial last one, three blocks of 32 rows and a rest on the vector
    tile, one and two passes: torch.equal with the avx512 build (the emulated tile unit here, the real one where
    the CPU has it)."""
    builds = [i for i in ("amx", "amx-emulated") if _on(i, cpu_vnni.isa) == i]
    if not builds or _on("avx512", cpu_vnni.isa) != "avx512":
        pytest.skip("needs the avx512 build and an amx one")
    k = 2304 if qtype in K_TYPES else 2080  # 72 / 65 groups: units of 32, 32, 8 / 32, 32, 1
    raw = _weight(qtype, 40, k, 5)
    x = _activations(100, k, torch.Generator().manual_seed(6))
    ref = _on("avx512", lambda: cpu_vnni.Q4Vnni([(raw, qtype, 40, k)]))
    for isa in builds:
        mm = _on(isa, lambda: cpu_vnni.Q4Vnni([(raw, qtype, 40, k)]))
        for p in (1, 2):
            a, b = mm(x, p), ref(x, p)
            assert torch.equal(a, b), (isa, qtype.name, p, float((a - b).abs().max()))


def test_every_isa_build_gives_the_avx512_attention_and_norm():
    """Decode attention (chunk edges, padding lanes, 1..16 query heads a kv head, the exponentials'
    underflow) and RMSNorm: torch.equal between the builds."""
    others = _builds()
    gen = torch.Generator().manual_seed(5)
    for hd, grp, lens in ((16, 1, [1, 17, 129]), (64, 16, [127, 128, 300]), (256, 2, [5, 260])):
        n_kv, n_ctx = 2, 300
        kc = torch.randn(2, n_kv, n_ctx, hd, generator=gen) * 4  # wide scores: some exponentials underflow
        vc = torch.randn(2, n_kv, n_ctx, hd, generator=gen)
        q = torch.randn(len(lens), n_kv * grp * hd, generator=gen)
        slots = torch.tensor([i % 2 for i in range(len(lens))], dtype=torch.int32)
        ln = torch.tensor(lens, dtype=torch.int32)

        def attn(q=q, kc=kc, vc=vc, slots=slots, ln=ln, n_head=n_kv * grp, hd=hd):
            return cpu_vnni.attention_decode(q, kc, vc, slots, ln, n_head, hd ** -0.5)

        want = _on("avx512", attn)
        for isa in others:
            assert torch.equal(_on(isa, attn), want), (isa, hd, grp, lens)
    x, w = torch.randn(5, 4096, generator=gen), torch.randn(4096, generator=gen)
    want = _on("avx512", lambda: cpu_vnni.rms_norm(x, w, 1e-5))
    for isa in others:
        assert torch.equal(_on(isa, lambda: cpu_vnni.rms_norm(x, w, 1e-5)), want), isa


def _attention_case(n_slots, n_kv, n_ctx, hd, grp, lens, seed, strided=True):
    gen = torch.Generator().manual_seed(seed)
    n_head = n_kv * grp
    kc = torch.randn(n_slots, n_kv, n_ctx, hd, generator=gen)
    vc = torch.randn(n_slots, n_kv, n_ctx, hd, generator=gen)
    b = len(lens)
    wide = torch.randn(b, n_head * hd + (16 if strided else 0), generator=gen)
    q = wide[:, :n_head * hd]
    slots = torch.tensor([(i * 7 + seed) % n_slots for i in range(b)], dtype=torch.int32)
    ln = torch.tensor(lens, dtype=torch.int32)
    got = cpu_vnni.attention_decode(q, kc, vc, slots, ln, n_head, hd ** -0.5)
    for i in range(b):
        s, L = int(slots[i]), lens[i]
        want = cpu_ops.attention_one(q[i].reshape(n_head, hd), kc[s, :, :L], vc[s, :, :L], hd ** -0.5)
        assert torch.allclose(got[i:i + 1], want, atol=5e-6, rtol=1e-5), (hd, grp, L)


@needs_vnni
@pytest.mark.parametrize("hd,grp", [(16, 1), (16, 16), (256, 1), (256, 2), (64, 16)])
def test_attention_boundary_shapes(hd, grp):
    """head_dim 16 and 256, 1 and 16 query heads per kv head, lengths 1, the 128-key chunk's edges
    (127, 128, 129) and the whole context, the last slot."""
    n_ctx = 260
    _attention_case(3, 2, n_ctx, hd, grp, [1, 127, 128, 129, n_ctx], seed=hd + grp)


@needs_vnni
def test_attention_random_shapes():
    rnd = random.Random(99)
    for i in range(12):
        n_ctx = rnd.randint(1, 300)
        lens = [rnd.randint(1, n_ctx) for _ in range(rnd.randint(1, 5))]
        _attention_case(rnd.randint(1, 4), rnd.randint(1, 3), n_ctx, 16 * rnd.randint(1, 8), rnd.randint(1, 6), lens,
                        seed=i, strided=rnd.random() < 0.5)


@needs_vnni
@pytest.mark.parametrize("window, softcap, with_sinks", [(7, 0.0, False), (130, 0.0, False), (0, 5.0, False),
                                                       (0, 0.0, True), (100, 30.0, True)])
def test_attention_window_softcap_sinks(window, softcap, with_sinks, test_seed):
    """A sliding window (each row's first key: len - window, chunks of 128 from there), soft-capped
    scores and gpt-oss's sinks against ops.attention_masked, the reference, on rows of several lengths
    (before, at and past the window; one chunk and several) and slots, fresh inputs, wide scores."""
    gen = torch.Generator().manual_seed(test_seed)
    n_slots, n_kv, n_ctx, hd, grp = 3, 2, 400, 64, 4
    n_head = n_kv * grp
    kc = torch.randn(n_slots, n_kv, n_ctx, hd, generator=gen) * 2
    vc = torch.randn(n_slots, n_kv, n_ctx, hd, generator=gen)
    lens = [1, 6, 7, 8, 129, 131, 260, 400]
    q = torch.randn(len(lens), n_head * hd, generator=gen)
    slots = torch.tensor([i % n_slots for i in range(len(lens))], dtype=torch.int32)
    ln = torch.tensor(lens, dtype=torch.int32)
    starts = (ln - window).clamp(min=0) if window else None
    sinks = torch.randn(n_head, generator=gen) * 3 if with_sinks else None
    got = cpu_vnni.attention_decode(q, kc, vc, slots, ln, n_head, hd ** -0.5, starts, softcap, sinks)
    for i, L in enumerate(lens):
        s = int(slots[i])
        want = cpu_ops.attention_masked(q[i].view(1, n_head, hd), kc[s, :, :L], vc[s, :, :L], L - 1, hd ** -0.5,
                                        window, softcap, sinks)
        assert torch.allclose(got[i:i + 1], want, atol=5e-6, rtol=1e-5), (L, float((got[i] - want[0]).abs().max()))
    # each row alone gives its bits in the batch
    for i in (0, 5, 7):
        alone = cpu_vnni.attention_decode(q[i:i + 1], kc, vc, slots[i:i + 1], ln[i:i + 1], n_head, hd ** -0.5,
                                          None if starts is None else starts[i:i + 1].contiguous(), softcap,
                                          sinks)
        assert torch.equal(alone, got[i:i + 1])
    with pytest.raises(UnsupportedError, match="each start below its length"):
        cpu_vnni.attention_decode(q[:1], kc, vc, slots[:1], ln[:1], n_head, 0.1, ln[:1].clone())
    with pytest.raises(UnsupportedError, match="soft-cap"):
        cpu_vnni.attention_decode(q[:1], kc, vc, slots[:1], ln[:1], n_head, 0.1, None, float("inf"))


@needs_vnni
def test_attention_of_many_rows_runs_in_bounded_groups(monkeypatch, test_seed):
    """A prompt chunk's rows at deep positions would need a scratch of rows x kv heads x key chunks; past
    ATTN_SCRATCH they go in several calls, each row with the bits it has in one call."""
    gen = torch.Generator().manual_seed(test_seed)
    n_slots, n_kv, n_ctx, hd, n_head = 1, 2, 300, 32, 4
    kc, vc = (torch.randn(n_slots, n_kv, n_ctx, hd, generator=gen) for _ in range(2))
    lens = torch.arange(300 - 80, 300, dtype=torch.int32)  # 80 rows at deep positions
    q = torch.randn(len(lens), n_head * hd, generator=gen)
    slots = torch.zeros(len(lens), dtype=torch.int32)
    whole = cpu_vnni.attention_decode(q, kc, vc, slots, lens, n_head, hd ** -0.5)
    task = 4 * (n_head // n_kv) * (hd + 2)
    assert cpu_vnni._attn_row_groups(lens.tolist(), None, n_kv, task) == [(0, 80)]
    monkeypatch.setattr(cpu_vnni, "ATTN_SCRATCH", 7 * n_kv * 3 * task)  # 10 rows of 2 key chunks, 7 of 3
    groups = cpu_vnni._attn_row_groups(lens.tolist(), None, n_kv, task)
    assert groups[0] == (0, 10) and groups[-1] == (74, 80) and len(groups) == 10
    assert all(a[1] == b[0] for a, b in zip(groups, groups[1:], strict=False))
    assert torch.equal(cpu_vnni.attention_decode(q, kc, vc, slots, lens, n_head, hd ** -0.5), whole)


@needs_vnni
@pytest.mark.parametrize("n_kv,grp", [(1, 2), (1, 7), (2, 7), (3, 3), (1, 16)])
def test_attention_bits_do_not_depend_on_the_threads(n_kv, grp, test_seed):
    """Where a short row has fewer (kv head, key chunk) units than threads, its query heads go to several
    tasks: every head's numbers are the same bits at 1, 3 and 16 threads (16: a split in subgroups of one
    head), with a sliding window, sinks and a soft-cap too, and within the reference's bounds."""
    gen = torch.Generator().manual_seed(test_seed)
    n_slots, n_ctx, hd = 2, 200, 64
    n_head = n_kv * grp
    kc, vc = (torch.randn(n_slots, n_kv, n_ctx, hd, generator=gen) for _ in range(2))
    lens = torch.tensor([37, 129, 200], dtype=torch.int32)[: 1 + test_seed % 3]
    q = torch.randn(len(lens), n_head * hd, generator=gen)
    slots = torch.tensor([1, 0, 1], dtype=torch.int32)[: len(lens)]
    starts = (lens - 50).clamp(min=0)
    sinks = torch.randn(n_head, generator=gen)
    threads = torch.get_num_threads()
    try:
        runs = {}
        for name, kw in (("plain", {}), ("window", {"starts": starts, "sinks": sinks, "softcap": 20.0})):
            outs = []
            for t in (1, 3, 16):
                torch.set_num_threads(t)
                outs.append(cpu_vnni.attention_decode(q, kc, vc, slots, lens, n_head, hd ** -0.5, **kw))
            assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2]), name
            runs[name] = outs[2]
        for i in range(len(lens)):
            s, L = int(slots[i]), int(lens[i])
            want = cpu_ops.attention_one(q[i].reshape(n_head, hd), kc[s, :, :L], vc[s, :, :L], hd ** -0.5)
            assert torch.allclose(runs["plain"][i:i + 1], want, atol=5e-6, rtol=1e-5), (n_kv, grp, L)
    finally:
        torch.set_num_threads(threads)


@needs_vnni
def test_attention_refuses_slots_and_lengths_outside_the_cache():
    kc = torch.randn(2, 1, 8, 16)
    q = torch.randn(1, 16)
    for slot, length in ((2, 1), (-1, 1), (0, 9), (0, 0), (0, -5)):
        with pytest.raises(UnsupportedError, match="every slot in 0..1 and length in 1..8"):
            cpu_vnni.attention_decode(q, kc, kc, torch.tensor([slot], dtype=torch.int32),
                                      torch.tensor([length], dtype=torch.int32), 1, 0.25)
    with pytest.raises(UnsupportedError, match="int32 slots/lens"):
        cpu_vnni.attention_decode(q, kc, kc, torch.tensor([0]), torch.tensor([1]), 1, 0.25)
    with pytest.raises(UnsupportedError, match="head_dim 8"):
        cpu_vnni.attention_decode(torch.randn(1, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8),
                                  torch.tensor([0], dtype=torch.int32), torch.tensor([1], dtype=torch.int32), 1, 0.3)


@needs_vnni
@pytest.mark.parametrize("m,d", [(1, 16), (3, 48), (7, 4096), (0, 16), (2, 24), (3, 1), (1, 4099)])
def test_rms_norm_shapes(m, d):
    """Rows of whole 16-lane vectors and rows with a tail (24, 1, 4099 values), against float64; a row with a
    tail keeps its vectors' bits (the first 16 values of a 24-wide row are normed by the same lanes)."""
    x, w = torch.randn(m, d), torch.randn(d)
    got = cpu_vnni.rms_norm(x, w, 1e-5)
    want = x.double() / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    assert torch.allclose(got.double(), want, atol=1e-5, rtol=1e-5)
    with pytest.raises(UnsupportedError, match="rows of at least one value"):
        cpu_vnni.rms_norm(torch.randn(2, 0), torch.randn(0), 1e-5)
    with pytest.raises(UnsupportedError, match="group"):
        cpu_vnni.rms_norm(torch.randn(2, 24), torch.randn(16), 1e-5, group=16)


# ---------------------------------------------------------------- kernels/wgpu/replay.c
SET_PIPELINE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
SET_GROUP = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t,
                             ctypes.POINTER(ctypes.c_uint32))
DISPATCH = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32)


def _replay_library():
    from minfer.kernels.wgpu import device as wgpu_device

    so = wgpu_device._replay_library()
    if so is None:
        pytest.fail("kernels/wgpu/replay.c did not build (a C compiler is part of the test setup)")
    return so


@pytest.mark.parametrize("n", [0, 1, 2, 397, 1000])
def test_replay_encoder_calls_in_order(n):
    """Each dispatch: its pipeline when it changes, its bind group with its one offset, its grid;
    recorded through C callbacks standing in for wgpu-native's entry points."""
    so = _replay_library()
    rnd = random.Random(n)
    pipes = [rnd.choice([0x1000, 0x2000, 0x3000]) for _ in range(n)]
    groups = [0x9000 + i for i in range(n)]
    offsets = [rnd.randrange(0, 1 << 32, 256) for _ in range(n)]
    grid = [rnd.randint(1, 65535) for _ in range(3 * n)]
    calls: list[tuple] = []
    cbs = (SET_PIPELINE(lambda p, pipe: calls.append(("pipe", p, pipe))),
           SET_GROUP(lambda p, idx, g, k, off: calls.append(("group", p, idx, g, k, off[0]))),
           DISPATCH(lambda p, x, y, z: calls.append(("dispatch", p, x, y, z))))
    arr = (ctypes.c_void_p * max(n, 1))
    so.minfer_replay(ctypes.c_void_p(0x77), n, arr(*pipes), arr(*groups), (ctypes.c_uint32 * max(n, 1))(*offsets),
                     (ctypes.c_uint32 * max(3 * n, 1))(*grid), *[ctypes.cast(c, ctypes.c_void_p) for c in cbs])
    want, last = [], None
    for i in range(n):
        if pipes[i] != last:
            want.append(("pipe", 0x77, pipes[i]))
            last = pipes[i]
        want.append(("group", 0x77, 0, groups[i], 1, offsets[i]))
        want.append(("dispatch", 0x77, *grid[3 * i:3 * i + 3]))
    assert calls == want


def test_types_table_covers_the_kernel():
    """The packers' types, as the C file numbers them (ggml's ids), with their block sizes."""
    ids = {**cpu_vnni.TYPES, **cpu_vnni.TYPES5, **cpu_vnni.TYPES6, **cpu_vnni.TYPES8, **cpu_vnni.LUT_TYPES}
    assert set(ids) == set(cpu_vnni.ALL_TYPES)
    assert {t: ids.get(t) for t in TYPES} == {t: int(t) for t in TYPES}
    assert all(quant_info(t).block_elems == (256 if t in K_TYPES else 32) for t in TYPES)


@needs_vnni
def test_argmax_rows_is_torch_argmax(test_seed):
    """The greedy pick in C (argmax_rows) against torch.argmax: random rows of widths around the 16-lane
    vectors and a vocabulary's, ties (the first index wins), a NaN (the first NaN wins), +inf / -inf, all
    -inf, strided rows, a single row with an odd stride; rows of its own output never read back."""
    gen = torch.Generator().manual_seed(test_seed)
    for n in (1, 15, 16, 17, 33, 1000, 49152, 151936):
        x = torch.randn(6, n, generator=gen)
        if n > 3:
            x[1, n // 2] = x[1, n // 3] = x[1].max() + 1  # a tie: the earlier wins
            x[2, n - 1] = float("nan")
            x[2, n // 2] = float("nan")
            x[3, n // 3] = float("inf")
            x[4, -1] = float("-inf")
        x[5] = float("-inf")
        assert cpu_vnni.argmax_rows(x).tolist() == torch.argmax(x, dim=-1).tolist(), n
        wide = torch.randn(3, n + 7, generator=gen)[:, 3:3 + n]  # rows strided
        assert cpu_vnni.argmax_rows(wide).tolist() == torch.argmax(wide, dim=-1).tolist(), n
        one = torch.randn(n, 2, generator=gen)[:, 1].unsqueeze(0).contiguous()
        assert cpu_vnni.argmax_rows(one).tolist() == torch.argmax(one, dim=-1).tolist()
    assert cpu_vnni.argmax_rows(torch.empty(0, 5)).tolist() == []
    with pytest.raises(UnsupportedError, match="argmax_rows"):
        cpu_vnni.argmax_rows(torch.randn(3, 5, dtype=torch.float64))


EMBED_BLOCK_TYPES = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0)


def _embed_table(qtype: GGMLType, n_rows: int, width: int, seed: int) -> torch.Tensor:
    """uint8 [n_rows, row_bytes] of random rows: random codes, float16 scales of both signs (a zero code then
    decodes to a signed zero), mins where the type has them; float rows of normal values."""
    if qtype == GGMLType.BF16:
        vals = torch.randn(n_rows, width, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
        return vals.view(torch.uint8).reshape(n_rows, -1).contiguous()
    rng = np.random.default_rng(seed)
    info = quant_info(qtype)
    blocks = random_blocks(rng, qtype, n_rows * width // info.block_elems)
    if qtype in EMBED_BLOCK_TYPES:
        signs = rng.random(blocks.shape[0]) < 0.5
        blocks[signs, 1] |= 0x80  # the scale's sign bit (float16, little-endian: byte 1)
    return torch.from_numpy(np.ascontiguousarray(blocks)).reshape(n_rows, -1).contiguous()


@needs_vnni
@pytest.mark.parametrize("qtype", sorted(cpu_vnni.EMBED_TYPES, key=int))
def test_embed_rows_are_the_references_bits(qtype, test_seed):
    """A token embedding's rows in C (embed_rows) against quant/reference.py's dequantize, bit for bit (signed
    zeros too): fresh random rows of every type it takes, ids repeated, first and last, into a poisoned output;
    widths of one block and of a model's; typed errors for an id outside the rows, a row size of another width,
    a type it does not take."""
    for width in (32, 576):
        n_rows = 37
        raw = _embed_table(qtype, n_rows, width, test_seed + width)
        ids = torch.tensor([n_rows - 1, 0, 5, 5, 17], dtype=torch.int32)
        out = torch.full((len(ids), width), float("nan"))
        got = cpu_vnni.embed_rows(raw, qtype, ids, width, out=out)
        want = dequantize(raw.index_select(0, ids.long()), qtype, (len(ids), width))
        assert got is out
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (qtype.name, width)
        assert torch.equal(cpu_vnni.embed_rows(raw, qtype, ids.long(), width), want)  # (int64 ids, a new tensor)
    with pytest.raises(IndexError, match="row 37 outside 0..36"):
        cpu_vnni.embed_rows(raw, qtype, torch.tensor([1, 37]), width)
    with pytest.raises(IndexError, match="row -1"):
        cpu_vnni.embed_rows(raw, qtype, torch.tensor([-1]), width)
    with pytest.raises(UnsupportedError, match="whole rows of 544"):
        cpu_vnni.embed_rows(raw, qtype, torch.tensor([0]), 544)
    with pytest.raises(UnsupportedError, match="Q4_K is not one of"):
        cpu_vnni.embed_rows(raw, GGMLType.Q4_K, torch.tensor([0]), width)
