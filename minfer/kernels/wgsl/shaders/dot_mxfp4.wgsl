// ---- MXFP4 block dot: 2^(e - 128) * sum(kvalues[q] * x), the nibble words read at any byte (ld32u) ----
fn block_dot(wb: u32, xo: u32) -> f32 {
    var s = 0.0;
    for (var w = 0u; w < 4u; w++) {
        let q = ld32u(wb + 1u + 4u * w);
        s += dot(lut16x4(KV_MXFP4, q), xq(xo + 4u * w)) + dot(lut16x4(KV_MXFP4, q >> 4u), xq(xo + 4u * w + 16u));
    }
    return e8m0_half(ld8(wb)) * s;
}
