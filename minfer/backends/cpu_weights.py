"""Weight preparation for the cpu backend: GGUF tensor bytes -> the forms torch computes with fast.

A MatMul weight becomes a `Matrix` with two paths, chosen per call by the kind of rows:

- prefill rows (prompts, perplexity, any number): `F.linear` on a float32 copy, i.e. MKL sgemm.
  float32 is the exact dequantized weight: the numerical reference. A prompt's logits are thus
  the same however it is cut into chunks or how much of it a reused prefix covers.
- decode rows (any number): Q4_0/Q4_1 run torch's int4 packed matmul (group size 32, bfloat16
  activations), Q8_0 a 16-bit copy (half the bytes of float32); other types use float32.
  The int4 path returns the kernel's own bfloat16 result and takes bfloat16 input as it is:
  a decode step's activations stay bfloat16 from one int4 matmul to the next (SwiGLU between
  gate/up and down), and float32 consumers promote them (the residual Add, the KV cache copy,
  RoPE). Converting back and forth would add no precision, only ops.

torch's int4 kernel computes w = (q - 8) * scale + zero per group of 32. ggml's blocks are
Q4_0: w = d * (q - 8) -> scale = d, zero = 0; Q4_1: w = d * q + m -> scale = d, zero = m + 8 d.
The bfloat16 scales and activations cost ~0.3% relative error per matmul (llama.cpp's 8-bit
activations cost about as much). tests/engine/test_cpu_weights.py checks both paths against
the `gguf` package's dequantizer.

Every type is decoded by `quant.reference.dequantize` (bit-exact with gguf.quants; about 0.5 s
for all of SmolLM2's matrices on 2 cores).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import torch
import torch.nn.functional as F

from ..gguf.reader import GGUFReader, TensorInfo
from ..quant.reference import dequantize
from ..quant.types import GGMLType

INT4_ROWS = 16  # torch's int4 packing takes rows in multiples of this (other shapes: the f32 GEMV)
INT4_GROUP = 32
# Below 8 rows sgemm (MKL / oneDNN) takes GEMV-like kernels that round differently from its GEMM;
# prefill calls with fewer rows are padded to this many. (Above it, rows agree bit for bit at
# model shapes but not at every shape, so decode rows do not rely on it.)
MIN_GEMM_ROWS = 8


@functools.cache
def native_bf16() -> bool:
    """Whether this CPU has bfloat16 dot-product instructions (AVX512-BF16 or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", flags))


def raw_rows(reader: GGUFReader, info: TensorInfo) -> torch.Tensor:
    """The tensor's bytes as uint8 [rows, row_bytes] (zero-copy view of the file; a vector is one
    row, whatever its type)."""
    rows = info.torch_shape[0] if len(info.shape) > 1 else 1
    return torch.from_numpy(reader.tensor_bytes(info.name)).view(rows, -1)


def _f16_field(b: torch.Tensor, offset: int) -> torch.Tensor:
    """float32 [rows, blocks, 1] from the f16 at byte `offset` of every block."""
    return b[..., offset:offset + 2].contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., 16] bytes -> [..., 32] values 0..15: byte j holds element j (low) and j+16 (high)."""
    return torch.cat([qs & 0xF, qs >> 4], dim=-1)


def unpack_q4(rows: torch.Tensor, qtype: GGMLType) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_0/Q4_1 rows [n, row_bytes] -> (q uint8 [n, k/32, 32] in 0..15, scale, zero [n, k/32, 1])
    with w = (q - 8) * scale + zero."""
    q4_1 = qtype == GGMLType.Q4_1
    b = rows.view(rows.shape[0], -1, 20 if q4_1 else 18)
    d = _f16_field(b, 0)
    q = _nibbles(b[..., 4:20] if q4_1 else b[..., 2:18])
    zero = _f16_field(b, 2).add_(8 * d) if q4_1 else torch.zeros_like(d)
    return q, d, zero


def decode_rows(rows: torch.Tensor, qtype: GGMLType, width: int) -> torch.Tensor:
    """Exact float32 [n, width] of raw rows [n, row_bytes], by the reference dequantizer."""
    return dequantize(rows, qtype, (rows.shape[0], width))


def dense_f32(reader: GGUFReader, info: TensorInfo) -> torch.Tensor:
    """The exact float32 values of a weight, in torch order."""
    if len(info.shape) == 1:
        return decode_rows(raw_rows(reader, info).view(1, -1), info.ggml_type, info.shape[0]).view(-1)
    return decode_rows(raw_rows(reader, info), info.ggml_type, info.torch_shape[-1]).view(info.torch_shape)


