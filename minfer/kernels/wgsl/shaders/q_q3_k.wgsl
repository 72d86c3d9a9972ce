// ---- Q3_K: 110-byte super-blocks of 256: 32 bytes hmask, 64 bytes of 2-bit lows (qs), 12 bytes
// of 6-bit scales, f16 d. Sixteen sub-blocks of 16: x = d * (scale_i - 32) * q, q = low2 | hbit << 2,
// minus 4 (-4..3). Element j: low2 = qs[32 (j / 128) + j % 32] >> 2 ((j % 128) / 32), hbit = bit
// j / 32 of hmask[j % 32]. Scale i: low 4 bits from byte i % 8 (high nibble for i >= 8), high 2 bits
// from byte 8 + i % 4 at bit 2 (i / 4). ----
const BE: u32 = 256u;
const BB: u32 = 110u;
fn elem(wb: u32, j: u32) -> f32 {
    let l = j % 32u;
    let low2 = (ld8(wb + 32u + 32u * (j / 128u) + l) >> (2u * ((j % 128u) / 32u))) & 3u;
    let hbit = (ld8(wb + l) >> (j / 32u)) & 1u;
    let q = f32(i32(low2 | (hbit << 2u)) - 4);
    let i = j / 16u;
    let lb = ld8(wb + 96u + (i % 8u));
    let low4 = select(lb & 15u, lb >> 4u, i >= 8u);
    let high2 = (ld8(wb + 104u + (i % 4u)) >> (2u * (i / 4u))) & 3u;
    let sc = f32(i32(low4 | (high2 << 4u)) - 32);
    return ldf16(wb + 108u) * sc * q;
}
