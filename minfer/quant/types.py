"""The one table of ggml tensor types minfer knows.

Each row: ggml type id (as stored in GGUF), name, elements per block, bytes per block, and the
byte layout of one block. Everything else (reader validation, dequant dispatch, kernel
contracts, inspect output) derives from this table. Adding a quant type starts with one row.

Block layouts (little-endian; "f16" is an IEEE half; elements numbered 0..block_elems-1):

F32   1 elem  / 4 B    : f32
F16   1 elem  / 2 B    : f16
BF16  1 elem  / 2 B    : bf16 (upper half of an f32)
Q4_0  32 / 18 B   : d:f16 | qs[16]            x = d * (nib - 8); byte j: low nibble = elem j,
                                                high nibble = elem j+16
Q4_1  32 / 20 B   : d:f16 | m:f16 | qs[16]    x = d * nib + m (same nibble order as Q4_0)
Q5_0  32 / 22 B   : d:f16 | qh[4] | qs[16]    x = d * ((nib | hb << 4) - 16); hb of elem j is bit j
                                                of the u32 qh (j in 0..31)
Q5_1  32 / 24 B   : d:f16 | m:f16 | qh[4] | qs[16]   x = d * (nib | hb << 4) + m
Q8_0  32 / 34 B   : d:f16 | qs[32]:i8         x = d * q
Q2_K  256 / 84 B  : scales[16] | qs[64] | d:f16 | dmin:f16
                    16 sub-blocks of 16; scales byte: low 4 bits scale, high 4 bits min;
                    x = d * sc * q2 - dmin * mn
Q3_K  256 / 110 B : hmask[32] | qs[64] | scales[12] | d:f16
                    16 sub-blocks of 16; 6-bit signed scales (minus 32) packed in 12 bytes;
                    q3 = low 2 bits from qs, minus 4 where the hmask bit is clear; x = d * sc * q3
Q4_K  256 / 144 B : d:f16 | dmin:f16 | scales[12] | qs[128]
                    8 sub-blocks of 32; 6-bit scale and min per sub-block (get_scale_min_k4);
                    x = d * sc * nib - dmin * mn
Q5_K  256 / 176 B : d:f16 | dmin:f16 | scales[12] | qh[32] | qs[128]   as Q4_K with a 5th bit
Q6_K  256 / 210 B : ql[128] | qh[64] | scales[16]:i8 | d:f16
                    16 sub-blocks of 16; q6 = (4 low bits | 2 high bits << 4) - 32; x = d * sc * q6

The lookup types: a 4-bit code stands for one of 16 int8 values (`QuantInfo.lut`), nibbles in
Q4_0's order (byte j of a 32-element run: low nibble = elem j, high nibble = elem j+16).
IQ4_NL 32 / 18 B  : d:f16 | qs[16]            x = d * KVALUES_IQ4NL[nib]
IQ4_XS 256 / 136 B: d:f16 | scales_h:u16 | scales_l[4] | qs[128]
                    8 sub-blocks of 32 (qs of sub-block i at 16 i); 6-bit scale ls_i = low 4 bits
                    from nibble i % 2 of scales_l[i / 2] | bits 2i, 2i+1 of scales_h << 4;
                    x = (d * (ls_i - 32)) * KVALUES_IQ4NL[nib]
MXFP4  32 / 17 B  : e:u8 (E8M0) | qs[16]      x = 2^(e - 128) * KVALUES_MXFP4[nib]: OCP MX FP4
                    (e2m1) values doubled, the shared exponent halved, as ggml stores them
                    (ggml_e8m0_to_fp32_half: e < 2 gives the subnormals 2^-128, 2^-127)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class GGMLType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    IQ4_NL = 20
    IQ4_XS = 23
    BF16 = 30
    MXFP4 = 39


# the 16 values of a 4-bit code of the lookup types (ggml's kvalues_iq4nl and kvalues_mxfp4)
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
KVALUES_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # e2m1 x 2: the scale is 2^(e-128)


@dataclass(frozen=True)
class QuantInfo:
    type: GGMLType
    block_elems: int
    block_bytes: int
    contract_name: str  # the storage-type spelling kernel contracts use (seed 004: "Q4K", never "Q4_K_M")
    f16_offsets: tuple[int, ...] = ()  # byte offsets of the block's f16 scale fields (d, and m/dmin)
    e8m0_offsets: tuple[int, ...] = ()  # byte offsets of E8M0 shared-exponent bytes (MXFP4)
    lut: tuple[int, ...] = ()  # the lookup types: the int8 value of each 4-bit code (16 entries)

    @property
    def name(self) -> str:
        return self.type.name

    @property
    def bytes_per_elem(self) -> float:
        return self.block_bytes / self.block_elems

    def nbytes(self, n_elems: int) -> int:
        """Bytes of `n_elems` elements; n_elems must be a multiple of the block size."""
        if n_elems % self.block_elems:
            raise ValueError(f"{self.name}: {n_elems} elements is not a multiple of {self.block_elems}")
        return n_elems // self.block_elems * self.block_bytes


QUANT_TABLE: dict[GGMLType, QuantInfo] = {
    q.type: q
    for q in [
        QuantInfo(GGMLType.F32, 1, 4, "F32"),
        QuantInfo(GGMLType.F16, 1, 2, "F16"),
        QuantInfo(GGMLType.BF16, 1, 2, "BF16"),
        QuantInfo(GGMLType.Q4_0, 32, 18, "Q4_0", (0,)),
        QuantInfo(GGMLType.Q4_1, 32, 20, "Q4_1", (0, 2)),
        QuantInfo(GGMLType.Q5_0, 32, 22, "Q5_0", (0,)),
        QuantInfo(GGMLType.Q5_1, 32, 24, "Q5_1", (0, 2)),
        QuantInfo(GGMLType.Q8_0, 32, 34, "Q8_0", (0,)),
        QuantInfo(GGMLType.Q2_K, 256, 84, "Q2K", (80, 82)),
        QuantInfo(GGMLType.Q3_K, 256, 110, "Q3K", (108,)),
        QuantInfo(GGMLType.Q4_K, 256, 144, "Q4K", (0, 2)),
        QuantInfo(GGMLType.Q5_K, 256, 176, "Q5K", (0, 2)),
        QuantInfo(GGMLType.Q6_K, 256, 210, "Q6K", (208,)),
        QuantInfo(GGMLType.IQ4_NL, 32, 18, "IQ4_NL", (0,), lut=KVALUES_IQ4NL),
        QuantInfo(GGMLType.IQ4_XS, 256, 136, "IQ4_XS", (0,), lut=KVALUES_IQ4NL),
        QuantInfo(GGMLType.MXFP4, 32, 17, "MXFP4", e8m0_offsets=(0,), lut=KVALUES_MXFP4),
    ]
}


def quant_info(type_id: int) -> QuantInfo:
    """Row of the table for a ggml type id; UnsupportedError for unknown ids."""
    from ..errors import UnsupportedError

    try:
        return QUANT_TABLE[GGMLType(type_id)]
    except ValueError:
        known = ", ".join(f"{t.name}={int(t)}" for t in QUANT_TABLE)
        raise UnsupportedError(f"unknown ggml type id {type_id}; known: {known}") from None


def by_name(name: str) -> QuantInfo:
    """Row by name, accepting "Q4_K", "q4_k" or the contract spelling "Q4K"."""
    from ..errors import UnsupportedError

    key = name.upper()
    for q in QUANT_TABLE.values():
        if key in (q.name, q.contract_name):
            return q
    raise UnsupportedError(f"unknown quant type {name!r}; known: {', '.join(q.name for q in QUANT_TABLE.values())}")
