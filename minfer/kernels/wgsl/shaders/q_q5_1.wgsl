// ---- Q5_1: 24-byte blocks of 32: f16 d, f16 m, 4 bytes qh (bit j: element j's 5th bit), 16
// bytes of nibbles (low: elements 0..15, high: 16..31). x = (nibble | hb << 4) * d + m ----
const BE: u32 = 32u;
const BB: u32 = 24u;
fn elem(wb: u32, j: u32) -> f32 {
    let byte = ld8(wb + 8u + (j & 15u));
    let nib = select(byte & 15u, byte >> 4u, j >= 16u);
    let q = nib | (((ld32(wb + 4u) >> j) & 1u) << 4u);
    return f32(q) * ldf16(wb) + ldf16(wb + 2u);
}
