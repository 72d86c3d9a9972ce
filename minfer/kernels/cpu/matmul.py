"""The cpu backend's matmul kernels: every quantized ggml type as int4 digits of torch's packed
int4 matmul, and float32 / bfloat16 GEMMs for float weights (contracts: kernels/cpu/matmul.fkc.md).
Where the C kernels run (kernels/cpu/vnni.py: AVX512-VNNI and a C compiler), Q4_0/Q4_1/Q4_K, Q5_0/Q5_1/
Q5_K, Q8_0 and the lookup types (IQ4_NL, IQ4_XS, MXFP4) take those instead; this module serves the other
types, and every type elsewhere.

torch's CPU int4 kernel (`_weight_int4pack_mm_for_cpu`, group size 32, bfloat16 activations
and (scale, zero) pairs) computes, for every group of 32 columns, w = (c - 8) * scale + zero
with codes c in 0..15. Every ggml block type is an integer v per element times a group scale S
plus a group constant M0: w = S * v + M0 (`int_form`). The cpu backend runs each type through
that one kernel:

- 4-bit types (Q4_0, Q4_1, Q4_K; groups of 32): c = v, zero = M0 + 8 S. One code per weight,
  no wider than the file (4.5 -> 5 bits per weight with the bfloat16 scale and zero).
- wider or finer-grained types (Q5_0, Q5_1, Q5_K, Q8_0 and the lookup types' table
  values: groups of 32; Q2_K, Q3_K, Q6_K: groups of 16): v in -128..127 splits into two
  digits, v = lo + 16 hi with lo = v & 15 and hi = v >> 4. The matrix gets twice the columns:
  each group of G weights becomes G columns of lo digits then G columns of hi + 8, and the
  activations are laid out to match,
  [x_g, 16 x_g] (16 x is exact in bfloat16). Column pair j then contributes
  ((lo - 8) S + Z1) x + (hi S + Z2) 16 x = S v x + (Z1 - 8 S + 16 Z2) x, so any zeros with
  Z1 + 16 Z2 = M0 + 8 S are exact: for G = 32 the two halves are two groups of 32 (Z1 = M0 + 8 S,
  Z2 = 0); for G = 16 one group of 32 holds both halves (Z1 = Z2 = (M0 + 8 S) / 17). That is
  10 bits per weight (1.25 bytes): 1.18x a Q8_0 file, 1.5x Q6_K, 1.8x Q5_K, 2.9x Q3_K,
  3.8x Q2_K, against 4 bytes for a float32 copy.

Precision: the scale and zero of each group round to bfloat16 (2^-9 relative) and so do the
activations (the int4 kernel's input type); tests/engine/test_cpu_weights.py measures the
result against float64 on the `gguf` package's dequantized values for every type.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...errors import UnsupportedError
from ...quant.reference import e8m0_half, iq4_xs_scales, nibbles, scale_min_k4
from ...quant.types import KVALUES_IQ4NL, KVALUES_MXFP4, QUANT_TABLE, GGMLType, by_name

# Below 8 rows sgemm (MKL / oneDNN) takes GEMV-like kernels that round differently from its GEMM;
# prefill calls with fewer rows are padded to this many. (Above it, rows agree bit for bit at
# model shapes but not at every shape, so decode rows do not rely on it.)
MIN_GEMM_ROWS = 8
GROUP = 32  # torch's int4 group size used here (the smallest it takes)
ROWS = 64  # rows are packed in tiles of this many (torch's CPU layout); others are padded with zero rows

PLAIN = {GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q4_K}  # one digit, groups of 32
PAIRED_32 = {GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q5_K, GGMLType.Q8_0, GGMLType.IQ4_NL, GGMLType.IQ4_XS,
             GGMLType.MXFP4}
PAIRED_16 = {GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q6_K}
INT4_TYPES = PLAIN | PAIRED_32 | PAIRED_16


def _f16(b: torch.Tensor, offset: int) -> torch.Tensor:
    """float32 [blocks, 1] from the f16 at byte `offset` of every block [blocks, block_bytes]."""
    return b[:, offset:offset + 2].contiguous().view(torch.float16).to(torch.float32)


def _bits(x: torch.Tensor, shifts, mask: int) -> torch.Tensor:
    """out[..., i, j] = (x[..., j] >> shifts[i]) & mask (the reference dequantizer's layout)."""
    return torch.stack([(x >> s) & mask for s in shifts], dim=-2)


def _qh32(qh: torch.Tensor) -> torch.Tensor:
    """The 32 bits of Q5_0/Q5_1's little-endian u32 [blocks, 4] bytes, bit j at index j."""
    return _bits(qh.unsqueeze(-1), range(8), 1).reshape(qh.shape[0], 32)


def _plain_scales(b: torch.Tensor, qtype: GGMLType) -> tuple[torch.Tensor, torch.Tensor]:
    """(S, M0) float32 [n_blocks, block_elems / 32] of a 4-bit type's blocks."""
    if qtype == GGMLType.Q4_0:
        d = _f16(b, 0)
        return d, -8 * d
    if qtype == GGMLType.Q4_1:
        return _f16(b, 0), _f16(b, 2)
    sc, mn = scale_min_k4(b[:, 4:16])  # Q4_K
    return _f16(b, 0) * sc.to(torch.float32), -(_f16(b, 2) * mn.to(torch.float32))


def int_form(b: torch.Tensor, qtype: GGMLType) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Blocks [n_blocks, block_bytes] uint8 -> (v [n_blocks, block_elems] (uint8 for the 4-bit
    types, else int16), S, M0 float32
    [n_blocks, block_elems / G], G) with weight = S * v + M0 per group of G elements, exactly the
    values of `quant.reference.dequantize` (same float32 products)."""
    n = b.shape[0]
    if qtype in (GGMLType.Q4_0, GGMLType.Q4_1):
        return (nibbles(b[:, 2:18] if qtype == GGMLType.Q4_0 else b[:, 4:20]).reshape(n, 32),
                *_plain_scales(b, qtype), 32)
    if qtype == GGMLType.Q5_0:
        d = _f16(b, 0)
        v = nibbles(b[:, 6:22]).reshape(n, 32) | (_qh32(b[:, 2:6]) << 4)
        return v.short(), d, -16 * d, 32
    if qtype == GGMLType.Q5_1:
        v = nibbles(b[:, 8:24]).reshape(n, 32) | (_qh32(b[:, 4:8]) << 4)
        return v.short(), _f16(b, 0), _f16(b, 2), 32
    if qtype == GGMLType.Q8_0:
        d = _f16(b, 0)
        return b[:, 2:34].view(torch.int8).short(), d, torch.zeros_like(d), 32
    if qtype in (GGMLType.Q4_K, GGMLType.Q5_K):
        sc, mn = scale_min_k4(b[:, 4:16])
        s = _f16(b, 0) * sc.to(torch.float32)
        m0 = -(_f16(b, 2) * mn.to(torch.float32))
        if qtype == GGMLType.Q4_K:
            return nibbles(b[:, 16:144].reshape(n, 4, 32)).reshape(n, 256), s, m0, 32  # = _plain_scales
        v = nibbles(b[:, 48:176].reshape(n, 4, 32)).reshape(n, 256) | (_bits(b[:, 16:48], range(8), 1)
                                                                        .reshape(n, 256) << 4)
        return v.short(), s, m0, 32
    if qtype == GGMLType.Q2_K:
        scales = b[:, 0:16]
        s = _f16(b, 80) * (scales & 0xF).to(torch.float32)
        m0 = -(_f16(b, 82) * (scales >> 4).to(torch.float32))
        v = _bits(b[:, 16:80].reshape(n, 2, 32), (0, 2, 4, 6), 3).reshape(n, 256)
        return v.short(), s, m0, 16
    if qtype == GGMLType.Q3_K:
        packed = b[:, 96:108]
        low4 = nibbles(packed[:, 0:8]).reshape(n, 16)
        high2 = _bits(packed[:, 8:12], (0, 2, 4, 6), 3).reshape(n, 16)
        s = _f16(b, 108) * ((low4 | (high2 << 4)).view(torch.int8) - 32).to(torch.float32)
        low2 = _bits(b[:, 32:96].reshape(n, 2, 32), (0, 2, 4, 6), 3).reshape(n, 256)
        hbit = _bits(b[:, 0:32], range(8), 1).reshape(n, 256)
        v = (low2 | (hbit << 2)).view(torch.int8).short() - 4
        return v, s, torch.zeros_like(s), 16
    if qtype == GGMLType.Q6_K:
        s = _f16(b, 208) * b[:, 192:208].view(torch.int8).to(torch.float32)
        low4 = nibbles(b[:, 0:128].reshape(n, 2, 64)).reshape(n, 256)
        high2 = _bits(b[:, 128:192].reshape(n, 2, 32), (0, 2, 4, 6), 3).reshape(n, 256)
        v = (low4 | (high2 << 4)).short() - 32
        return v, s, torch.zeros_like(s), 16
    if qtype in (GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.MXFP4):  # the table value of each code, scale per 32
        return _lookup_form(b, qtype)
    raise ValueError(f"no int4 form for {qtype.name}")


def _lookup_form(b: torch.Tensor, qtype: GGMLType) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """int_form of the lookup types: v = the table value of each nibble (int16), S the scale of its
    32 (IQ4_NL d; IQ4_XS d (ls - 32); MXFP4 2^(e - 128)), M0 = 0."""
    n = b.shape[0]
    if qtype == GGMLType.IQ4_XS:
        table, codes = KVALUES_IQ4NL, nibbles(b[:, 8:136].reshape(n, 8, 16)).reshape(n, 256)
        s = _f16(b, 0) * iq4_xs_scales(b).to(torch.float32)
    elif qtype == GGMLType.IQ4_NL:
        table, codes, s = KVALUES_IQ4NL, nibbles(b[:, 2:18]).reshape(n, 32), _f16(b, 0)
    else:
        table, codes, s = KVALUES_MXFP4, nibbles(b[:, 1:17]).reshape(n, 32), e8m0_half(b[:, 0:1])
    v = torch.tensor(table, dtype=torch.int16)[codes.long()]
    return v, s, torch.zeros_like(s), 32


def paired(qtype: GGMLType) -> int:
    """0 for one digit per weight, else the group size G whose columns come as lo/hi pairs."""
    return 0 if qtype in PLAIN else 32 if qtype in PAIRED_32 else 16


@dataclass
class Int4Codes:
    """One weight's digits before packing: codes uint8 [n, k'] in 0..15, (scale, zero) float32
    [n, k'/32]; k' = k, or 2k when `pair` (the group size of the lo/hi column pairs) is set."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    pair: int


def int4_codes(rows: torch.Tensor, qtype: GGMLType, k: int) -> Int4Codes:
    """A weight's raw rows [n, row_bytes] uint8 -> its int4 digits (see the module docstring)."""
    n = rows.shape[0]
    v, s, m0, g = int_form(rows.reshape(-1, QUANT_TABLE[qtype].block_bytes), qtype)
    v, s, m0 = v.reshape(n, k), s.reshape(n, k // g), m0.reshape(n, k // g)
    pair = paired(qtype)
    if not pair:
        return Int4Codes(v, s, m0 + 8 * s, 0)
    lo = (v & 15).to(torch.uint8).view(n, k // g, 1, g)
    hi = ((v >> 4) + 8).to(torch.uint8).view(n, k // g, 1, g)
    codes = torch.cat([lo, hi], dim=2).reshape(n, 2 * k)
    z = m0 + 8 * s
    if g == 32:  # two groups of 32 per weight group: (S, M0 + 8S) then (S, 0)
        scale = s.repeat_interleave(2, dim=1)
        zero = torch.stack([z, torch.zeros_like(z)], dim=2).reshape(n, 2 * (k // g))
    else:  # one group of 32 per weight group of 16: (S, (M0 + 8S) / 17)
        scale, zero = s, z / 17
    return Int4Codes(codes, scale, zero, pair)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [n, k] in 0..15 (n a multiple of 64) -> torch's CPU int4 layout [n, k/2], what
    `_convert_weight_to_int4pack_for_cpu` makes from int32 codes (tests check it is the same):
    per tile of 64 rows and per column, 32 bytes holding row i (low nibble) and row 32 + i."""
    n, k = codes.shape
    tiles = codes.view(n // ROWS, 2, ROWS // 2, k)
    return (tiles[:, 0] | (tiles[:, 1] << 4)).transpose(1, 2).reshape(n, k // 2)


# Where the 4-bit types keep their nibbles: (byte offset of qs in the block, bytes per unit U):
# a unit's byte j holds element j (low nibble) and element U + j (high nibble).
_PLAIN_QS = {GGMLType.Q4_0: (2, 16), GGMLType.Q4_1: (4, 16), GGMLType.Q4_K: (16, 32)}


def pack_plain(rows: torch.Tensor, qtype: GGMLType, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A 4-bit type's rows [n, row_bytes] (n a multiple of 64) -> (packed [n, k/2] in torch's
    layout, scale, zero [n, k/32]) straight from the file's nibbles: the same bytes as
    pack_int4(int4_codes(...).codes) in a few byte operations (load time: 8B has 7e9 of them)."""
    n = rows.shape[0]
    info = QUANT_TABLE[qtype]
    off, u = _PLAIN_QS[qtype]
    # the byte operations run on the widest integers that tile the blocks (4 bytes for Q4_1 and
    # Q4_K, 2 for Q4_0's 18-byte blocks): the same bits, a fraction of the element count
    wide, width = (torch.int32, 4) if info.block_bytes % 4 == 0 and off % 4 == 0 else (torch.int16, 2)
    lo_mask = int.from_bytes(b"\x0f" * width, "little", signed=True)
    hi_mask = ~lo_mask
    blocks = rows.view(n, -1, info.block_bytes)
    qs = blocks[:, :, off:off + info.block_elems // 2].view(wide)
    qs = qs.reshape(n // ROWS, 2, ROWS // 2, k // (2 * u), u // width)
    a, b = qs[:, 0], qs[:, 1]
    lo = (a & lo_mask) | ((b & lo_mask) << 4)
    hi = ((a >> 4) & lo_mask) | (b & hi_mask)
    packed = (torch.stack([lo, hi], dim=3).view(torch.uint8).view(n // ROWS, ROWS // 2, k)
              .transpose(1, 2).reshape(n, k // 2))
    s, m0 = _plain_scales(blocks.reshape(-1, info.block_bytes), qtype)
    return packed, s.reshape(n, -1), (m0 + 8 * s).reshape(n, -1)


@dataclass
class Packed:
    """One weight in torch's int4 layout: packed uint8 [n', k'/2], scale and zero float32
    [n', k'/32], n' = n rounded up to 64 (zero rows), k' = k or 2k (`pair`: lo/hi column pairs
    of groups of `pair` weights)."""

    packed: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    pair: int
    n: int


CHUNK = 1 << 23  # weights packed per piece: bounds the load's temporary memory to ~100 MB


def pack_weight(rows: torch.Tensor, qtype: GGMLType, k: int) -> Packed:
    """A quantized weight's raw rows [n, row_bytes] uint8 -> its packed int4 form, packed in
    pieces of whole tiles (an 8B model's output matrix would otherwise need GBs of temporaries)."""
    n = rows.shape[0]
    pad = -n % ROWS
    if pad:
        rows = torch.cat([rows, rows.new_zeros(pad, rows.shape[1])])  # zero blocks: scale 0, value 0
    n_pad, k2 = n + pad, k * (2 if paired(qtype) else 1)
    packed = torch.empty(n_pad, k2 // 2, dtype=torch.uint8)
    scale = torch.empty(n_pad, k2 // GROUP)
    zero = torch.empty(n_pad, k2 // GROUP)
    step = max(ROWS, CHUNK // k // ROWS * ROWS)
    for a in range(0, n_pad, step):
        b = min(n_pad, a + step)
        if qtype in PLAIN:
            packed[a:b], scale[a:b], zero[a:b] = pack_plain(rows[a:b], qtype, k)
        else:
            c = int4_codes(rows[a:b], qtype, k)
            packed[a:b], scale[a:b], zero[a:b] = pack_int4(c.codes), c.scale, c.zero
    return Packed(packed, scale, zero, paired(qtype), n)


def packed_bytes(n: int, k: int, qtype: GGMLType) -> int:
    """Bytes of pack_weight's result for an [n, k] weight: codes + bfloat16 (scale, zero) pairs."""
    n_pad, k2 = n + -n % ROWS, k * (2 if paired(qtype) else 1)
    return n_pad * k2 // 2 + n_pad * (k2 // GROUP) * 4


class Int4Matmul:
    """y = x @ W^T through torch's int4 packed matmul, for one or more stacked weights (all with
    the same `pair`). Returns bfloat16 [T, n]; every output row depends on its input row alone
    (the kernel's arithmetic for a row does not change with the row count)."""

    def __init__(self, parts: list[Packed]):
        pair = {p.pair for p in parts}
        assert len(pair) == 1, "stacked int4 weights must share their column layout"
        self.pair = pair.pop()
        self.packed = torch.cat([p.packed for p in parts]) if len(parts) > 1 else parts[0].packed
        scale = torch.cat([p.scale for p in parts])
        zero = torch.cat([p.zero for p in parts])
        self.scale_zero = torch.stack([scale.t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous()
        self.n = sum(p.n for p in parts)
        # the output columns of real rows, where a part was padded to a whole tile
        starts, at = [], 0
        for p in parts:
            starts.append((at, at + p.n))
            at += p.packed.shape[0]
        self._slices = None if at == self.n else starts
        self.nbytes = self.packed.numel() + 2 * self.scale_zero.numel()

    def state(self) -> dict:
        """The prepared layout as tensors and ints (backends/cpu/weight_cache.py keeps it on disk)."""
        slices = torch.tensor(self._slices or [], dtype=torch.int64).view(-1, 2)
        return {"packed": self.packed, "scale_zero": self.scale_zero, "pair": self.pair, "n": self.n,
                "slices": slices}

    @classmethod
    def from_state(cls, st: dict) -> Int4Matmul:
        """An Int4Matmul over tensors `state()` gave (e.g. memory-mapped from the cache): no packing."""
        self = cls.__new__(cls)
        self.packed, self.scale_zero = st["packed"].contiguous(), st["scale_zero"].contiguous()
        self.pair, self.n = int(st["pair"]), int(st["n"])
        self._slices = [tuple(r) for r in st["slices"].tolist()] or None
        self.nbytes = self.packed.numel() + 2 * self.scale_zero.numel()
        return self

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)
        if self.pair:
            t, k = x.shape
            g = x.view(t, k // self.pair, 1, self.pair)
            x = torch.cat([g, g * 16], dim=2).view(t, 2 * k)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.scale_zero)
        if self._slices is None:
            return y
        return torch.cat([y[:, a:b] for a, b in self._slices], dim=1)


# ---- the launchers the kernel contracts bind (minfer/kernels/cpu/matmul.fkc.md) ----


def int4_weight(w: torch.Tensor, n: int, k: int, qtype: GGMLType | int | str) -> Int4Matmul:
    """Load layout: a GGUF weight's raw bytes (any quantized type) -> its packed int4 form."""
    if isinstance(w, Int4Matmul):
        return w
    info = _qinfo(qtype)
    if info.type not in INT4_TYPES:
        raise UnsupportedError(f"int4_weight: {info.name} is not a quantized type (int4 forms: "
                               f"{', '.join(sorted(t.name for t in INT4_TYPES))})")
    if k % info.block_elems or w.dtype != torch.uint8 or w.numel() != info.nbytes(n * k):
        raise UnsupportedError(f"int4_weight: expected {info.nbytes(n * k) if k % info.block_elems == 0 else '?'} "
                               f"uint8 bytes of a [{n}, {k}] {info.name} weight (k a multiple of "
                               f"{info.block_elems}), got {w.dtype} x {w.numel()}")
    return Int4Matmul([pack_weight(w.reshape(n, -1), info.type, k)])


def int4pack_mm(x: torch.Tensor, w, n: int, k: int, qtype: GGMLType | int | str,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """out [m, n] bfloat16 = x [m, k] @ W^T on W's int4 form (`int4_weight`; raw bytes are packed
    on every call: correct, but a full pass over W each time)."""
    mm = int4_weight(w, n, k, qtype)
    return rows_call("int4pack_mm", x, k, mm, out)


def rows_call(what: str, x: torch.Tensor, k: int, mm, out: torch.Tensor | None) -> torch.Tensor:
    """mm(x as [m, k] rows) (x [k] is one row), copied into `out` when given: the cpu matmul
    launchers' shared call (x's shape and out's shape and dtype checked)."""
    x2 = x.reshape(1, -1) if x.dim() == 1 else x
    if x2.dim() != 2 or x2.shape[1] != k:
        raise UnsupportedError(f"{what}: x must be [m, {k}], got {tuple(x.shape)}")
    return into(what, mm(x2), out)


def into(what: str, y: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """y, or y copied into `out` (its shape and dtype checked): the cpu launchers' `out=`."""
    if out is None:
        return y
    if out.shape != y.shape or out.dtype != y.dtype:
        raise UnsupportedError(f"{what}: out must be {tuple(y.shape)} {y.dtype}, "
                               f"got {tuple(out.shape)} {out.dtype}")
    return out.copy_(y)


def _qinfo(qtype: GGMLType | int | str):
    if isinstance(qtype, str):
        return by_name(qtype)
    return QUANT_TABLE[GGMLType(int(qtype))]


def float_weight(w: torch.Tensor, n: int, k: int, qtype: GGMLType | int | str) -> torch.Tensor:
    """Load layout of the float kernels: a float weight's raw bytes -> float32 [n, k] (F32: a view
    of the bytes; F16: an exact float32 copy) or bfloat16 [n, k] (BF16: a view)."""
    if isinstance(w, torch.Tensor) and w.dtype in (torch.float32, torch.bfloat16):
        return w.view(n, k)
    t = _qinfo(qtype).type
    if t == GGMLType.F32:
        return w.reshape(-1).view(torch.float32).view(n, k)
    if t == GGMLType.BF16:
        return w.reshape(-1).view(torch.bfloat16).view(n, k)
    if t == GGMLType.F16:
        return w.reshape(-1).view(torch.float16).view(n, k).to(torch.float32)
    raise UnsupportedError(f"float_weight: {t.name} is not a float type (F32, F16, BF16)")


class _Linear:
    """y = x @ W^T on a float weight (float32 or bfloat16, see float_weight).

    sgemm's kernel and rounding depend on the row count, so decode rows run one at a time and
    prefill calls of fewer than MIN_GEMM_ROWS rows are padded to that many."""

    def __init__(self, w: torch.Tensor):
        self.w = w
        self.dtype = w.dtype
        self.nbytes = w.numel() * w.element_size()

    def __call__(self, x: torch.Tensor, decode: bool) -> torch.Tensor:
        x = x.to(self.dtype)
        rows = x.shape[0]
        if decode:  # one GEMV per row, whatever the batch holds
            ys = [F.linear(x[i:i + 1].clone(), self.w) for i in range(rows)]
            return ys[0] if rows == 1 else torch.cat(ys)
        if rows < MIN_GEMM_ROWS:
            x = torch.cat([x, x.new_zeros(MIN_GEMM_ROWS - rows, x.shape[1])])
            return F.linear(x, self.w)[:rows]
        return F.linear(x, self.w)


def linear(x: torch.Tensor, w: torch.Tensor, n: int, k: int, qtype: GGMLType | int | str,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """out [m, n] float32 = x [m, k] @ W^T for a float weight (`float_weight`'s layout, or raw bytes)."""
    x2 = x.reshape(1, -1) if x.dim() == 1 else x
    if x2.dim() != 2 or x2.shape[1] != k:
        raise UnsupportedError(f"linear: x must be [m, {k}], got {tuple(x.shape)}")
    y = _Linear(float_weight(w, n, k, qtype))(x2, decode=False).float()
    return y if out is None else out.copy_(y)
