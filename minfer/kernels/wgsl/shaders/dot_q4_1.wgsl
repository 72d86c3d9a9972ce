// ---- Q4_1 block dot: d * sum(q * x) + m * sum(x), two vec4 dots per 32-bit load ----
fn nibbles_lo(q: u32) -> vec4<f32> {
    return vec4<f32>(f32(q & 15u), f32((q >> 8u) & 15u), f32((q >> 16u) & 15u), f32((q >> 24u) & 15u));
}
fn nibbles_hi(q: u32) -> vec4<f32> {
    return vec4<f32>(f32((q >> 4u) & 15u), f32((q >> 12u) & 15u), f32((q >> 20u) & 15u), f32(q >> 28u));
}
fn block_dot(wb: u32, xo: u32) -> f32 {
    var sq = 0.0;
    var sx = vec4<f32>(0.0);
    for (var w = 0u; w < 4u; w++) {
        let q = wq[(wb >> 2u) + 1u + w];  // 20-byte blocks: every field is 4-aligned
        let a = xq(xo + 4u * w);
        let b = xq(xo + 4u * w + 16u);
        sq += dot(nibbles_lo(q), a) + dot(nibbles_hi(q), b);
        sx += a + b;
    }
    let dm = unpack2x16float(wq[wb >> 2u]);
    return dm.x * sq + dm.y * (sx.x + sx.y + sx.z + sx.w);
}
