"""Elementwise kernels: residual add, bias add, mul, SiLU, SwiGLU and GeGLU (flat, and over
row-strided halves of a fused gate/up output), gpt-oss's clamped SwiGLU (flat: its experts'
[T, k, ff] outputs), scale, soft-cap and the f32 -> f16/bf16 converts.

gelu_tanh(x) = x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), is computed as x sigmoid(2u)
(the same function: (1 + tanh(u)) / 2 = sigmoid(2u)), and tanh(t) as 2 sigmoid(2t) - 1, so every
kernel here needs only exp (the interpreter runs them too).

Thread-to-data mapping (seed 000 §2.2): flat kernels give each program BLOCK consecutive
elements, so each lane handles BLOCK / (32 * num_warps) contiguous elements and the compiler
emits 16-byte vector loads and stores (4 f32 or 8 f16 per instruction, several per lane). The
bias add maps one grid row per token row (axis 0) and column chunks to axis 1, the 2-D form of
seed 000 §3.1; its launcher takes the ROW count and checks it against the sizes, because a wrong
count is an out-of-bounds write, not a slowdown.

All math runs in f32 whatever the storage type; stores round to nearest even. Offsets are int64
so tensors past 2^31 elements index correctly. Every kernel here is memory-bound
(~0.17 FLOP/byte): the only levers are fewer bytes (fusion) and coalesced, vectorized access.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ...errors import UnsupportedError
from ._common import (
    cast_for,
    cdiv,
    check_device,
    check_grid,
    check_int,
    check_tensor,
    gelu_tanh,
    make_out,
    pdl_args,
    release_late,
    release_next,
    rows_view,
    swiglu_oai_f32,
    tanh,
    wait_prior,
)

F32 = (torch.float32,)
FLOATS = (torch.float32, torch.float16, torch.bfloat16)

BLOCK = 2048  # elements per program of the flat kernels: 16 per lane at 4 warps (H200: the f32 ->
# f16 convert at 264 MB ran at 99% of copy bandwidth, against 96% with 4096)
NUM_WARPS = 4
BIAS_BLOCK = 1024  # columns per program of the bias add


@triton.jit
def _offsets(n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    """This program's BLOCK element offsets and their mask (constant true, so it folds away, when n
    is a multiple of BLOCK)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        return offs, tl.full([BLOCK], 1, tl.int1)
    else:
        return offs, offs < n


@triton.jit
def _map1_kernel(x_ptr, z_ptr, n, c, OP: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr, PDL: tl.constexpr):
    """z = op(x) over n elements; OP is "silu", "scale" (x c), "softcap" (c tanh(x / c)) or
    "copy" (a dtype conversion through f32)."""
    release_next(PDL)
    wait_prior(PDL)
    offs, mask = _offsets(n, BLOCK, EVEN)
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    if OP == "silu":
        x = x * tl.sigmoid(x)
    elif OP == "scale":
        x = x * c
    elif OP == "softcap":
        x = c * tanh(x / c)
    release_late(PDL)
    tl.store(z_ptr + offs, cast_for(x, z_ptr), mask=mask)


