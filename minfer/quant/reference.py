"""Torch reference codecs for the ggml tensor types: whole quant blocks <-> float32.

`dequantize(raw, qtype, shape)` decodes every type in the table (types.py documents each block
layout); `quantize(x, qtype)` encodes the types minfer writes itself: F32, F16, BF16, Q4_0, Q4_1,
Q8_0 (Q8_0 is the KV-cache compressor of the kernel contracts, seed 004 `quantize_q8_0`) and
MXFP4 (the `gguf` package's encoder; it has none for IQ4_NL / IQ4_XS, whose search ggml does in C).

Both are bit-exact with the `gguf` package's numpy codecs, which follow ggml's reference C code
(tests/quant/test_reference.py checks every type). Bit-exactness fixes the float32 operation
order: each product and sum is rounded on its own, never fused, in the order ggml uses. For
example a Q4_K element is `(d*sc)*q - (dmin*m)`: four roundings, in that order.

Speed: the bytes are viewed as [n_blocks, block_bytes] and each type's decoder slices its fields
out of that view, so all blocks decode together with no Python loop over blocks. Bit fields are
unpacked in uint8 and converted to float32 once; the scale products then run in place.
Adding a type is one decoder (or encoder) function and one row in `_DECODERS` (`_ENCODERS`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..errors import QuantError, UnsupportedError
from .types import KVALUES_IQ4NL, KVALUES_MXFP4, GGMLType, QuantInfo, quant_info

RawBytes = torch.Tensor | np.ndarray | bytes | bytearray | memoryview


# ---------------------------------------------------------------------------------------------
# field helpers: each works on one field of all blocks at once ([n_blocks, ...] tensors)


def _f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The f16 field at byte `offset` of every block, as a float32 column [n_blocks, 1]."""
    return blocks[:, offset : offset + 2].contiguous().view(torch.float16).to(torch.float32)


def _bits(x: torch.Tensor, shifts: Sequence[int], mask: int) -> torch.Tensor:
    """Bit fields of uint8 bytes: out[..., i, j] = (x[..., j] >> shifts[i]) & mask.

    One scalar shift per field, then one stack: faster on CPU than a broadcast shift by a
    tensor of shifts (scalar shifts vectorize).
    """
    return torch.stack([(x >> s) & mask for s in shifts], dim=-2)


def nibbles(x: torch.Tensor) -> torch.Tensor:
    """Low nibbles, then high nibbles, of each run of bytes along the last axis (uint8)."""
    return _bits(x, (0, 4), 0xF)


