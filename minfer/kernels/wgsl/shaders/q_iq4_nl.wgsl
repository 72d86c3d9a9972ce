// ---- IQ4_NL: 18-byte blocks of 32: f16 d, 16 bytes of nibbles (low: elements 0..15, high: 16..31)
// indexing kvalues_iq4nl. x = d * kvalues[nibble] ----
const BE: u32 = 32u;
const BB: u32 = 18u;
fn elem(wb: u32, j: u32) -> f32 {
    let byte = ld8(wb + 2u + (j & 15u));
    return lut16(KV_IQ4, select(byte & 15u, byte >> 4u, j >= 16u)) * ldf16(wb);
}
