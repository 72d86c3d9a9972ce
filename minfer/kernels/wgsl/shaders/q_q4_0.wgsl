// ---- Q4_0: 18-byte blocks of 32: f16 d, 16 bytes of nibbles (low: elements 0..15, high: 16..31) ----
// x = (nibble - 8) * d
const BE: u32 = 32u;
const BB: u32 = 18u;
fn elem(wb: u32, j: u32) -> f32 {
    let byte = ld8(wb + 2u + (j & 15u));
    let q = select(byte & 15u, byte >> 4u, j >= 16u);
    return (f32(q) - 8.0) * ldf16(wb);
}
