// ---- Q5_K: 176-byte super-blocks of 256: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins
// (as Q4_K), 32 bytes of high bits (qh), 128 bytes of nibbles. Eight sub-blocks of 32:
// x = d * scale_j * q - dmin * min_j, q = nibble | bit j of qh[l] << 4 (l = element % 32).
// Elements 64c .. 64c+31 are the low nibbles of bytes 48+32c.., 64c+32 .. the high ones. ----
const BE: u32 = 256u;
const BB: u32 = 176u;
// (scale, min) of sub-block j: scale_min_k4 (quant_common.wgsl)
fn elem(wb: u32, j: u32) -> f32 {
    let c = j / 64u;
    let l = j % 32u;
    let byte = ld8(wb + 48u + 32u * c + l);
    let nib = select(byte & 15u, byte >> 4u, (j % 64u) >= 32u);
    let q = nib | (((ld8(wb + 16u + l) >> (j / 32u)) & 1u) << 4u);
    let sm = scale_min_k4(wb, j / 32u);
    return ldf16(wb) * sm.x * f32(q) - ldf16(wb + 2u) * sm.y;
}
