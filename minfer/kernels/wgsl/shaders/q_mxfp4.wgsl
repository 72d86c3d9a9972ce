// ---- MXFP4: 17-byte blocks of 32: an E8M0 exponent e, 16 bytes of nibbles (low: elements 0..15,
// high: 16..31) indexing the e2m1 values doubled. x = 2^(e - 128) * kvalues[nibble]; the blocks start
// at any byte (byte loads only) ----
const BE: u32 = 32u;
const BB: u32 = 17u;
fn elem(wb: u32, j: u32) -> f32 {
    let byte = ld8(wb + 1u + (j & 15u));
    return lut16(KV_MXFP4, select(byte & 15u, byte >> 4u, j >= 16u)) * e8m0_half(ld8(wb));
}
