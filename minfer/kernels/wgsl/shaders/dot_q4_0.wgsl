// ---- Q4_0 block dot: d * sum((q - 8) * x); a 32-bit load holds 4 low nibbles (elements 4w..4w+3)
// and 4 high ones (elements 4w+16..4w+19): two vec4 dots per word ----
fn nibbles_lo(q: u32) -> vec4<f32> {
    return vec4<f32>(f32(q & 15u), f32((q >> 8u) & 15u), f32((q >> 16u) & 15u), f32((q >> 24u) & 15u));
}
fn nibbles_hi(q: u32) -> vec4<f32> {
    return vec4<f32>(f32((q >> 4u) & 15u), f32((q >> 12u) & 15u), f32((q >> 20u) & 15u), f32(q >> 28u));
}
fn block_dot(wb: u32, xo: u32) -> f32 {
    var s = 0.0;
    for (var w = 0u; w < 4u; w++) {
        let q = ld32(wb + 2u + 4u * w);
        s += dot(nibbles_lo(q) - 8.0, xq(xo + 4u * w)) + dot(nibbles_hi(q) - 8.0, xq(xo + 4u * w + 16u));
    }
    return ldf16(wb) * s;
}