class Matrix:
    """y = x @ W^T (+ b) for one prepared weight W [n, k] (a fused weight: its parts' rows stacked).

    `keep_dense` False (a model whose float32 copies would not fit the memory budget) decodes
    the float32 weight again for each many-row call instead of keeping it: slower prefill, but
    no allocation the machine cannot hold."""

    def __init__(self, reader: GGUFReader, infos: list[TensorInfo], bias: torch.Tensor | None,
                 keep_dense: bool):
        self._parts = (reader, infos)
        self.bias = bias
        self.n, self.k = sum(i.torch_shape[0] for i in infos), infos[0].torch_shape[1]
        self._dense = self._decode() if keep_dense else None
        self._small = None  # x -> y for few rows, where the type has a compact path
        self.small_kernel = "torch.linear_f32"
        types = {i.ggml_type for i in infos}
        if types <= {GGMLType.Q4_0, GGMLType.Q4_1} and self.n % INT4_ROWS == 0:  # (torch packs 16 rows at a time)
            self._set_int4(*(torch.cat(t) for t in zip(*(unpack_q4(raw_rows(reader, i), i.ggml_type)
                                                              for i in infos), strict=True)))
        elif types == {GGMLType.Q8_0}:
            self._set_half()

    def _decode(self) -> torch.Tensor:
        reader, infos = self._parts
        parts = [dense_f32(reader, i) for i in infos]
        return parts[0].contiguous() if len(parts) == 1 else torch.cat(parts)

    @property
    def dense(self) -> torch.Tensor:
        """The exact float32 weight [n, k]."""
        return self._dense if self._dense is not None else self._decode()

    def _set_int4(self, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> None:
        """torch's int4 packed matmul for few rows (q in 0..15, w = (q - 8) * scale + zero)."""
        q = q.reshape(self.n, self.k).to(torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
        sz = torch.stack([scale[..., 0].t(), zero[..., 0].t()], dim=-1).to(torch.bfloat16).contiguous()
        mm = torch.ops.aten._weight_int4pack_mm_for_cpu

        def run(x: torch.Tensor) -> torch.Tensor:
            return mm(x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16), packed, INT4_GROUP, sz)

        self._small, self.small_kernel = run, "torch.int4pack_mm_bf16"

    def _set_half(self) -> None:
        """A 16-bit copy for decode (Q8_0): bfloat16 where the CPU multiplies bfloat16 natively
        (d * q rounded to 8 mantissa bits, the precision of the int4 path's activations; its GEMM
        costs about the same for 1 row or 16), else float16 (relative error < 2^-11; on AVX2 its
        GEMM is a GEMV per row)."""
        dt = torch.bfloat16 if native_bf16() else torch.float16
        half = self.dense.to(dt)
        self._small = lambda x: F.linear(x.to(dt), half).to(torch.float32)
        self.small_kernel = "torch.linear_bf16" if dt == torch.bfloat16 else "torch.linear_f16"

    def __call__(self, x: torch.Tensor, decode: bool = False) -> torch.Tensor:
        """float32 [T, n]; on the compact int4 path bfloat16 (a bias promotes it to float32).

        Decode rows take the compact path where the type has one (its kernels compute each row on
        its own, so a row's result is the same for 1 sequence or 64), else the float32 weight one
        row at a time. Prefill rows take the exact float32 weight; fewer than MIN_GEMM_ROWS rows
        are padded, so a prompt's logits barely depend on how it is chunked."""
        if decode and self._small is not None:
            y = self._small(x)
            return y if self.bias is None else y + self.bias
        rows = x.shape[0]
        if decode:  # sgemm's kernel and rounding depend on the row count: one row at a time
            ys = [F.linear(x[i:i + 1].float().clone(), self.dense, self.bias) for i in range(rows)]
            return ys[0] if rows == 1 else torch.cat(ys)
        if rows < MIN_GEMM_ROWS:
            x = torch.cat([x.float(), x.new_zeros(MIN_GEMM_ROWS - rows, x.shape[1], dtype=torch.float32)])
            return F.linear(x, self.dense, self.bias)[:rows]
        return F.linear(x.float(), self.dense, self.bias)

    def kernel(self, decode: bool = False) -> str:
        return self.small_kernel if decode and self._small is not None else "torch.linear_f32"


class EmbeddingTable:
    """GetRows from a weight: gathers the raw rows of the requested ids, then decodes only those."""

    def __init__(self, reader: GGUFReader, info: TensorInfo):
        self.qtype = info.ggml_type
        self.width = info.torch_shape[-1]
        self.raw = raw_rows(reader, info)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return decode_rows(self.raw.index_select(0, ids), self.qtype, self.width)