@triton.jit
def _map2_kernel(x_ptr, y_ptr, z_ptr, n, alpha, limit, OP: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    """z = op(x, y) over n elements; OP is "add", "mul", "swiglu" (silu(x) * y) or "swiglu_oai"
    (g sigmoid(alpha g) (u + 1), g = min(x, limit), u = clamp(y, -limit, limit): gpt-oss)."""
    offs, mask = _offsets(n, BLOCK, EVEN)
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    if OP == "add":
        z = x + y
    elif OP == "mul":
        z = x * y
    elif OP == "swiglu_oai":
        z = swiglu_oai_f32(x, y, alpha, limit)
    else:
        z = x * tl.sigmoid(x) * y
    tl.store(z_ptr + offs, cast_for(z, z_ptr), mask=mask)


@triton.jit
def _add_bias_kernel(y_ptr, b_ptr, d, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    release_next(PDL)
    wait_prior(PDL)
    """y[row, :] += b for the row of program axis 0; axis 1 walks the columns in BLOCK_D chunks."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = cols < d
    ptrs = y_ptr + row * d + cols
    y = tl.load(ptrs, mask=mask)
    b = tl.load(b_ptr + cols, mask=mask)
    release_late(PDL)
    tl.store(ptrs, y + b, mask=mask)


@triton.jit
def _glu_rows_kernel(g_ptr, u_ptr, z_ptr, d, stride_g, stride_u, ACT: tl.constexpr, BLOCK_D: tl.constexpr,
                     PDL: tl.constexpr):
    """z[row, :] = act(g[row, :]) * u[row, :], act silu (ACT "silu") or gelu_tanh ("gelu"): rows of
    program axis 0, columns in BLOCK_D chunks on axis 1; g and u may be row-strided views (the two
    halves of a fused gate/up output)."""
    release_next(PDL)
    wait_prior(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = cols < d
    g = tl.load(g_ptr + row * stride_g + cols, mask=mask).to(tl.float32)
    u = tl.load(u_ptr + row * stride_u + cols, mask=mask).to(tl.float32)
    release_late(PDL)
    if ACT == "gelu":
        a = gelu_tanh(g)
    else:
        a = g * tl.sigmoid(g)
    tl.store(z_ptr + row * d + cols, a * u, mask=mask)


def _flat_launch(what: str, kernel, tensors: tuple, out: torch.Tensor, op: str, *consts, **pdl) -> torch.Tensor:
    n = out.numel()
    if n:
        grid = check_grid(what, (cdiv(n, BLOCK),))
        kernel[grid](*tensors, out, n, *consts, OP=op, BLOCK=BLOCK, EVEN=n % BLOCK == 0, num_warps=NUM_WARPS, **pdl)
    return out


def _binary(what: str, x, y, out, op: str, dtypes, alpha: float = 0.0, limit: float = 0.0) -> torch.Tensor:
    check_tensor(what, "x", x, dtypes)
    check_tensor(what, "y", y, (x.dtype,))
    if x.shape != y.shape:
        shapes = f"{tuple(x.shape)} and {tuple(y.shape)}"
        raise UnsupportedError(f"{what}: x and y must have the same shape, got {shapes}")
    device = check_device(what, x=x, y=y, out=out)
    out = make_out(what, out, x.shape, x.dtype, device)
    return _flat_launch(what, _map2_kernel, (x, y), out, op, float(alpha), float(limit))


def _unary(what: str, x, out, op: str, out_dtype: torch.dtype, c: float = 0.0) -> torch.Tensor:
    check_tensor(what, "x", x, F32)
    device = check_device(what, x=x, out=out)
    out = make_out(what, out, x.shape, out_dtype, device)
    return _flat_launch(what, _map1_kernel, (x,), out, op, float(c), **pdl_args())


def add_f32(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out = x + y, f32, same shapes (the residual add). `out` may alias x or y."""
    return _binary("add_f32", x, y, out, "add", F32)


def mul_f32(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out = x * y, f32, same shapes. `out` may alias x or y."""
    return _binary("mul_f32", x, y, out, "mul", F32)


def swiglu(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out = silu(gate) * up, computed in f32; f32, f16 or bf16 storage (gate, up, out alike)."""
    return _binary("swiglu", gate, up, out, "swiglu", FLOATS)


def swiglu_oai(gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """out = g * sigmoid(alpha g) * (u + 1), g = min(gate, limit), u = clamp(up, -limit, limit):
    gpt-oss's clamped SwiGLU (ggml's swiglu_oai; alpha 1.702, limit 7), f32 math; f32, f16 or bf16
    storage (gate, up, out alike), any contiguous shape (the experts' [T, k, ff])."""
    check_float("swiglu_oai", "alpha", alpha)
    check_float("swiglu_oai", "limit", limit, positive=True)
    return _binary("swiglu_oai", gate, up, out, "swiglu_oai", FLOATS, alpha, limit)


def swiglu_rows(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out [rows, d] f32 = silu(gate) * up for f32 [rows, d] inputs whose rows may be strided (the
    gate and up column halves of a fused projection's output); out is contiguous."""
    return _glu_rows("swiglu_rows", "silu", gate, up, out)


def geglu_rows(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out [rows, d] f32 = gelu_tanh(gate) * up (gemma's feed-forward), as swiglu_rows."""
    return _glu_rows("geglu_rows", "gelu", gate, up, out)


def _glu_rows(what: str, act: str, gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    g = rows_view(what, "gate", gate)
    u = rows_view(what, "up", up, g.shape[1])
    for name, t in (("gate", g), ("up", u)):
        if t.dtype != torch.float32:
            raise UnsupportedError(f"{what}: {name} must be float32, got {t.dtype}")
    if g.shape != u.shape:
        raise UnsupportedError(f"{what}: gate and up must have one shape, got {tuple(g.shape)} and {tuple(u.shape)}")
    device = check_device(what, gate=g, up=u, out=out)
    out = make_out(what, out, gate.shape, torch.float32, device)  # the shape of gate ([d] stays [d])
    rows, d = g.shape
    if rows and d:
        grid = check_grid(what, (rows, cdiv(d, BIAS_BLOCK)))
        _glu_rows_kernel[grid](g, u, out, d, g.stride(0), u.stride(0), ACT=act, BLOCK_D=BIAS_BLOCK,
                               num_warps=NUM_WARPS, **pdl_args())
    return out


def silu_f32(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out = x * sigmoid(x), f32. `out` may alias x."""
    return _unary("silu_f32", x, out, "silu", torch.float32)


def scale_f32(x: torch.Tensor, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """out = x * scale, f32 (gemma's embedding scale). `out` may alias x."""
    check_float("scale_f32", "scale", scale)
    return _unary("scale_f32", x, out, "scale", torch.float32, scale)


def softcap_f32(x: torch.Tensor, cap: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """out = cap * tanh(x / cap), f32 (gemma2's final-logit soft-cap). `out` may alias x."""
    check_float("softcap_f32", "cap", cap, positive=True)
    return _unary("softcap_f32", x, out, "softcap", torch.float32, cap)


def check_float(what: str, name: str, v, positive: bool = False) -> None:
    """A finite number (> 0 when `positive`), else UnsupportedError."""
    if isinstance(v, bool) or not isinstance(v, float | int) or not math.isfinite(v) or (positive and v <= 0):
        raise UnsupportedError(f"{what}: {name} must be a finite number{' > 0' if positive else ''}, got {v!r}")


def convert_f32_f16(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """f32 -> f16, round to nearest even; out of range becomes +-inf (IEEE, as torch does)."""
    return _unary("convert_f32_f16", x, out, "copy", torch.float16)


def convert_f32_bf16(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """f32 -> bf16, round to nearest even; NaN stays NaN."""
    return _unary("convert_f32_bf16", x, out, "copy", torch.bfloat16)


def add_bias_f32(y: torch.Tensor, b: torch.Tensor, n_rows: int) -> torch.Tensor:
    """y[r, :] += b for each of the `n_rows` token rows of y, in place; returns y.

    `n_rows` is the ROW count, not the element count (seed 000 §3.1): the grid launches one
    program row per token row, so it is checked against `y.numel() == n_rows * b.numel()`.
    """
    what = "add_bias_f32"
    check_tensor(what, "y", y, F32)
    check_tensor(what, "b", b, F32, ndim=1)
    check_device(what, y=y, b=b)
    check_int(what, "n_rows", n_rows)
    d = b.numel()
    if y.numel() != n_rows * d:
        raise UnsupportedError(
            f"{what}: y has {y.numel()} elements but n_rows * len(b) = {n_rows} * {d} = {n_rows * d} "
            "(n_rows is the row count, not the element count)"
        )
    if y.numel():
        grid = check_grid(what, (n_rows, cdiv(d, BIAS_BLOCK)))
        _add_bias_kernel[grid](y, b, d, BLOCK_D=BIAS_BLOCK, num_warps=NUM_WARPS, **pdl_args())
    return y
