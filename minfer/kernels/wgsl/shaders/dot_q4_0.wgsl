// ---- Q4_0 block dot: d * sum((q - 8) * x); a 32-bit load holds 4 low nibbles (elements 4w..4w+3)
// and 4 high ones (elements 4w+16..4w+19): two vec4 dots per word ----
fn block_dot(wb: u32, xo: u32) -> f32 {
    var s = 0.0;
    for (var w = 0u; w < 4u; w++) {
        let q = ld32(wb + 2u + 4u * w);
        s += dot(nibbles(q) - 8.0, xq(xo + 4u * w)) + dot(nibbles(q >> 4u) - 8.0, xq(xo + 4u * w + 16u));
    }
    return ldf16(wb) * s;
}
