// ---- Q6_K: 210-byte super-blocks of 256: 128 bytes of low nibbles (ql), 64 bytes of 2-bit highs
// (qh), 16 signed 8-bit scales, f16 d. x = d * scale * (q - 32), q = 6 bits. ----
const BE: u32 = 256u;
const BB: u32 = 210u;
fn elem(wb: u32, j: u32) -> f32 {
    let n = j / 128u;
    let g = (j % 128u) / 32u;
    let l = j % 32u;
    let lo_byte = ld8(wb + 64u * n + l + (g & 1u) * 32u);
    let lo = select(lo_byte & 15u, lo_byte >> 4u, g >= 2u);
    let hi = (ld8(wb + 128u + 32u * n + l) >> (2u * g)) & 3u;
    let q = f32(i32(lo | (hi << 4u)) - 32);
    let sc = f32(bitcast<i32>(ld8(wb + 192u + 8u * n + l / 16u + 2u * g) << 24u) >> 24u);
    return ldf16(wb + 208u) * sc * q;
}
