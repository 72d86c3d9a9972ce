"""The Q4_0 layout and its matmuls (seed 004 QMATMUL pair): the decode GEMV and the prefill matmul.

    out[m, n] = sum_k x[m, k] * W[n, k],  W stored as Q4_0 (d:f16 + 16 nibble bytes per 32 values)

Layout. Weights are repacked once at load (`repack_q4_0`) into two aligned arrays: `qs` int32
[N, K/8] (block b of row n is the 16-byte run of words 4b..4b+3) and `d` f16 [N, K/32]. Same
byte count as the GGUF blocks (0.5625 per weight), but the file's 18-byte block stride is only
2-byte aligned, while here every lane fetches a block's nibbles with one 16-byte load. Inside a
block the nibbles are reordered: bits 4s..4s+3 of word j hold element 4s + j ("slot" s), so the
four words' slot-s values multiply four consecutive elements of x (one vector load).

GEMV (M == 1, decode): `q4_0_gemv` runs gemv.py's kernel (the nibble -> float conversion, tile
and split K are described there) on this layout.

Matmul (M > 1, prefill). Per K step of BLOCK_K values (BW = BLOCK_K / 8 words per row of W),
each of the 8 slots is one `tl.dot` of depth BW: x[:, slot] [BLOCK_M, BW] (f32 -> f16/bf16) by
the slot's values (n - 8) * d [BW, BLOCK_N] (same conversion), accumulating in f32. W's words
are loaded once per step; programs are grouped along M so W tiles are reused from L2.

Configs: the GEMV's comes from `gemv.gemv_config`; the matmul carries a small `@triton.autotune`
list pruned by shape; a launcher's `config=` pins one (tests pin one so the interpreter runs one
small config). Raw GGUF bytes are accepted too and repacked on the fly: correct, but an extra
pass over W per call, so the backend repacks once at load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from ...errors import UnsupportedError
from ...quant.types import GGMLType, by_name
from ._common import (
    INTERPRETING,
    cdiv,
    check_device,
    check_grid,
    check_tensor,
    f32_to_bf16_rne,
    grouped_tile,
    interpreting,
    make_out,
)
from .gemv import (
    _HALF_SHIFT,
    _MAGIC_BITS,
    ACT_Q8_PASSES,
    Q4_0,
    GemvConfig,
    MoeLaunch,
    _check_nk,
    _gemv_scratch,
    _launch_gemv,
    _pack_words,
    _settled,
    _slot,
    _split_scratch,
    check_act_q8,
    gemv_config,
    gemv_operands,
)

REVISION_SOURCES = (str(Path(__file__).with_name("gemv.py")),)  # the GEMV kernel: editing it retires judge numbers


@dataclass(frozen=True)
class Q4_0Packed:
    """A Q4_0 [n, k] weight in the kernels' layout (see the module doc); made by `repack_q4_0`.

    Checked once, here, so the per-call launcher path stays short. `counters` (int32 [n], zero)
    and `partials` (f32, or empty) are the split-K GEMV's scratch (`scratch`)."""

    qs: torch.Tensor  # int32 [n, k // 8]
    d: torch.Tensor  # float16 [n, k // 32]
    n: int
    k: int
    counters: torch.Tensor | None = None  # int32 [n], zero: split-K arrival counters (self-resetting)
    partials: torch.Tensor | None = None  # f32 [splits * n]: split-K partial sums of the default config
    act_q8: int = ACT_Q8_PASSES  # the int8 activation passes of its default GEMV config (EngineConfig.gemv_q8)

    def __post_init__(self):
        what = "Q4_0Packed"
        _check_nk(what, self.n, self.k)
        check_tensor(what, "qs", self.qs, (torch.int32,))
        check_tensor(what, "d", self.d, (torch.float16,))
        if self.qs.numel() != self.n * self.k // 8 or self.d.numel() != self.n * self.k // 32:
            raise UnsupportedError(f"{what}: qs/d sizes do not match [{self.n}, {self.k}]")
        if self.qs.device != self.d.device:
            found = f"{self.qs.device} and {self.d.device}"
            raise UnsupportedError(f"{what}: qs and d must be on one device, got {found}")

    def scratch(self, splits: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(partial sums f32 [splits * n], zeroed arrival counters >= tiles) for a split-K launch:
        the weight's own when they fit, else fresh ones."""
        return _split_scratch(self, splits, tiles)


def _check_q4_0(what: str, qtype) -> None:
    """These kernels read Q4_0 only: a weight of another type is a typed error, never misread."""
    try:
        t = by_name(qtype).type if isinstance(qtype, str) else GGMLType(qtype)
    except (UnsupportedError, ValueError):
        t = None
    if t != GGMLType.Q4_0:
        raise UnsupportedError(f"{what}: reads Q4_0 weights, got qtype {qtype!r}")


def repack_q4_0(raw: torch.Tensor, n: int, k: int, act_q8: int = ACT_Q8_PASSES) -> Q4_0Packed:
    """Split raw GGUF Q4_0 bytes of an [n, k] weight into the kernels' (qs, d) layout, on raw's
    device; `act_q8`: the int8 activation passes its GEMV takes x in (gemv.gemv_config)."""
    what = "repack_q4_0"
    _check_nk(what, n, k)
    check_tensor(what, "raw", raw, (torch.uint8,))
    nkb = k // Q4_0.block_elems
    if raw.numel() != n * nkb * Q4_0.block_bytes:
        need = n * nkb * Q4_0.block_bytes
        raise UnsupportedError(f"{what}: Q4_0 [{n}, {k}] needs {need} bytes, got {raw.numel()}")
    blocks = raw.reshape(n * nkb, Q4_0.block_bytes)
    d = blocks[:, :2].contiguous().view(torch.float16).reshape(n, nkb)
    qs = _pack_words(lambda a, b: blocks[a:b, 2:], n * nkb, raw.device)
    counters, partials = _gemv_scratch(n, k, raw.device)
    return _settled(Q4_0Packed(qs=qs.view(n, nkb * 4), d=d, n=n, k=k, counters=counters, partials=partials,
                               act_q8=check_act_q8(act_q8)))


def _launch_kwargs(config: triton.Config) -> dict:
    """A config as launch keyword arguments (what a launcher's `config=` takes)."""
    return dict(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)


def _packed(what: str, w: Q4_0Packed | torch.Tensor, n: int, k: int) -> Q4_0Packed:
    if isinstance(w, Q4_0Packed):
        if (w.n, w.k) != (n, k):
            raise UnsupportedError(f"{what}: w is a packed [{w.n}, {w.k}] weight, the call says [{n}, {k}]")
        return w
    if isinstance(w, torch.Tensor):
        return repack_q4_0(w, n, k)
    raise UnsupportedError(f"{what}: w must be a Q4_0Packed or raw Q4_0 bytes, got {type(w).__name__}")


def q4_0_gemv(
    x: torch.Tensor,
    w: Q4_0Packed | torch.Tensor,
    n: int,
    k: int,
    qtype: GGMLType | int | str = GGMLType.Q4_0,
    out: torch.Tensor | None = None,
    config: GemvConfig | dict | None = None,
    *,
    xq: tuple | None = None,
    rstd: tuple | None = None,
) -> torch.Tensor:
    """out [1, n] f32 = x @ W^T for one token: x f32 [k] or [1, k], W a Q4_0 [n, k] weight.

    `w`: a `Q4_0Packed` (fast path) or raw GGUF Q4_0 bytes (repacked per call). `config`: a
    `GemvConfig` (or its fields as a dict) instead of the shape's default (`gemv_config`).
    Split-K configs use the packed weight's scratch (partial sums, arrival counters): one call
    per weight at a time (calls on one stream are). `xq`: x's int8 form, made before the call
    (quantize_act_q8 or a fused RMSNorm), used when the config takes int8 activations. `rstd` =
    (ss, eps): x is a deferred RMSNorm's h * w (gemv_fused.gemv_add_norm, its row tiles' sums of
    squares ss): out = (x @ W^T) / rms(h), one row.
    """
    what = "q4_0_gemv"
    _check_q4_0(what, qtype)
    w = _packed(what, w, n, k)
    out, cfg = gemv_operands(what, x, w.qs, n, k, out, config, lambda: gemv_config(n, k, False, w.act_q8))
    launch_q4_0(what, x, w, out, cfg, xq=xq, rstd=rstd)
    return out


def launch_q4_0(what: str, x: torch.Tensor, w: Q4_0Packed, out: torch.Tensor, cfg: GemvConfig,
                epilogue: tuple | None = None, xq: tuple | None = None, moe: MoeLaunch | None = None,
                rstd: tuple | None = None) -> None:
    """Launch the GEMV kernel on a Q4_0Packed weight (x, out checked by the caller; `moe`: gemv.py)."""
    n = w.n if moe is None else moe.rows
    _launch_gemv(what, x, w, w.d, w.d, 0, 0, out, n, w.k, cfg, epilogue=epilogue, xq=xq, moe=moe, rstd=rstd)


# ---------------------------------------------------------------------------------------------
# tiled matmul (M > 1)


@triton.jit
def _mma_operand(v, COMPUTE: tl.constexpr):
    """f32 tile `v` rounded to the tensor-core input type COMPUTE.

    The interpreter's dot multiplies bf16 tiles as their raw 16-bit patterns, so there a bf16
    operand is rounded to bf16 and kept in f32: the same products, exact in f32.
    """
    if COMPUTE == tl.bfloat16:
        if INTERPRETING:
            return f32_to_bf16_rne(v).to(tl.float32)
        else:
            return v.to(tl.bfloat16)
    else:
        return v.to(COMPUTE)


@triton.jit
def _dot_slot(acc, xp, xmask, w, MASK: tl.constexpr, BIAS: tl.constexpr, magic, d, COMPUTE: tl.constexpr):
    """acc + x[:, slot] @ W[slot, :] for one nibble slot: x tile [BM, BW] at xp, words w [BW, BN],
    `d` the block scales times 2^-b for the slot's bit position b."""
    a = tl.load(xp, mask=xmask, other=0.0)
    b = _slot(w, MASK, BIAS, magic) * d
    return tl.dot(_mma_operand(a, COMPUTE), _mma_operand(b, COMPUTE), acc)


@triton.jit
def _q4_0_matmul_kernel(
    x_ptr, qs_ptr, d_ptr, out_ptr, M, N, K, NKB, M_BUCKET, magic, half_shift,
    COMPUTE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
):
    pid_m, pid_n, _, _ = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_m = tl.minimum(offs_m, M - 1).to(tl.int64)  # clamped loads, masked store
    cols_n = tl.minimum(offs_n, N - 1).to(tl.int64)
    # A K step of BLOCK_K values is BW = BLOCK_K / 8 packed words per row of W (word i: block
    # i // 4, word i % 4). Its 8 nibble slots are 8 dots of depth BW: slot s of word i holds
    # k = 32 (i // 4) + 4 s + i % 4, so each dot reads W's words once and x 4 values at a time.
    i = tl.arange(0, BLOCK_K // 8)
    w_tile = qs_ptr + cols_n[None, :] * (NKB * 4) + i[:, None]
    d_tile = d_ptr + cols_n[None, :] * NKB + (i // 4)[:, None]
    x_tile = x_ptr + rows_m[:, None] * K + ((i // 4) * 32 + i % 4)[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            imask = tl.full([BLOCK_K // 8], 1, tl.int1)
        else:
            imask = k0 + (i // 4) * 32 < K
        w = tl.load(w_tile + k0 // 8, mask=imask[:, None], other=0)
        d = tl.load(d_tile + k0 // 32, mask=imask[:, None], other=0.0).to(tl.float32)
        d1 = d * 0.0625
        d2 = d * 0.00390625
        d3 = d * 0.000244140625
        h = w >> half_shift
        xp = x_tile + k0
        xm = imask[None, :]
        acc = _dot_slot(acc, xp, xm, w, 0xF, 8388616.0, magic, d, COMPUTE)
        acc = _dot_slot(acc, xp + 4, xm, w, 0xF0, 8388736.0, magic, d1, COMPUTE)
        acc = _dot_slot(acc, xp + 8, xm, w, 0xF00, 8390656.0, magic, d2, COMPUTE)
        acc = _dot_slot(acc, xp + 12, xm, w, 0xF000, 8421376.0, magic, d3, COMPUTE)
        acc = _dot_slot(acc, xp + 16, xm, h, 0xF, 8388616.0, magic, d, COMPUTE)
        acc = _dot_slot(acc, xp + 20, xm, h, 0xF0, 8388736.0, magic, d1, COMPUTE)
        acc = _dot_slot(acc, xp + 24, xm, h, 0xF00, 8390656.0, magic, d2, COMPUTE)
        acc = _dot_slot(acc, xp + 28, xm, h, 0xF000, 8421376.0, magic, d3, COMPUTE)
    out = out_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    tl.store(out, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


_MATMUL_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "GROUP_M": 8}, num_warps=nw, num_stages=ns)
    for bm, bn, nw, ns in [
        (16, 64, 4, 3),
        (32, 64, 4, 3),
        (64, 64, 4, 3),
        (64, 128, 8, 3),
        (128, 64, 8, 2),
        (128, 128, 8, 2),
    ]
]


def _prune_matmul(configs, named_args, **kwargs):
    """Keep tiles no taller than M needs (M rounded up to a power of two, at least 16)."""
    m_cap = max(16, named_args["M_BUCKET"])
    fit = [c for c in configs if c.kwargs["BLOCK_M"] <= m_cap]
    return fit or [min(configs, key=lambda c: c.kwargs["BLOCK_M"])]


_matmul = triton.heuristics({"EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0})(_q4_0_matmul_kernel)
_matmul_tuned = triton.autotune(
    _MATMUL_CONFIGS,
    key=["M_BUCKET", "N", "K", "COMPUTE"],
    prune_configs_by={"early_config_prune": _prune_matmul},
)(_matmul)

_COMPUTE = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def q4_0_matmul(
    x: torch.Tensor,
    w: Q4_0Packed | torch.Tensor,
    n: int,
    k: int,
    qtype: GGMLType | int | str = GGMLType.Q4_0,
    out: torch.Tensor | None = None,
    config: dict | None = None,
    compute_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """out [m, n] f32 = x @ W^T for m tokens: x f32 [m, k], W a Q4_0 [n, k] weight.

    Products run on tensor cores in `compute_dtype` (float16: 11-bit mantissa, |x| < 65504;
    bfloat16: f32 range, 8-bit mantissa) with f32 accumulation. `w` and `config` as in
    `q4_0_gemv` (config keys BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages).
    """
    what = "q4_0_matmul"
    _check_q4_0(what, qtype)
    w = _packed(what, w, n, k)
    check_tensor(what, "x", x, (torch.float32,), ndim=2)
    if x.shape[1] != k:
        raise UnsupportedError(f"{what}: x must be [m, {k}], got {tuple(x.shape)}")
    if compute_dtype not in _COMPUTE:
        raise UnsupportedError(f"{what}: compute_dtype must be float16 or bfloat16, got {compute_dtype}")
    device = check_device(what, x=x, qs=w.qs, d=w.d, out=out)
    m = x.shape[0]
    out = make_out(what, out, (m, n), torch.float32, device)
    if m == 0:
        return out
    nkb = k // Q4_0.block_elems
    m_bucket = triton.next_power_of_2(m)  # autotune per power-of-two M, not per prompt length
    args = (x, w.qs, w.d, out, m, n, k, nkb, m_bucket, _MAGIC_BITS, _HALF_SHIFT)
    compute = _COMPUTE[compute_dtype]
    if config is None and interpreting():  # nothing to time configs on: the first one pruning keeps
        config = _launch_kwargs(_prune_matmul(_MATMUL_CONFIGS, {"M_BUCKET": m_bucket})[0])

    def grid(meta):
        return check_grid(what, (cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]),))

    if config is None:
        _matmul_tuned[grid](*args, COMPUTE=compute)
    else:
        _matmul[grid](*args, COMPUTE=compute, **config)
    return out
