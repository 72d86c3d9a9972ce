// ---- Q2_K: 84-byte super-blocks of 256: 16 bytes of scales (low nibble: scale, high: min), 64
// bytes of 2-bit quants (qs), f16 d, f16 dmin. Sixteen sub-blocks of 16: x = d * scale_i * q -
// dmin * min_i. Element j: q = qs[32 (j / 128) + j % 32] >> 2 ((j % 128) / 32). ----
const BE: u32 = 256u;
const BB: u32 = 84u;
fn elem(wb: u32, j: u32) -> f32 {
    let q = (ld8(wb + 16u + 32u * (j / 128u) + j % 32u) >> (2u * ((j % 128u) / 32u))) & 3u;
    let s = ld8(wb + j / 16u);
    return ldf16(wb + 80u) * f32(s & 15u) * f32(q) - ldf16(wb + 82u) * f32(s >> 4u);
}
