// ---- Q4_0 block dot: d * sum((q - 8) * x), four nibble pairs per 32-bit load ----
fn block_dot(wb: u32, xo: u32) -> f32 {
    var s = 0.0;
    for (var w = 0u; w < 4u; w++) {
        let q = ld32(wb + 2u + 4u * w);
        for (var e = 0u; e < 4u; e++) {
            let byte = (q >> (8u * e)) & 0xffu;
            let i = xo + 4u * w + e;
            s += (f32(byte & 15u) - 8.0) * x[i] + (f32(byte >> 4u) - 8.0) * x[i + 16u];
        }
    }
    return ldf16(wb) * s;
}
