// ---- IQ4_XS: 136-byte super-blocks of 256: f16 d, u16 scales_h, 4 bytes scales_l, 128 bytes of
// nibbles. Eight sub-blocks of 32 (nibbles at 8 + 16 i, low: elements 32 i .. + 15, high: + 16 ..):
// 6-bit scale ls_i = nibble i % 2 of scales_l[i / 2] | bits 2i, 2i+1 of scales_h << 4;
// x = (d * (ls_i - 32)) * kvalues_iq4nl[nibble] ----
const BE: u32 = 256u;
const BB: u32 = 136u;
fn iq4_xs_scale(wb: u32, i: u32) -> f32 {
    let ls = ((ld8(wb + 4u + i / 2u) >> (4u * (i % 2u))) & 15u) | (((ld16(wb + 2u) >> (2u * i)) & 3u) << 4u);
    return ldf16(wb) * f32(i32(ls) - 32);
}
fn elem(wb: u32, j: u32) -> f32 {
    let i = j / 32u;
    let l = j % 32u;
    let byte = ld8(wb + 8u + 16u * i + (l & 15u));
    return iq4_xs_scale(wb, i) * lut16(KV_IQ4, select(byte & 15u, byte >> 4u, l >= 16u));
}
