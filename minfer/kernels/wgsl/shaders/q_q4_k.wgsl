// ---- Q4_K: 144-byte super-blocks of 256: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins,
// 128 bytes of nibbles. Eight sub-blocks of 32: x = d * scale_j * q - dmin * min_j.
// Elements 64c .. 64c+31 are the low nibbles of bytes 32c.., 64c+32 .. the high ones. ----
const BE: u32 = 256u;
const BB: u32 = 144u;
// (scale, min) of sub-block j: scale_min_k4 (quant_common.wgsl)
fn elem(wb: u32, j: u32) -> f32 {
    let c = j / 64u;
    let hi = (j % 64u) >= 32u;
    let byte = ld8(wb + 16u + 32u * c + (j % 32u));
    let q = select(byte & 15u, byte >> 4u, hi);
    let sm = scale_min_k4(wb, 2u * c + select(0u, 1u, hi));
    return ldf16(wb) * sm.x * f32(q) - ldf16(wb + 2u) * sm.y;
}