def scale_min_k4(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit (scale, min) pairs of a Q4_K/Q5_K block from its 12 packed bytes.

    Bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 the
    same for the mins; bytes 8-11 the low 4 bits of scales 4-7 (low nibble) and mins 4-7 (high).
    """
    lo, mid, hi = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = torch.cat([lo & 63, (hi & 0xF) | ((lo >> 2) & 0x30)], dim=1)
    mn = torch.cat([mid & 63, (hi >> 4) | ((mid >> 2) & 0x30)], dim=1)
    return sc, mn


def _qh_bits(qh: torch.Tensor) -> torch.Tensor:
    """The 32 bits of the little-endian u32 `qh` of Q5_0/Q5_1, bit j at index j (uint8 0/1)."""
    return _bits(qh.unsqueeze(-1), range(8), 1).reshape(qh.shape[0], 32)


# ---------------------------------------------------------------------------------------------
# decoders: [n_blocks, block_bytes] uint8 -> [n_blocks, block_elems] float32 (a new tensor)


def _dequant_f32(b: torch.Tensor) -> torch.Tensor:
    return b.clone().view(torch.float32)


def _dequant_f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).to(torch.float32)


def _dequant_bf16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.bfloat16).to(torch.float32)


def _dequant_q4_0(b: torch.Tensor) -> torch.Tensor:
    q = nibbles(b[:, 2:18]).reshape(-1, 32).view(torch.int8) - 8
    return q.to(torch.float32).mul_(_f16(b, 0))


def _dequant_q4_1(b: torch.Tensor) -> torch.Tensor:
    q = nibbles(b[:, 4:20]).reshape(-1, 32)
    return q.to(torch.float32).mul_(_f16(b, 0)).add_(_f16(b, 2))


def _dequant_q5_0(b: torch.Tensor) -> torch.Tensor:
    q = (nibbles(b[:, 6:22]).reshape(-1, 32) | (_qh_bits(b[:, 2:6]) << 4)).view(torch.int8) - 16
    return q.to(torch.float32).mul_(_f16(b, 0))


def _dequant_q5_1(b: torch.Tensor) -> torch.Tensor:
    q = nibbles(b[:, 8:24]).reshape(-1, 32) | (_qh_bits(b[:, 4:8]) << 4)
    return q.to(torch.float32).mul_(_f16(b, 0)).add_(_f16(b, 2))


def _dequant_q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:34].view(torch.int8).to(torch.float32).mul_(_f16(b, 0))


def _dequant_q2_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales = b[:, 0:16]
    dl = (_f16(b, 80) * (scales & 0xF).to(torch.float32)).view(n, 16, 1)
    ml = (_f16(b, 82) * (scales >> 4).to(torch.float32)).view(n, 16, 1)
    q = _bits(b[:, 16:80].reshape(n, 2, 32), (0, 2, 4, 6), 3).reshape(n, 16, 16)
    return q.to(torch.float32).mul_(dl).sub_(ml).view(n, 256)


def _dequant_q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    packed = b[:, 96:108]
    low4 = nibbles(packed[:, 0:8]).reshape(n, 16)
    high2 = _bits(packed[:, 8:12], (0, 2, 4, 6), 3).reshape(n, 16)
    scales = ((low4 | (high2 << 4)).view(torch.int8) - 32).to(torch.float32)
    dl = (_f16(b, 108) * scales).view(n, 16, 1)
    low2 = _bits(b[:, 32:96].reshape(n, 2, 32), (0, 2, 4, 6), 3).reshape(n, 256)
    hbit = _bits(b[:, 0:32], range(8), 1).reshape(n, 256)
    q = (low2 | (hbit << 2)).view(torch.int8) - 4  # = low2, minus 4 where the hmask bit is clear
    return q.to(torch.float32).view(n, 16, 16).mul_(dl).view(n, 256)


def _dequant_q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc, mn = scale_min_k4(b[:, 4:16])
    dl = (_f16(b, 0) * sc.to(torch.float32)).view(n, 8, 1)
    ml = (_f16(b, 2) * mn.to(torch.float32)).view(n, 8, 1)
    q = nibbles(b[:, 16:144].reshape(n, 4, 32)).reshape(n, 8, 32)
    return q.to(torch.float32).mul_(dl).sub_(ml).view(n, 256)


def _dequant_q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc, mn = scale_min_k4(b[:, 4:16])
    dl = (_f16(b, 0) * sc.to(torch.float32)).view(n, 8, 1)
    ml = (_f16(b, 2) * mn.to(torch.float32)).view(n, 8, 1)
    q = nibbles(b[:, 48:176].reshape(n, 4, 32)).reshape(n, 8, 32) | (_bits(b[:, 16:48], range(8), 1) << 4)
    return q.to(torch.float32).mul_(dl).sub_(ml).view(n, 256)


def _dequant_q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    dl = (_f16(b, 208) * b[:, 192:208].view(torch.int8).to(torch.float32)).view(n, 16, 1)
    low4 = nibbles(b[:, 0:128].reshape(n, 2, 64)).reshape(n, 256)
    high2 = _bits(b[:, 128:192].reshape(n, 2, 32), (0, 2, 4, 6), 3).reshape(n, 256)
    q = (low4 | (high2 << 4)).view(torch.int8) - 32
    return q.to(torch.float32).view(n, 16, 16).mul_(dl).view(n, 256)


def lut_values(nib: torch.Tensor, lut: Sequence[int]) -> torch.Tensor:
    """The float32 values of 4-bit codes `nib` (uint8 0..15) through a lookup type's table."""
    return torch.tensor(lut, dtype=torch.float32, device=nib.device)[nib.long()]


def e8m0_half(e: torch.Tensor) -> torch.Tensor:
    """float32 2^(e - 128) of E8M0 bytes `e` (ggml_e8m0_to_fp32_half: e < 2 as the f32 subnormals
    2^-128 and 2^-127, the rest as the bits (e - 1) << 23)."""
    e = e.to(torch.int32)
    bits = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    return bits.view(torch.float32)


def iq4_xs_scales(b: torch.Tensor) -> torch.Tensor:
    """The 8 signed sub-block scales ls - 32 (int8 [n_blocks, 8]) of IQ4_XS blocks: low 4 bits from
    the nibbles of scales_l (bytes 4..7), high 2 bits from the u16 scales_h (bytes 2..3)."""
    low = nibbles(b[:, 4:8]).transpose(1, 2).reshape(-1, 8)  # sub-block i: nibble i % 2 of byte i / 2
    h = b[:, 2].to(torch.int32) | (b[:, 3].to(torch.int32) << 8)
    high = torch.stack([(h >> (2 * i)) & 3 for i in range(8)], dim=1)
    return ((low.to(torch.int32) | (high << 4)) - 32).to(torch.int8)


def _dequant_iq4_nl(b: torch.Tensor) -> torch.Tensor:
    return lut_values(nibbles(b[:, 2:18]).reshape(-1, 32), KVALUES_IQ4NL).mul_(_f16(b, 0))


def _dequant_iq4_xs(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    dl = (_f16(b, 0) * iq4_xs_scales(b).to(torch.float32)).view(n, 8, 1)
    q = lut_values(nibbles(b[:, 8:136].reshape(n, 8, 16)).reshape(n, 8, 32), KVALUES_IQ4NL)
    return q.mul_(dl).view(n, 256)


def _dequant_mxfp4(b: torch.Tensor) -> torch.Tensor:
    return lut_values(nibbles(b[:, 1:17]).reshape(-1, 32), KVALUES_MXFP4).mul_(e8m0_half(b[:, 0:1]))


_DECODERS: dict[GGMLType, Callable[[torch.Tensor], torch.Tensor]] = {
    GGMLType.F32: _dequant_f32,
    GGMLType.F16: _dequant_f16,
    GGMLType.BF16: _dequant_bf16,
    GGMLType.Q4_0: _dequant_q4_0,
    GGMLType.Q4_1: _dequant_q4_1,
    GGMLType.Q5_0: _dequant_q5_0,
    GGMLType.Q5_1: _dequant_q5_1,
    GGMLType.Q8_0: _dequant_q8_0,
    GGMLType.Q2_K: _dequant_q2_k,
    GGMLType.Q3_K: _dequant_q3_k,
    GGMLType.Q4_K: _dequant_q4_k,
    GGMLType.Q5_K: _dequant_q5_k,
    GGMLType.Q6_K: _dequant_q6_k,
    GGMLType.IQ4_NL: _dequant_iq4_nl,
    GGMLType.IQ4_XS: _dequant_iq4_xs,
    GGMLType.MXFP4: _dequant_mxfp4,
}


# ---------------------------------------------------------------------------------------------
# encoders: [n_blocks, block_elems] float32 -> [n_blocks, block_bytes] uint8


def _f16_bytes(col: torch.Tensor) -> torch.Tensor:
    """A float32 column [n, 1] stored as f16 (round to nearest even), as bytes [n, 2]."""
    return col.to(torch.float16).view(torch.uint8)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """1/d, and 0 where d is 0 (an all-zero block encodes as all-zero codes)."""
    return torch.where(d == 0, 0.0, d.reciprocal())


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """32 codes 0..15 per block -> 16 bytes: element j in the low nibble, j+16 in the high."""
    return q[:, :16] | (q[:, 16:] << 4)


def _quant_f32(x: torch.Tensor) -> torch.Tensor:
    return x.clone(memory_format=torch.contiguous_format).view(torch.uint8)


def _quant_f16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).view(torch.uint8)


def _quant_bf16(x: torch.Tensor) -> torch.Tensor:
    """ggml's fp32 -> bf16: NaN kept (quiet bit set, sign and top payload kept), else nearest even."""
    n = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    is_nan = (n & 0x7FFFFFFF) > 0x7F800000
    rounded = (n + 0x7FFF + ((n >> 16) & 1)) >> 16
    nan = ((n >> 16) & 0xFFFF) | 0x40
    bits = torch.where(is_nan, nan, rounded).to(torch.int32).to(torch.int16)
    return bits.view(torch.uint8)


def _quant_q4_0(x: torch.Tensor) -> torch.Tensor:
    signed_max = x.gather(1, x.abs().argmax(dim=1, keepdim=True))  # first of equal |max|
    d = signed_max / -8
    q = (x * _inverse(d) + 8.5).trunc_().clamp_(0, 15).to(torch.uint8)
    return torch.cat([_f16_bytes(d), _pack_nibbles(q)], dim=1)


def _quant_q4_1(x: torch.Tensor) -> torch.Tensor:
    hi = x.amax(dim=1, keepdim=True)
    lo = x.amin(dim=1, keepdim=True)
    d = (hi - lo) / 15
    q = ((x - lo) * _inverse(d) + 0.5).trunc_().clamp_(0, 15).to(torch.uint8)
    return torch.cat([_f16_bytes(d), _f16_bytes(lo), _pack_nibbles(q)], dim=1)


def _quant_q8_0(x: torch.Tensor) -> torch.Tensor:
    d = x.abs().amax(dim=1, keepdim=True) / 127
    v = x * _inverse(d)
    whole = v.trunc()
    q = whole + (v - whole).mul_(2).trunc_()  # round half away from zero, exactly
    return torch.cat([_f16_bytes(d), q.to(torch.int8).view(torch.uint8)], dim=1)


def _quant_mxfp4(x: torch.Tensor) -> torch.Tensor:
    """The `gguf` package's MXFP4 encoder: e = floor(log2(max|x|)) - 2 + 127 (0 for an all-zero
    block; the float32 log2 correctly rounded, as numpy's), then per element the first of the 16
    values nearest x / 2^(e - 128) (|2^(e-128) v - x| in float32, every product exact)."""
    amax = x.abs().amax(dim=1, keepdim=True)
    log2 = amax.double().log2().float().floor()  # float64 then rounded: the float32 log2, correctly rounded
    e = torch.where(amax > 0, log2 - 2 + 127, 0.0).to(torch.int64) & 0xFF  # as numpy's float -> uint8 wraps
    d = e8m0_half(e)
    kv = torch.tensor(KVALUES_MXFP4, dtype=torch.float32, device=x.device)
    q = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    for start in range(0, x.shape[0], 1 << 14):  # [blocks, 32, 16] of errors, a chunk of blocks at a time
        rows = slice(start, start + (1 << 14))
        q[rows] = (d[rows, :, None] * kv - x[rows, :, None]).abs_().argmin(dim=-1).to(torch.uint8)
    return torch.cat([e.to(torch.uint8), _pack_nibbles(q)], dim=1)


_ENCODERS: dict[GGMLType, Callable[[torch.Tensor], torch.Tensor]] = {
    GGMLType.F32: _quant_f32,
    GGMLType.F16: _quant_f16,
    GGMLType.BF16: _quant_bf16,
    GGMLType.Q4_0: _quant_q4_0,
    GGMLType.Q4_1: _quant_q4_1,
    GGMLType.Q8_0: _quant_q8_0,
    GGMLType.MXFP4: _quant_mxfp4,
}


# ---------------------------------------------------------------------------------------------
# public API


def _codec_info(qtype: GGMLType | int, table: dict, what: str) -> QuantInfo:
    info = quant_info(qtype)
    if info.type not in table:
        known = ", ".join(t.name for t in table)
        raise UnsupportedError(f"{what} of {info.name} is not implemented; supported: {known}")
    return info


def _as_uint8(raw: RawBytes) -> torch.Tensor:
    """`raw` as a flat uint8 tensor, sharing memory with it where it is contiguous."""
    if isinstance(raw, torch.Tensor):
        data = raw
    else:
        try:
            arr = raw if isinstance(raw, np.ndarray) else np.frombuffer(raw, dtype=np.uint8)
        except (TypeError, ValueError, BufferError) as e:
            kind = type(raw).__name__
            raise QuantError(f"expected quant bytes (uint8 tensor/array or a buffer), got {kind}: {e}") from None
        if arr.dtype != np.uint8:
            raise QuantError(f"expected a uint8 array of quant blocks, got dtype {arr.dtype}")
        with warnings.catch_warnings():  # read-only buffers (mmapped files) are fine: we never write
            warnings.simplefilter("ignore", UserWarning)
            data = torch.from_numpy(np.ascontiguousarray(arr))
    if data.dtype != torch.uint8:
        raise QuantError(f"expected a uint8 tensor of quant blocks, got dtype {data.dtype}")
    return data.reshape(-1)


def _output_shape(shape: Sequence[int] | None, n_elems: int, info: QuantInfo) -> tuple[int, ...]:
    if shape is None:
        return (n_elems,)
    dims = tuple(int(s) for s in shape)
    if any(s < 0 for s in dims) or math.prod(dims) != n_elems:
        raise QuantError(f"{info.name}: shape {dims} does not hold the {n_elems} elements of the data")
    if dims and dims[-1] % info.block_elems:
        raise QuantError(f"{info.name}: row length {dims[-1]} is not a multiple of the block size {info.block_elems}")
    return dims


def dequantize(raw: RawBytes, qtype: GGMLType | int, shape: Sequence[int] | None = None) -> torch.Tensor:
    """Decode whole blocks of `qtype` into a new float32 tensor of `shape` (torch order; default 1-D).

    `raw` is a uint8 torch tensor, a uint8 numpy array (e.g. a memmapped tensor) or any bytes-like
    object; it is read in place, never copied whole. The result is on raw's device.
    Raises UnsupportedError for an unknown type, QuantError when the bytes are not whole blocks
    or the shape does not match the element count.
    """
    info = _codec_info(qtype, _DECODERS, "dequantize")
    data = _as_uint8(raw)
    if data.numel() % info.block_bytes:
        raise QuantError(
            f"{info.name}: {data.numel()} bytes is not a whole number of {info.block_bytes}-byte blocks"
        )
    n_blocks = data.numel() // info.block_bytes
    out_shape = _output_shape(shape, n_blocks * info.block_elems, info)
    if n_blocks == 0:
        return torch.empty(out_shape, dtype=torch.float32, device=data.device)
    return _DECODERS[info.type](data.view(n_blocks, info.block_bytes)).reshape(out_shape)


def quantize(x: torch.Tensor | np.ndarray, qtype: GGMLType | int) -> torch.Tensor:
    """Encode float rows as `qtype` blocks: uint8 tensor of shape (*x.shape[:-1], row_bytes).

    The last axis (the row) must be a whole number of blocks. Input is converted to float32
    first, as ggml does. Inputs must be finite: NaN/inf give unspecified codes (as in ggml),
    except for F32/F16/BF16 which keep them.
    """
    info = _codec_info(qtype, _ENCODERS, "quantize")
    t = torch.as_tensor(x)
    if not t.is_floating_point():
        raise QuantError(f"quantize to {info.name}: expected a float tensor, got dtype {t.dtype}")
    if t.dim() == 0 or t.shape[-1] % info.block_elems:
        raise QuantError(
            f"quantize to {info.name}: row length {tuple(t.shape)[-1:]} is not a multiple of "
            f"the block size {info.block_elems}"
        )
    blocks = t.to(torch.float32).reshape(-1, info.block_elems)
    row_bytes = t.shape[-1] // info.block_elems * info.block_bytes
    return _ENCODERS[info.type](blocks).reshape(*t.shape[:-1], row_bytes)
