"""The WGSL kernels' launch variants (what bench/vulkan_sweep.py times on a GPU) against the
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
    from minfer.kernels.wgpu_device import Device, adapters

    default_registry()  # (triton before a lavapipe device: wgpu_device.py)
    if not adapters("Vulkan"):
        pytest.fail("wgpu finds no Vulkan adapter (no GPU: apt-get install mesa-vulkan-drivers)")
    d = Device("vulkan", subgroups=request.param)
    if request.param and not d.subgroups:
        pytest.skip("the adapter has no subgroups")
    return d


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


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
])
def test_the_context_split_attention_matches_the_reference(dev, monkeypatch, hd, n_head, n_kv, ctx, cfg):
    from minfer.kernels import wgsl_ops

    monkeypatch.setattr(wgsl_ops, "ATTN", {**wgsl_ops.ATTN, **cfg, "split": True})
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
    got = wgsl_ops.attention(q=up(q), k=up(k), v=up(v), cache_k=up(ck), cache_v=up(cv),
                             row_slots=up(torch.tensor(slots, dtype=i32)), positions=up(torch.tensor(pos, dtype=i32)),
                             layer=0, n_head=n_head, n_head_kv=n_kv, head_dim=hd, scale=scale).cpu()
    assert _rel(got, want) < 1e-5
    monkeypatch.setattr(wgsl_ops, "ATTN", {**wgsl_ops.ATTN, "split": False})  # the single-pass kernel agrees
    single = wgsl_ops.attention(q=up(q), k=up(k), v=up(v), cache_k=up(ck), cache_v=up(cv),
                                row_slots=up(torch.tensor(slots, dtype=i32)),
                                positions=up(torch.tensor(pos, dtype=i32)),
                                layer=0, n_head=n_head, n_head_kv=n_kv, head_dim=hd, scale=scale).cpu()
    assert _rel(single, want) < 1e-5


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "Q4_K"])
def test_every_gemv_variant_of_the_sweep_matches_the_reference(dev, monkeypatch, qtype):
    """Each launch variant bench/vulkan_sweep.py times (wgsl_ops.GEMV_VARIANTS), at an odd column
    count (a last workgroup part empty) and an odd block count (Q4_0 / Q8_0 rows 2 bytes off 4:
    the unaligned word path): the GEMV and the tiled matmul against float64 math, and a row of the
    tiled matmul bit-equal to the GEMV of that row alone (the batch invariance the backend needs)."""
    from minfer.contracts.harness import random_blocks
    from minfer.kernels import wgsl_ops
    from minfer.quant.reference import dequantize
    from minfer.quant.types import by_name

    q = by_name(qtype)
    base = dict(wgsl_ops.GEMV)
    # 45 blocks: the loads-first chunks and the guarded rest; 601 blocks (32-element types): KIT's
    # doubled TPR (a long row, like the 7B down projection's 592)
    for n_blocks in (45, 601) if q.block_elems == 32 else (3,):
        n, k = 37, q.block_elems * n_blocks
        gen = torch.Generator().manual_seed(11)
        x, raw = torch.randn(3, k, generator=gen), random_blocks(q, n, k, gen)
        want = x.double() @ dequantize(raw, q.type, (n, k)).double().T
        xd, wd, x1 = dev.upload(x), dev.upload(raw), dev.upload(x[1:2])
        for v in wgsl_ops.GEMV_VARIANTS:
            monkeypatch.setattr(wgsl_ops, "GEMV", wgsl_ops.parse_variant(v, base))
            one = wgsl_ops.qmatvec(x=x1, w=wd, n=n, k=k, qtype=q.type).cpu()
            many = wgsl_ops.qmatmul_tiled(x=xd, w=wd, n=n, k=k, qtype=q.type).cpu()
            assert _rel(one, want[1:2]) < 1e-5, (v, k)
            assert _rel(many, want) < 1e-5, (v, k)
            assert torch.equal(one[0], many[1]), (v, k)
            if "LF=1" in v:  # loads-first changes no bit
                monkeypatch.setattr(wgsl_ops, "GEMV", wgsl_ops.parse_variant(v.replace("LF=1", "LF=0"), base))
                assert torch.equal(wgsl_ops.qmatvec(x=x1, w=wd, n=n, k=k, qtype=q.type).cpu(), one), (v, k)
            if "qmv4" in v and "MIN_GROUPS" not in v:  # 37 rows: NR halves to 1 above; unhalved, no bit changes
                monkeypatch.setattr(wgsl_ops, "GEMV", wgsl_ops.parse_variant(v + ",MIN_GROUPS=1", base))
                assert torch.equal(wgsl_ops.qmatvec(x=x1, w=wd, n=n, k=k, qtype=q.type).cpu(), one), (v, k)
                assert torch.equal(wgsl_ops.qmatmul_tiled(x=xd, w=wd, n=n, k=k, qtype=q.type).cpu(), many), (v, k)


def test_head_dims_past_128_are_refused(dev):
    """Both attention kernels gave wrong results at head_dim 256 on NVIDIA's driver (H200 runs
    32-36; right on lavapipe): refused with a typed error instead."""
    from minfer.errors import UnsupportedError
    from minfer.kernels import wgsl_ops

    hd, up, i32 = 256, dev.upload, torch.int32
    cache = up(torch.zeros(1, 1, 1, 8, hd))
    with pytest.raises(UnsupportedError, match="head_dim 256 > 128"):
        wgsl_ops.attention(q=up(torch.zeros(1, hd)), k=up(torch.zeros(1, hd)), v=up(torch.zeros(1, hd)),
                           cache_k=cache, cache_v=cache, row_slots=up(torch.zeros(1, dtype=i32)),
                           positions=up(torch.zeros(1, dtype=i32)), layer=0, n_head=1, n_head_kv=1, head_dim=hd,
                           scale=0.0625)


def test_kit_doubles_the_lanes_of_a_long_row():
    from minfer.kernels import wgsl_ops

    g = wgsl_ops.parse_variant("WG=128,TPR=32,KIT=24", wgsl_ops.GEMV)
    assert wgsl_ops.qmv_lanes(g, 3584) == 32 and wgsl_ops.qmv_lanes(g, 18944) == 128
    assert wgsl_ops.qmv_lanes(wgsl_ops.parse_variant("WG=64,TPR=32,KIT=24", g), 18944) == 64
    assert wgsl_ops.qmv_lanes(wgsl_ops.parse_variant("KIT=0", g), 18944) == 32


def test_kit4_doubles_the_lanes_of_a_long_row():
    from minfer.kernels import wgsl_ops

    g = wgsl_ops.parse_variant("kernel=qmv4,WG=128,TPR4=32,KIT4=8", wgsl_ops.GEMV)
    assert wgsl_ops.qmv4_lanes(g, 3584) == 32 and wgsl_ops.qmv4_lanes(g, 18944) == 128
    assert wgsl_ops.qmv4_lanes(wgsl_ops.parse_variant("KIT4=0", g), 18944) == 32


def test_the_q4_0_planes_hold_the_blocks():
    """repack_q4_0.wgsl: block i's quant bytes at 16 i of the quant plane, its f16 scale the half
    i & 1 of scale word i / 2 after the plane (an odd block count: the last word half empty)."""
    from minfer.contracts.harness import random_blocks
    from minfer.kernels import wgsl_ops
    from minfer.kernels.wgpu_device import default_device
    from minfer.quant.types import by_name

    dev, n, k = default_device(), 3, 32 * 7
    raw = random_blocks(by_name("Q4_0"), n, k, torch.Generator().manual_seed(3))
    got = dev.download(wgsl_ops.q4_0_planes(dev.upload(raw), n, k)).view(torch.uint8)
    blocks = raw.reshape(-1, 18)
    nblk = blocks.shape[0]
    assert got.numel() == wgsl_ops.planes_bytes(nblk) and got.numel() % 16 == 0
    assert torch.equal(got[:16 * nblk].view(nblk, 16), blocks[:, 2:])
    assert torch.equal(got[16 * nblk:16 * nblk + 2 * nblk].view(nblk, 2), blocks[:, :2])


def test_a_variant_string_is_checked():
    from minfer.errors import UnsupportedError
    from minfer.kernels import wgsl_ops

    assert wgsl_ops.parse_variant("TPR=16,NC=4", wgsl_ops.GEMV)["NC"] == 4
    for bad in ("TPR=6", "kernel=fast", "ROWS=2", "WG=96,TPR=64", "NR=3", "WG=64,TPR4=128"):
        with pytest.raises(UnsupportedError):
            wgsl_ops.parse_variant(bad, wgsl_ops.GEMV)


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                                   "Q4_K", "Q5_K", "Q6_K"])
def test_every_wgsl_decoder_is_the_reference_decode(qtype):
    """q_<type>.wgsl's elem (what the gather, the dequantizer and the whole-blocks matmul read)
    against quant/reference.py on fresh random blocks, through the dequantizer and the gather:
    bit-equal on lavapipe; within one rounding of the block's largest term where a GPU fuses
    d * q - m into an FMA (the contracts' allowance)."""
    from minfer.contracts.harness import random_blocks
    from minfer.kernels import wgsl_ops
    from minfer.quant.reference import dequantize
    from minfer.quant.types import by_name

    q = by_name(qtype)
    n, k = 5, 3 * max(q.block_elems, 32)
    raw = random_blocks(q, n, k, torch.Generator().manual_seed(17))
    want = dequantize(raw, q.type, (n, k)).float()
    one_rounding = float(want.abs().max()) * 2.0 ** -23
    got = wgsl_ops.dequant(raw_u8=raw, qtype=q.type, rows=n, cols=k)
    torch.testing.assert_close(got, want, rtol=0, atol=one_rounding)
    ids = torch.tensor([4, 0, 2, 2], dtype=torch.int32)
    rows = wgsl_ops.get_rows(weight_u8=raw, ids=ids, qtype=q.type, n_embd=k)
    torch.testing.assert_close(rows, want[ids.long()], rtol=0, atol=one_rounding)
