"""The MoE kernels beyond their contracts (kernels/triton/moe.py): the router on diverged rows; the
grouped expert matmul on f16 tensor cores (`moe_mm16`) and its grouping (`moe_align`), against
float64 math on the reference-decoded experts, for every type it reads: against the exact
product within f16's rounding, and against the product of x and the weights each rounded to f16
as the kernel rounds them, within f32 summation (~1e-6), which catches a wrong code, scale,
offset or element order that the first tolerance would hide (those are >= 1e-2)."""

from __future__ import annotations

import pytest
import torch

from minfer.contracts.harness import random_blocks
from minfer.errors import UnsupportedError
from minfer.kernels.triton import mmq, moe
from minfer.quant import reference
from minfer.quant.types import QUANT_TABLE, GGMLType

TIGHT = 1e-4  # a rare f16 rounding flip of one weight (its f32 dequantization a hair from a tie) stays far below


def _experts(t: GGMLType, e: int, n: int, k: int, gen):
    raw = random_blocks(QUANT_TABLE[t], e * n, k, gen)
    return raw, reference.dequantize(raw.reshape(-1), t, (e * n, k)).double().view(e, n, k)


def _k(t: GGMLType, blocks32: int) -> int:
    per = QUANT_TABLE[t].block_elems
    return max(per, blocks32 * 32 // per * per)


def _ref(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, bias=None) -> torch.Tensor:
    xs = x if x.dim() == 3 else x.unsqueeze(1).expand(-1, ids.shape[1], -1)
    out = torch.einsum("tjk,tjnk->tjn", xs.double(), w[ids.long()])
    if bias is not None:
        out = out + bias.double().view(w.shape[0], w.shape[1])[ids.long()]
    return out


def _ids(t: int, used: int, e: int, gen) -> torch.Tensor:
    ids = torch.stack([torch.randperm(e, generator=gen)[:used] for _ in range(t)]).int()
    ids.view(-1)[0] = e - 1  # the last expert of the stack, every time
    return ids


@pytest.mark.parametrize("t", mmq.MMQ_TYPES, ids=lambda t: t.name)
def test_mm16_every_type(t, device, gen, check):
    e, n, k, tokens, used = 5, 24, _k(t, 8), 6, 2
    raw, w = _experts(t, e, n, k, gen)
    x = torch.randn(tokens, k, generator=gen) * torch.rand(tokens, 1, generator=gen)
    ids = _ids(tokens, used, e, gen)
    out = check.poisoned((tokens, used, n), torch.float32, device)
    moe.moe_mm16(x.to(device), ids.to(device), moe.repack_experts(raw.to(device), n, k, t, e), n, k, t, e, out=out,
                 config={"BLOCK_M": 16, "BLOCK_N": 16, "KB": 2 if k % 64 == 0 else 1, "num_warps": 4})
    assert check.rel_err(out, _ref(x, ids, w)) < 3e-3  # f16 x and weights: ~5e-4 here (contract: 1e-2)
    assert check.rel_err(out, _ref(x.half().float(), ids, w.half().double())) < TIGHT


@pytest.mark.parametrize("config", [
    {"BLOCK_M": 16, "BLOCK_N": 32, "KB": 4, "num_warps": 4},
    {"BLOCK_M": 32, "BLOCK_N": 16, "KB": 1, "num_warps": 4},
    None,  # mm16_config's choice
], ids=["bm16-kb4", "bm32-kb1", "default"])
def test_mm16_runs_longer_than_a_block_per_slot_x_and_bias(config, device, gen, check):
    """40 tokens over 3 experts (each expert's run spans several blocks, the last one partial),
    x per slot (the down projection), each expert's bias in the store; columns not a multiple of
    the tile; twice through the same buffers."""
    t, e, n, k, tokens, used = GGMLType.Q4_K, 3, 40, 256, 40, 2
    raw, w = _experts(t, e, n, k, gen)
    packed = moe.repack_experts(raw.to(device), n, k, t, e)
    bias = torch.randn(e * n, generator=gen)
    for _ in range(2):
        x = torch.randn(tokens, used, k, generator=gen)
        ids = _ids(tokens, used, e, gen)
        out = check.poisoned((tokens, used, n), torch.float32, device)
        moe.moe_mm16(x.to(device), ids.to(device), packed, n, k, t, e, out=out, config=config, bias=bias.to(device))
        assert check.rel_err(out, _ref(x.half().float(), ids, w.half().double(), bias)) < TIGHT


def test_mm16_refuses_and_handles_edges(device, gen):
    t, e, n, k = GGMLType.Q4_0, 4, 16, 64
    raw, _ = _experts(t, e, n, k, gen)
    packed = moe.repack_experts(raw.to(device), n, k, t, e)
    ids = torch.zeros(2, 2, dtype=torch.int32, device=device)
    with pytest.raises(UnsupportedError, match="multiple of 128"):
        moe.moe_mm16(torch.zeros(2, k, device=device), ids, packed, n, k, t, e, config={"BLOCK_M": 16, "BLOCK_N": 16,
                                                                                         "KB": 4, "num_warps": 4})
    with pytest.raises(UnsupportedError, match="x must be"):
        moe.moe_mm16(torch.zeros(3, k, device=device), ids, packed, n, k, t, e)
    empty = moe.moe_mm16(torch.zeros(0, k, device=device), ids[:0], packed, n, k, t, e)
    assert empty.shape == (0, 2, n)


def _q8_bound(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Per output, the most x's int8 records (one pass: scale max|x| / 127 per 32, round to
    nearest) can move it: sum over k of |w| times half a step of x's block."""
    xs = x if x.dim() == 3 else x.unsqueeze(1).expand(-1, ids.shape[1], -1)
    half_step = xs.abs().reshape(*xs.shape[:-1], -1, 32).amax(-1).repeat_interleave(32, -1) / 254
    return torch.einsum("tjk,tjnk->tjn", half_step.double(), w[ids.long()].abs())


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.MXFP4, GGMLType.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("config", [
    {"r": 2, "lr": 4, "wk": 1, "prefetch": True},
    {"r": 2, "lr": 8, "wk": 2, "q8": 1},
    {"r": 4, "lr": 4, "wk": 1, "q8": 2, "prefetch": True, "maxnreg": 168},
    "row",  # moe_gemv_config's decode-row tile (3 rows x 2 used < MANY_SLOTS)
    None,  # moe_gemv_config's batch tile (17 rows x 2 used >= MANY_SLOTS)
], ids=["prefetch", "q8x1", "q8x2-prefetch", "default-row", "default-batch"])
def test_gemv_tiles_every_slot_from_its_x_row(t, config, device, gen, check):
    """moe_gemv on pinned tiles (the sweep's, bench/moe_gemv_sweep.py): prefetching words, x read
    as int8 records (one and two passes; the planes types keep f32 x), x shared by a row's slots
    and x per slot; each slot's output within f32 summation of the exact product, or within the
    int8 records' rounding bound: a slot reading another slot's x row, expert or scales is off
    by the size of the product."""
    e, n, k, tokens, used = 6, 20, _k(t, 12), 3 if config else 17, 2
    config = None if config == "row" else config
    raw, w = _experts(t, e, n, k, gen)
    packed = moe.repack_experts(raw.to(device), n, k, t, e)
    for per_slot in (False, True):
        x = torch.randn(tokens, *((used,) if per_slot else ()), k, generator=gen)
        ids = _ids(tokens, used, e, gen)
        out = check.poisoned((tokens, used, n), torch.float32, device)
        moe.moe_gemv(x.to(device), ids.to(device), packed, n, k, t, e, out=out, config=config)
        got, ref = out.cpu().double(), _ref(x, ids, w)
        passes = moe.moe_gemv_config(n, k, t, tokens * used).q8 if config is None else config.get("q8", 0)
        q8 = passes and t != GGMLType.Q6_K
        bound = _q8_bound(x, ids, w) * 1.01 + 1e-4 if q8 else 1e-4 * (1 + ref.abs())
        assert bool(((got - ref).abs() <= bound).all()), float(((got - ref).abs() - bound).max())


@pytest.mark.parametrize("tokens, used, e, block_m", [(5, 2, 8, 16), (64, 8, 128, 16), (300, 8, 128, 64),
                                                      (3, 4, 32, 32)])
def test_align_groups_every_slot_once_by_expert(tokens, used, e, block_m, device, gen):
    ids = torch.stack([torch.randperm(e, generator=gen)[:used] for _ in range(tokens)]).int()
    srt, bexp = (v.cpu() for v in moe.moe_align(ids.to(device), e, block_m))
    flat = ids.view(-1)
    assert sorted(srt[srt >= 0].tolist()) == list(range(tokens * used))
    assert bexp.numel() == -(-tokens * used // block_m) + min(e, tokens * used)
    for b in range(bexp.numel()):
        rows = srt[b * block_m:(b + 1) * block_m]
        if bexp[b] == e:  # a block of no expert: all padding
            assert (rows < 0).all()
        else:
            assert (rows >= 0).any() and (flat[rows[rows >= 0].long()] == bexp[b]).all()
    used_blocks = bexp[bexp < e]
    assert (used_blocks[1:] >= used_blocks[:-1]).all() and (bexp[used_blocks.numel():] == e).all()


def test_align_is_memory_safe_on_ids_out_of_range(device):
    """Ids the router cannot make (negative, >= E) are clamped into the table, never written past it."""
    ids = torch.tensor([[-3, 7], [100, 2]], dtype=torch.int32)
    srt, bexp = (v.cpu() for v in moe.moe_align(ids.to(device), 4, 16))
    assert sorted(srt[srt >= 0].tolist()) == [0, 1, 2, 3]
    assert set(bexp.tolist()) <= {0, 2, 3, 4}


@pytest.mark.parametrize("gating", ["softmax", "sigmoid", "softmax_weight"])
def test_route_names_an_expert_for_a_diverged_row(gating, device):
    """A row of NaN router logits (a diverged model, a poisoned input) still names k experts in 0..E-1
    (the expert kernels index the weights with them); a NaN beside numbers is never chosen (softmax
    spreads one NaN over the whole row)."""
    logits = torch.full((2, 6), float("nan"))
    logits[1] = torch.tensor([0.5, float("nan"), 2.0, -1.0, float("nan"), 1.0])
    _, ids = moe.moe_route_rows(logits.to(device), torch.zeros(6, device=device), 3, gating, True, 1.0)
    ids = ids.cpu()
    assert ((ids >= 0) & (ids < 6)).all()
    if gating != "softmax":
        assert ids[1].tolist() == [2, 5, 0]


def test_route_orders_negatives_ties_and_zeros_as_floats(device):
    """The top-k picks by one max over packed keys (the float's bits made monotone, then the lower
    index): negatives, ties (the lower index first), -0.0 beside +0.0 (equal), -inf beside numbers
    and a selection bias that reorders them, all as a stable descending sort of the floats picks."""
    inf = float("inf")
    logits = torch.tensor([[-1.0, -2.0, -0.5, -2.0, -1.0, -3.0],
                           [0.0, -0.0, 0.0, -1e-30, 1e-30, -0.0],
                           [-inf, 5.0, -inf, 5.0, -7.0, 5.0],
                           [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.5])
    for b in (torch.zeros(6), bias):
        _, ids = moe.moe_route_rows(logits.to(device), b.to(device), 4, "softmax_weight", False, 1.0)
        want = torch.argsort(logits + b, dim=-1, descending=True, stable=True)[:, :4]
        assert ids.cpu().long().tolist() == want.tolist()


def test_a_layers_matmuls_share_one_grouping(device, gen):
    """`aligned`: the same router ids tensor gives the same tables (gate, up, down of a layer); a new
    tensor of equal values, an in-place write, or another block size groups again."""
    ids = _ids(8, 2, 6, gen).to(device)
    first = moe.aligned(ids, 6, 16)
    assert moe.aligned(ids, 6, 16) is first
    assert moe.aligned(ids.clone(), 6, 16) is not first
    assert moe.aligned(ids, 6, 32) is not first
    again = moe.aligned(ids, 6, 16)
    ids[0, 0] = (int(ids[0, 0]) + 1) % 6  # a torch write bumps the version: grouped again, correctly
    moved = moe.aligned(ids, 6, 16)
    assert moved is not again
    srt, bexp = (v.cpu() for v in moved)
    where = int((srt == 0).nonzero()[0, 0])  # slot 0 sits in a block of its new expert
    assert int(bexp[where // 16]) == int(ids[0, 0])


def test_grouping_under_inference_mode(device, gen):
    """The engine runs under torch.inference_mode, whose tensors keep no version counter: the shared
    grouping still works there (a crash on the H200 the first time), and a new ids tensor regroups."""
    with torch.inference_mode():
        ids = _ids(4, 2, 6, gen).to(device)
        first = moe.aligned(ids, 6, 16)
        assert moe.aligned(ids, 6, 16) is first
        assert moe.aligned(ids.clone(), 6, 16) is not first


def _glu_chain(kernel, x, ids, packed, n, k, t, e, glu, alpha, limit, bias, config):
    """The unfused chain the GLU kernels replace: `kernel` (moe_gemv / moe_mm16) on the gate experts
    and on the up experts of the same stacked weight, then elementwise.py's GLU kernel."""
    from minfer.kernels.triton import elementwise as ew

    g = kernel(x, ids, packed, n, k, t, 2 * e, bias=bias, config=config)
    u = kernel(x, ids + e, packed, n, k, t, 2 * e, bias=bias, config=config)
    return ew.swiglu(g, u) if glu == "swiglu" else ew.swiglu_oai(g, u, alpha, limit)


@pytest.mark.parametrize("t", [GGMLType.Q4_K, GGMLType.MXFP4, GGMLType.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("glu, biased", [("swiglu", False), ("swiglu_oai", True)])
@pytest.mark.parametrize("fused, plain, config", [
    (moe.moe_gemv_glu, moe.moe_gemv, None),  # moe_gemv_config: the one-expert tile (3 x 2 slots)
    (moe.moe_gemv_glu, moe.moe_gemv, {"r": 4, "lr": 4, "wk": 1, "q8": 2}),  # the batch tile, int8 x
    (moe.moe_mm16_glu, moe.moe_mm16, {"BLOCK_M": 16, "BLOCK_N": 16, "KB": 1, "num_warps": 4}),
], ids=["gemv", "gemv-batch-tile", "mm16"])
def test_glu_kernels_give_the_chain_they_replace(t, glu, biased, fused, plain, config, device, gen, check):
    """An expert layer's gate + up + GLU in one launch (moe_gemv_glu, moe_mm16_glu) equals the three
    launches it replaces, up to an ulp of the GLU; n = 20 ends part-way through a pair tile. Against
    float64 on the GEMV path within f32 summation (or the int8 records' bound): a slot pairing a gate
    row with another up row, an up expert read as a gate one or a bias off by one row is off by the
    size of the product."""
    e, n, k, tokens, used = 4, 20, _k(t, 8), 3, 2
    alpha, limit = (1.702, 1.5) if glu == "swiglu_oai" else (0.0, 0.0)
    raw, w = _experts(t, 2 * e, n, k, gen)  # the gate experts, then the up experts
    packed = moe.repack_glu_experts(raw.to(device), n, k, t, e)
    x = torch.randn(tokens, k, generator=gen)
    ids = _ids(tokens, used, e, gen)
    bias = torch.randn(2 * e * n, generator=gen) if biased else None
    dx, dids, dbias = x.to(device), ids.to(device), None if bias is None else bias.to(device)
    out = check.poisoned((tokens, used, n), torch.float32, device)
    fused(dx, dids, packed, n, k, t, e, glu, alpha, limit, out=out, bias=dbias, config=config)
    cfg = config if config is not None or plain is not moe.moe_gemv else moe.moe_gemv_config(2 * n, k, t, tokens * used)
    chain = _glu_chain(plain, dx, dids, packed, n, k, t, e, glu, alpha, limit, dbias, cfg)
    assert torch.allclose(out.cpu(), chain.cpu(), rtol=1e-6, atol=1e-6), float((out - chain).abs().max())
    if plain is moe.moe_gemv:
        g, u = _ref(x, ids, w, bias), _ref(x, ids + e, w, bias)
        ref = g * torch.sigmoid(g) * u if glu == "swiglu" else \
            g.clamp(max=limit) * torch.sigmoid(alpha * g.clamp(max=limit)) * (u.clamp(-limit, limit) + 1)
        q8 = (cfg["q8"] if isinstance(cfg, dict) else cfg.q8) and t != GGMLType.Q6_K
        assert check.rel_err(out, ref) < (2e-3 if q8 else 1e-5)


def test_glu_kernels_refuse_what_they_cannot_run(device, gen):
    t, e, n, k = GGMLType.Q4_0, 2, 8, 32
    raw, _ = _experts(t, 2 * e, n, k, gen)
    packed = moe.repack_glu_experts(raw.to(device), n, k, t, e)
    ids = torch.zeros(2, 2, dtype=torch.int32, device=device)
    x = torch.zeros(2, k, device=device)
    with pytest.raises(UnsupportedError, match="glu must be one of"):
        moe.moe_gemv_glu(x, ids, packed, n, k, t, e, "geglu")
    with pytest.raises(UnsupportedError, match="positive limit"):
        moe.moe_mm16_glu(x, ids, packed, n, k, t, e, "swiglu_oai", 1.702, 0.0)
    with pytest.raises(UnsupportedError, match=r"x must be \[T, 32\]"):
        moe.moe_gemv_glu(torch.zeros(2, 2, k, device=device), ids, packed, n, k, t, e)
    with pytest.raises(UnsupportedError, match=r"need \[16, 32\]"):  # the packed weight holds 2 E matrices: E = 2
        moe.moe_gemv_glu(x, ids, packed, n, k, t, 1)
    assert moe.moe_mm16_glu(x[:0], ids[:0], packed, n, k, t, e).shape == (0, 2, n)

