// ---- Q4_1: 20-byte blocks of 32: f16 d, f16 m, 16 bytes of nibbles ----
// x = nibble * d + m
const BE: u32 = 32u;
const BB: u32 = 20u;
fn elem(wb: u32, j: u32) -> f32 {
    let byte = ld8(wb + 4u + (j & 15u));
    let q = select(byte & 15u, byte >> 4u, j >= 16u);
    return f32(q) * ldf16(wb) + ldf16(wb + 2u);
}
