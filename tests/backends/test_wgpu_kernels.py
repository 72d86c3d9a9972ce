"""The WGSL kernels' launch variants (what bench/studies/vulkan_sweep.py times on a GPU) against the
reference, on whatever Vulkan adapter wgpu finds (lavapipe in CI): the context-split attention at
several head sizes and split counts, every GEMV variant of the sweep, both reduction paths.
"""

from __future__ import annotations

import math

import pytest
import torch


@pytest.fixture(scope="module", params=[True, False], ids=["subgroups", "shared"])
def dev(request):
    from minfer.contracts.registry import default_registry
    from minfer.kernels.wgpu.device import Device, adapters

    default_registry()  # (triton before a lavapipe device: wgpu/device.py)
    if not adapters("Vulkan"):
        pytest.fail("wgpu finds no Vulkan adapter (no GPU: apt-get install mesa-vulkan-drivers)")
    d = Device("vulkan", subgroups=request.param)
    if request.param and not d.subgroups:
        pytest.skip("the adapter has no subgroups")
    return d


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


Q8_TOL = {0: 1e-5, 1: 2e-2, 2: 2e-4}  # by qmv8's activation passes (0: f32 x); vk_qmatvec_q4_0's contract: 2e-4


def _records(rec: torch.Tensor, rows: int, k: int, passes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x's int8 records (q8_act.wgsl) read back: (codes [rows, k] as int64, combined over the passes
    as 254 q1 + q2; d [rows, k / 32]; s [rows, k / 32])."""
    nb, rv = k // 32, 2 * passes + 1
    words = rec.view(torch.uint8).view(rows, rv, nb, 16).transpose(1, 2)  # planes: word w of block b at w * nb + b
    q1 = words[:, :, :2].reshape(rows, nb, 32).view(torch.int8).long()
    codes = q1 if passes == 1 else 254 * q1 + words[:, :, 2:4].reshape(rows, nb, 32).view(torch.int8).long()
    ds = words[:, :, 2 * passes, :8].reshape(rows, nb, 8).contiguous().view(torch.float32)
    return codes.reshape(rows, k), ds[..., 0], ds[..., 1]

def _ref_attention(q, ck, cv, slots, pos, n_head, n_kv, hd, scale):
    rows = q.shape[0]
    out = torch.zeros(rows, n_head * hd, dtype=torch.float64)
    for r in range(rows):
        for h in range(n_head):
            kvh = h // (n_head // n_kv)
            keys = ck[0, slots[r], kvh, :pos[r] + 1].double()
            vals = cv[0, slots[r], kvh, :pos[r] + 1].double()
            w = torch.softmax(keys @ q[r, h * hd:(h + 1) * hd].double() * scale, 0)
            out[r, h * hd:(h + 1) * hd] = w @ vals
    return out


@pytest.mark.parametrize("hd, n_head, n_kv, ctx, cfg", [
    (64, 6, 2, 300, {"CH": 64, "MAX_SPLIT": 32}),   # 5 chunks of 64, TK 16: 8 key groups per workgroup
    (128, 4, 1, 200, {"CH": 16, "MAX_SPLIT": 8}),   # MAX_SPLIT caps the chunks: 8 of 25, TK 32
    (96, 3, 3, 70, {"CH": 32, "MAX_SPLIT": 32}),    # TK 32 with 8 idle lanes, no GQA
    (256, 4, 1, 300, {"CH": 64, "MAX_SPLIT": 32}),  # gemma's: TK 32 (one NVIDIA subgroup a key), 2 quads a lane
    (192, 2, 1, 100, {"CH": 32, "MAX_SPLIT": 32}),  # TK 32, the second quads half idle
])
def test_the_context_split_attention_matches_the_reference(dev, monkeypatch, hd, n_head, n_kv, ctx, cfg):
    from minfer.kernels.wgsl import attention as vk_attention

    monkeypatch.setattr(dev, "attn", {**vk_attention.ATTN, **cfg, "split": True})  # the device's variant
    gen = torch.Generator().manual_seed(hd + ctx)
    slots_n, rows = 2, 4
    ck = torch.randn(1, slots_n, n_kv, ctx, hd, generator=gen)
    cv = torch.randn(1, slots_n, n_kv, ctx, hd, generator=gen)
    pos = [ctx - 1, 0, ctx // 2, min(ctx - 1, 64)]  # the last, the first, and chunk edges
    slots = [0, 1, 1, 0]
    q = torch.randn(rows, n_head * hd, generator=gen)
    k = torch.randn(rows, n_kv * hd, generator=gen)
    v = torch.randn(rows, n_kv * hd, generator=gen)
    for r in range(rows):  # the kernel writes each row's k, v first: the reference sees them too
        ck[0, slots[r], :, pos[r]] = k[r].view(n_kv, hd)
        cv[0, slots[r], :, pos[r]] = v[r].view(n_kv, hd)
    scale = 1 / math.sqrt(hd)
    want = _ref_attention(q, ck, cv, slots, pos, n_head, n_kv, hd, scale)
    up = dev.upload
    i32 = torch.int32
    got = vk_attention.attention(q=up(q), k=up(k), v=up(v), cache_k=up(ck), cache_v=up(cv),
                             row_slots=up(torch.tensor(slots, dtype=i32)), positions=up(torch.tensor(pos, dtype=i32)),
                             layer=0, n_head=n_head, n_head_kv=n_kv, head_dim=hd, scale=scale).cpu()
    assert _rel(got, want) < 1e-5
    monkeypatch.setattr(vk_attention, "ATTN", {**vk_attention.ATTN, "split": False})  # the single-pass kernel agrees
    single = vk_attention.attention(q=up(q), k=up(k), v=up(v), cache_k=up(ck), cache_v=up(cv),
                                row_slots=up(torch.tensor(slots, dtype=i32)),
                                positions=up(torch.tensor(pos, dtype=i32)),
                                layer=0, n_head=n_head, n_head_kv=n_kv, head_dim=hd, scale=scale).cpu()
    assert _rel(single, want) < 1e-5


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "Q4_K"])
def test_every_gemv_variant_of_the_sweep_matches_the_reference(dev, monkeypatch, qtype):
    """Each launch variant bench/studies/vulkan_sweep.py times (vk_matmul.GEMV_VARIANTS), at an odd column
    count (a last workgroup part empty) and an odd block count (Q4_0 / Q8_0 rows 2 bytes off 4:
    the unaligned word path): the GEMV and the tiled matmul against float64 math, and a row of the
    tiled matmul bit-equal to the GEMV of that row alone (the batch invariance the backend needs)."""
    from minfer.contracts.harness import random_blocks
    from minfer.kernels.wgsl import matmul as vk_matmul
    from minfer.quant.reference import dequantize
    from minfer.quant.types import by_name

    q = by_name(qtype)
    base = dict(vk_matmul.GEMV)
    # 45 blocks: the loads-first chunks and the guarded rest; 601 blocks (32-element types): KIT's
    # doubled TPR (a long row, like the 7B down projection's 592)
    for n_blocks in (45, 601) if q.block_elems == 32 else (3,):
        n, k = 37, q.block_elems * n_blocks
        gen = torch.Generator().manual_seed(11)
        x, raw = torch.randn(3, k, generator=gen), random_blocks(q, n, k, gen)
        want = x.double() @ dequantize(raw, q.type, (n, k)).double().T
        xd, wd, x1 = dev.upload(x), dev.upload(raw), dev.upload(x[1:2])
        # the wide rows' lanes at n 37: the default's TPR4W 16 and the TPR4W 8 variant
        wide = [v + ",WIDE=32" for v in vk_matmul.GEMV_VARIANTS if "P8=2,U8=1,WIDE=16384" in v]
        for v in vk_matmul.GEMV_VARIANTS + wide:
            cfg = vk_matmul.parse_variant(v, base)
            monkeypatch.setattr(dev, "gemv", cfg)
            one = vk_matmul.qmatvec(x=x1, w=wd, n=n, k=k, qtype=q.type).cpu()
            many = vk_matmul.qmatmul_tiled(x=xd, w=wd, n=n, k=k, qtype=q.type).cpu()
            tol = Q8_TOL[vk_matmul.variant_passes(cfg)] if q.type in vk_matmul.QMV8_TYPES else 1e-5
            assert _rel(one, want[1:2]) < tol, (v, k)
            assert _rel(many, want) < tol, (v, k)
            assert torch.equal(one[0], many[1]), (v, k)
            if "LF=1" in v:  # loads-first changes no bit
                monkeypatch.setattr(dev, "gemv", vk_matmul.parse_variant(v.replace("LF=1", "LF=0"), base))
                assert torch.equal(vk_matmul.qmatvec(x=x1, w=wd, n=n, k=k, qtype=q.type).cpu(), one), (v, k)
            if "qmv4" in v and "MIN_GROUPS" not in v:  # 37 rows: NR halves to 1 above; unhalved, no bit changes
                monkeypatch.setattr(dev, "gemv", vk_matmul.parse_variant(v + ",MIN_GROUPS=1", base))
                assert torch.equal(vk_matmul.qmatvec(x=x1, w=wd, n=n, k=k, qtype=q.type).cpu(), one), (v, k)
                assert torch.equal(vk_matmul.qmatmul_tiled(x=xd, w=wd, n=n, k=k, qtype=q.type).cpu(), many), (v, k)


@pytest.mark.parametrize("passes", [1, 2])
def test_x_quantized_to_int8_records(dev, passes):
    """quantize_q8_1 (q8_act.wgsl): per 32-block codes within [-127, 127], x within half a unit of
    d * codes (one pass: d = max|x| / 127; two: the first pass's error quantized again, d / 254),
    s = d * sum(codes); a row-strided x; an all-zero block gives zeros."""
    from minfer.kernels.wgsl import quantize as vk_quantize

    gen = torch.Generator().manual_seed(7 + passes)
    rows, k = 3, 32 * 9
    wide = torch.randn(rows, k + 5, generator=gen) * torch.logspace(-3, 2, k + 5)
    wide[1, 1 + 32:1 + 64] = 0.0
    rec = vk_quantize.quantize_q8_1(x=dev.upload(wide).cols(1, k + 1), passes=passes).cpu()
    codes, d, s = _records(rec, rows, k, passes)
    x = wide[:, 1:k + 1].double()
    amax = x.view(rows, -1, 32).abs().amax(-1)
    q1 = codes if passes == 1 else torch.div(codes + 127 * 254 + 127, 254, rounding_mode="floor") - 127
    assert int(q1.abs().max()) <= 127
    torch.testing.assert_close(d.double(), amax / (127 if passes == 1 else 127 * 254), rtol=1e-6, atol=0)
    err = (x.view(rows, -1, 32) - d.double()[..., None] * codes.view(rows, -1, 32).double()).abs()
    assert bool((err <= d.double()[..., None] * 0.5001 + 1e-30).all())
    torch.testing.assert_close(s.double(), d.double() * codes.view(rows, -1, 32).sum(-1).double(), rtol=1e-6, atol=0)
    assert int(codes[1, 32:64].abs().sum()) == 0 and float(d[1, 1]) == 0.0


def test_the_fused_producers_write_the_records_quantize_q8_1_writes(dev):
    """rms_norm / swiglu / attention with q8 (what the backend asks of the nodes feeding a qmv8
    GEMV): their f32 output bit-equal to the plain kernel's, their records bit-equal to
    quantize_q8_1 of that output; rows longer than one workgroup's 4 WG elements, with a tail."""
    from minfer.kernels.wgsl import attention as vk_attention
    from minfer.kernels.wgsl import elementwise as vk_elementwise
    from minfer.kernels.wgsl import norm as vk_norm
    from minfer.kernels.wgsl import quantize as vk_quantize

    gen = torch.Generator().manual_seed(21)
    up, i32 = dev.upload, torch.int32
    # 4 NORM_WG = 1024 elements a workgroup, 16 NORM_WG = 4096 a round of the sum of squares: 2 rounds, a tail
    x, w = torch.randn(3, 4160, generator=gen), torch.randn(4160, generator=gen)
    plain = vk_norm.rms_norm(x=up(x), w=up(w), eps=1e-5).cpu()
    rec = vk_quantize.q8_records(dev, 3, 4160, 2)
    got = vk_norm.rms_norm(x=up(x), w=up(w), eps=1e-5, q8=rec)
    assert torch.equal(got.cpu(), plain)
    assert torch.equal(rec.cpu(), vk_quantize.quantize_q8_1(x=got, passes=2).cpu())
    g, u = torch.randn(2, 2 * 544, generator=gen), torch.randn(2, 544, generator=gen)  # 4 WG = 256 a workgroup
    gd = up(g)
    plain = vk_elementwise.swiglu(gate=gd.cols(0, 544), up=up(u)).cpu()
    rec = vk_quantize.q8_records(dev, 2, 544, 1)
    got = vk_elementwise.swiglu(gate=gd.cols(0, 544), up=up(u), q8=rec)
    assert torch.equal(got.cpu(), plain)
    assert torch.equal(rec.cpu(), vk_quantize.quantize_q8_1(x=got, passes=1).cpu())
    hd, nh, nkv, ctx = 64, 4, 2, 40
    ck, cv = up(torch.randn(1, 1, nkv, ctx, hd, generator=gen)), up(torch.randn(1, 1, nkv, ctx, hd, generator=gen))
    q, k, v = (up(torch.randn(2, n * hd, generator=gen)) for n in (nh, nkv, nkv))
    kw = dict(q=q, k=k, v=v, cache_k=ck, cache_v=cv, row_slots=up(torch.zeros(2, dtype=i32)),
              positions=up(torch.tensor([30, 39], dtype=i32)), layer=0, n_head=nh, n_head_kv=nkv, head_dim=hd,
              scale=0.125)
    plain = vk_attention.attention(**kw).cpu()
    rec = vk_quantize.q8_records(dev, 2, nh * hd, 2)
    got = vk_attention.attention(**kw, q8=rec)
    assert torch.equal(got.cpu(), plain)
    assert torch.equal(rec.cpu(), vk_quantize.quantize_q8_1(x=got, passes=2).cpu())


def _at_offset(dev, t: torch.Tensor, off: int):
    """t on the device at element `off` of its buffer (garbage before it): a contiguous view with a start offset."""
    flat = torch.cat([torch.full((off,), 1e30), t.reshape(-1)])
    return dev.upload(flat).cols(off, off + t.numel()).view(*t.shape)


# 4160: over 4 NORM_WG = 1024-element workgroups a row (the q8 forms: 5, each summing the whole row's squares)
# and 2 rounds of the sum of squares with a tail; 96: one workgroup, mostly idle; 37: no 32-blocks (q8 ignored)
@pytest.mark.parametrize("d", [4160, 96, 37])
def test_the_fused_add_norm_is_add_then_rms_norm_bit_for_bit(dev, d):
    """add_rms_norm (one dispatch in the backend for each residual add and the norm after it), on
    fresh random inputs at start offsets into NaN-poisoned outputs: h bit-equal to `add`'s, out to
    `rms_norm`'s of that h, and with q8 the records bit-equal to rms_norm's q8 form and to
    quantize_q8_1 of out; both reduction paths (the dev fixture)."""
    from minfer.kernels.wgsl import elementwise as vk_elementwise
    from minfer.kernels.wgsl import norm as vk_norm
    from minfer.kernels.wgsl import quantize as vk_quantize

    gen = torch.Generator()
    gen.seed()  # fresh inputs every run
    rows = 3
    x, y = torch.randn(rows, d, generator=gen) * 3, torch.randn(rows, d, generator=gen)
    w = torch.randn(d, generator=gen)
    xd, yd, wd = _at_offset(dev, x, 7), _at_offset(dev, y, 5), dev.upload(w)
    h = vk_elementwise.add(x=xd, y=yd)
    plain = vk_norm.rms_norm(x=h, w=wd, eps=1e-5).cpu()
    assert torch.equal(h.cpu(), x + y)  # (torch's f32 add: one rounding, as the kernel's)
    for q8 in (0, 1, 2) if d % 32 == 0 else (0,):  # (records need whole 32-blocks)
        out, hs = (dev.upload(torch.full((rows, d), float("nan"))) for _ in range(2))
        rec = vk_quantize.q8_records(dev, rows, d, q8) if q8 else None
        got = vk_norm.add_rms_norm(x=xd, y=yd, w=wd, eps=1e-5, out=out, sum_out=hs, q8=rec)
        assert got is out and torch.equal(hs.cpu(), h.cpu()) and torch.equal(out.cpu(), plain), q8
        if q8:
            alone = vk_quantize.q8_records(dev, rows, d, q8)
            vk_norm.rms_norm(x=h, w=wd, eps=1e-5, q8=alone)
            assert torch.equal(rec.cpu(), alone.cpu())
            assert torch.equal(rec.cpu(), vk_quantize.quantize_q8_1(x=out, passes=q8).cpu())
    # host tensors (the default device): h copied back into sum_out=, which may then be x itself (uploaded twice)
    xh = x.clone()
    want = vk_norm.rms_norm(x=vk_elementwise.add(x=x, y=y), w=w, eps=1e-5)
    assert torch.equal(vk_norm.add_rms_norm(x=xh, y=y, w=w, eps=1e-5, sum_out=xh), want)
    assert torch.equal(xh, x + y)


def test_the_fused_add_norm_refuses_what_it_cannot_do(dev):
    from minfer.errors import UnsupportedError
    from minfer.kernels.wgsl import norm as vk_norm

    x, y, w = dev.upload(torch.randn(2, 64)), dev.upload(torch.randn(2, 64)), dev.upload(torch.randn(64))
    with pytest.raises(UnsupportedError, match="buffers of their own"):  # h over x: another workgroup may read x
        vk_norm.add_rms_norm(x=x, y=y, w=w, eps=1e-5, sum_out=x)
    with pytest.raises(UnsupportedError, match="buffers of their own"):
        vk_norm.add_rms_norm(x=x, y=y, w=w, eps=1e-5, out=y)
    with pytest.raises(UnsupportedError, match="contiguous"):
        vk_norm.add_rms_norm(x=dev.upload(torch.randn(2, 70)).cols(3, 67), y=y, w=w, eps=1e-5)
    with pytest.raises(UnsupportedError, match="must both be"):
        vk_norm.add_rms_norm(x=x, y=dev.upload(torch.randn(2, 32)), w=w, eps=1e-5)
    with pytest.raises(UnsupportedError, match="eps"):
        vk_norm.add_rms_norm(x=x, y=y, w=w, eps=-1.0)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
@pytest.mark.parametrize("passes", [1, 2])
def test_the_int8_gemv_is_the_integer_math_on_its_records(dev, monkeypatch, qtype, passes):
    """qmv8 on fresh random inputs into poisoned outputs: against float64 math on the dequantized
    weight and the records it read (codes and scales read back: what the int8 dots must give, to
    f32 rounding), and against the exact x within the passes' tolerance."""
    from minfer.contracts.harness import random_blocks
    from minfer.kernels.wgsl import matmul as vk_matmul
    from minfer.kernels.wgsl import quantize as vk_quantize
    from minfer.quant.reference import dequantize
    from minfer.quant.types import by_name

    q = by_name(qtype)
    monkeypatch.setattr(dev, "gemv", vk_matmul.parse_variant(f"kernel=qmv8,P8={passes}", vk_matmul.GEMV))
    gen = torch.Generator()
    gen.seed()  # fresh inputs every run
    n, k, m = 53, 32 * 77, 3
    x, raw = torch.randn(m, k, generator=gen), random_blocks(q, n, k, gen)
    w = dequantize(raw, q.type, (n, k)).double()
    xd, wd = dev.upload(x), dev.upload(raw)
    rec = vk_quantize.quantize_q8_1(x=xd, passes=passes)
    codes, d, _ = _records(rec.cpu(), m, k, passes)
    x_q = (codes.view(m, -1, 32).double() * d.double()[..., None]).view(m, k)
    for launch, rows in ((vk_matmul.qmatvec, 1), (vk_matmul.qmatmul_tiled, m)):
        out = dev.upload(torch.full((rows, n), float("nan")))
        got = launch(x=xd.rows(rows) if rows < m else xd, w=wd, n=n, k=k, qtype=q.type, out=out).cpu()
        assert not got.isnan().any()
        assert _rel(got, x_q[:rows] @ w.T) < 2e-6, launch.__name__
        assert _rel(got, x[:rows].double() @ w.T) < Q8_TOL[passes], launch.__name__


def test_kernels_compile_without_runtime_checks_and_agree_with_them(dev, monkeypatch):
    """The kernels are compiled without naga's runtime checks (loop bounding, index clamps: run 44
    measured the 7B decode step 3.83 -> 2.90 ms on the H200) through wgpu-native's trusted-module
    entry, which this wgpu has; MINFER_WGPU_CHECKS=1 compiles them checked. Both give the same
    bits: the int8 GEMV (loops, a local array) and the split attention's merge path."""
    from wgpu.backends.wgpu_native._ffi import lib

    from minfer.contracts.harness import random_blocks
    from minfer.kernels.wgsl import matmul as vk_matmul
    from minfer.quant.types import by_name

    assert hasattr(lib, "wgpuDeviceCreateShaderModuleTrusted")
    monkeypatch.setattr(dev, "gemv", vk_matmul.parse_variant("kernel=qmv8,P8=2", vk_matmul.GEMV))
    gen = torch.Generator()
    gen.seed()
    n, k, m = 37, 32 * 41, 3
    xd, wd = dev.upload(torch.randn(m, k, generator=gen)), dev.upload(random_blocks(by_name("Q4_0"), n, k, gen))
    got = {}
    for checks in (False, True):  # (Device(checks=...): EngineConfig.wgpu_checks, MINFER_WGPU_CHECKS)
        monkeypatch.setattr(dev, "checks", checks)
        got[checks] = vk_matmul.qmatmul_tiled(x=xd, w=wd, n=n, k=k, qtype=by_name("Q4_0").type).cpu()
    assert torch.equal(got[False], got[True]) and got[False].abs().sum() > 0


def test_the_q8_switch_gives_the_f32_kernel_back(monkeypatch):
    """MINFER_VK_Q8=0 (EngineConfig.vk_q8): the Q4_0 / Q4_1 matmuls on f32 activations, at run
    35's NR unless MINFER_VK_GEMV (vk_gemv) names one."""
    from minfer.config import EngineConfig
    from minfer.kernels.wgsl import matmul as vk_matmul

    c = EngineConfig.from_env(device="vulkan")
    assert vk_matmul.variant_passes(vk_matmul.gemv_variant(c.vk_gemv, c.vk_q8)) == 2
    monkeypatch.setenv("MINFER_VK_Q8", "0")
    c = EngineConfig.from_env(device="vulkan")
    cfg = vk_matmul.gemv_variant(c.vk_gemv, c.vk_q8)
    assert cfg["kernel"] == "qmv4" and vk_matmul.variant_passes(cfg) == 0 and cfg["NR"] == vk_matmul.QMV4_NR
    monkeypatch.setenv("MINFER_VK_GEMV", "NR=2")  # a named NR stays
    c = EngineConfig.from_env(device="vulkan")
    assert vk_matmul.gemv_variant(c.vk_gemv, c.vk_q8)["NR"] == 2


def test_head_dims_past_128_run_the_split_kernel_only(dev, monkeypatch):
    """The single-pass kernel gave wrong results at head_dim 256 on NVIDIA's driver (H200 run 37; right
    on lavapipe): past 128 only the split kernel runs (its key sums kept within one 32-lane subgroup),
    and where it cannot (the split variant off) the call is a typed error; past 256 always."""
    from minfer.errors import UnsupportedError
    from minfer.kernels.wgsl import attention as vk_attention

    up, i32 = dev.upload, torch.int32

    def call(hd):
        cache = up(torch.zeros(1, 1, 1, 8, hd))
        return vk_attention.attention(q=up(torch.zeros(1, hd)), k=up(torch.zeros(1, hd)), v=up(torch.zeros(1, hd)),
                                      cache_k=cache, cache_v=cache, row_slots=up(torch.zeros(1, dtype=i32)),
                                      positions=up(torch.zeros(1, dtype=i32)), layer=0, n_head=1, n_head_kv=1,
                                      head_dim=hd, scale=0.0625)

    with pytest.raises(UnsupportedError, match="head_dim 260 > 256"):
        call(260)
    monkeypatch.setattr(dev, "attn", {**vk_attention.ATTN, "split": False})
    with pytest.raises(UnsupportedError, match="head_dim 256 > 128 runs the split kernel only"):
        call(256)


def test_kit_doubles_the_lanes_of_a_long_row():
    from minfer.kernels.wgsl import matmul as vk_matmul

    g = vk_matmul.parse_variant("WG=128,TPR=32,KIT=24", vk_matmul.GEMV)
    assert vk_matmul.qmv_lanes(g, 3584) == 32 and vk_matmul.qmv_lanes(g, 18944) == 128
    assert vk_matmul.qmv_lanes(vk_matmul.parse_variant("WG=64,TPR=32,KIT=24", g), 18944) == 64
    assert vk_matmul.qmv_lanes(vk_matmul.parse_variant("KIT=0", g), 18944) == 32


def test_kit4_doubles_the_lanes_of_a_long_row():
    from minfer.kernels.wgsl import matmul as vk_matmul

    g = vk_matmul.parse_variant("kernel=qmv4,WG=128,TPR4=32,KIT4=8", vk_matmul.GEMV)
    assert vk_matmul.qmv4_lanes(g, 3584) == 32 and vk_matmul.qmv4_lanes(g, 18944) == 128
    assert vk_matmul.qmv4_lanes(vk_matmul.parse_variant("KIT4=0", g), 18944) == 32
    assert vk_matmul.qmv4_lanes(g, 3584, 152064) == 32  # qmv4: no wide rows


def test_qmv8_takes_fewer_lanes_on_wide_rows():
    """The default: TPR4W 16 lanes a row group where n >= WIDE (7B gate_up, vocab), TPR4 32 elsewhere;
    KIT4W doubles the wide rows' lanes as KIT4 the others'."""
    from minfer.kernels.wgsl import matmul as vk_matmul

    g = vk_matmul.parse_variant("", vk_matmul.GEMV)
    assert g["kernel"] == "qmv8" and g["WIDE"] == 16384
    assert [vk_matmul.qmv4_lanes(g, k, n) for n, k in ((4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944),
                                                      (152064, 3584))] == [32, 32, 16, 128, 16]
    assert vk_matmul.qmv4_lanes(vk_matmul.parse_variant("TPR4W=8", g), 3584, 37888) == 16  # 14 blocks > KIT4W 8
    assert vk_matmul.qmv4_lanes(vk_matmul.parse_variant("TPR4W=8,KIT4W=16", g), 3584, 37888) == 8
    assert vk_matmul.qmv4_lanes(vk_matmul.parse_variant("WIDE=0", g), 3584, 37888) == 32


def test_the_q4_0_planes_hold_the_blocks():
    """repack_q4_0.wgsl: block i's quant bytes at 16 i of the quant plane, its f16 scale the half
    i & 1 of scale word i / 2 after the plane (an odd block count: the last word half empty)."""
    from minfer.contracts.harness import random_blocks
    from minfer.kernels.wgpu.device import default_device
    from minfer.kernels.wgsl import matmul as vk_matmul
    from minfer.quant.types import by_name

    dev, n, k = default_device(), 3, 32 * 7
    raw = random_blocks(by_name("Q4_0"), n, k, torch.Generator().manual_seed(3))
    got = dev.download(vk_matmul.q4_0_planes(dev.upload(raw), n, k)).view(torch.uint8)
    blocks = raw.reshape(-1, 18)
    nblk = blocks.shape[0]
    assert got.numel() == vk_matmul.planes_bytes(nblk) and got.numel() % 16 == 0
    assert torch.equal(got[:16 * nblk].view(nblk, 16), blocks[:, 2:])
    assert torch.equal(got[16 * nblk:16 * nblk + 2 * nblk].view(nblk, 2), blocks[:, :2])


def test_argmax_over_many_workgroups_keeps_the_first_of_equal_values(dev):
    """argmax.wgsl + argmax_merge.wgsl (a row over many workgroups of 1024 elements, then a merge)
    and the one-workgroup row: torch.argmax's answer (the first of equal maxima) on rows with ties
    inside an invocation, across invocations and across workgroups, a constant row, -inf, a
    row-strided x with an offset."""
    from minfer.kernels.wgsl import select as vk_select

    gen = torch.Generator().manual_seed(5)
    for width in (5000, 1000, 3):
        wide = torch.randn(5, width + 3, generator=gen)
        x = wide[:, 2:width + 2]
        if width >= 1000:
            x[0, [100, 999 % width, width - 1]] = 10.0  # across workgroups (5000) or invocations
            x[1, [2, 258]] = 9.0  # one invocation's elements 0 and 1 (lid 2)
            x[1, [5, 6]] = 9.0
        x[2] = 0.25
        x[3] = float("-inf")
        x[4, -1] = 50.0
        got = vk_select.argmax(x=dev.upload(wide).cols(2, width + 2)).cpu()
        assert got.dtype == torch.int32
        assert got.tolist() == torch.argmax(x, -1).tolist(), width
    big = torch.randn(2, 152064, generator=gen)
    big[1, [7, 70000, 152063]] = big[1].max() + 1
    assert vk_select.argmax(x=dev.upload(big)).cpu().tolist() == torch.argmax(big, -1).tolist()


def test_a_variant_string_is_checked():
    from minfer.errors import UnsupportedError
    from minfer.kernels.wgsl import matmul as vk_matmul

    assert vk_matmul.parse_variant("TPR=16,NC=4", vk_matmul.GEMV)["NC"] == 4
    for bad in ("TPR=6", "kernel=fast", "ROWS=2", "WG=96,TPR=64", "NR=3", "WG=64,TPR4=128"):
        with pytest.raises(UnsupportedError):
            vk_matmul.parse_variant(bad, vk_matmul.GEMV)


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                                   "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"])
def test_every_wgsl_decoder_is_the_reference_decode(qtype):
    """q_<type>.wgsl's elem (what the gather, the dequantizer and the whole-blocks matmul read)
    against quant/reference.py on fresh random blocks, through the dequantizer and the gather:
    bit-equal on lavapipe; within one rounding of the block's largest term where a GPU fuses
    d * q - m into an FMA (the contracts' allowance)."""
    from minfer.contracts.harness import random_blocks
    from minfer.kernels.wgsl import dequant as vk_dequant
    from minfer.quant.reference import dequantize
    from minfer.quant.types import by_name

    q = by_name(qtype)
    n, k = 5, 3 * max(q.block_elems, 32)
    raw = random_blocks(q, n, k, torch.Generator().manual_seed(17))
    want = dequantize(raw, q.type, (n, k)).float()
    one_rounding = float(want.abs().max()) * 2.0 ** -23
    got = vk_dequant.dequant(raw_u8=raw, qtype=q.type, rows=n, cols=k)
    torch.testing.assert_close(got, want, rtol=0, atol=one_rounding)
    ids = torch.tensor([4, 0, 2, 2], dtype=torch.int32)
    rows = vk_dequant.get_rows(weight_u8=raw, ids=ids, qtype=q.type, n_embd=k)
    torch.testing.assert_close(rows, want[ids.long()], rtol=0, atol=one_rounding)
