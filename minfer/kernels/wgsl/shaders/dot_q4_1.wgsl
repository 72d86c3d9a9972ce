// ---- Q4_1 block dot: d * sum(q * x) + m * sum(x), two vec4 dots per 32-bit load ----
fn block_dot(wb: u32, xo: u32) -> f32 {
    var sq = 0.0;
    var sx = vec4<f32>(0.0);
    for (var w = 0u; w < 4u; w++) {
        let q = wq[(wb >> 2u) + 1u + w];  // 20-byte blocks: every field is 4-aligned
        let a = xq(xo + 4u * w);
        let b = xq(xo + 4u * w + 16u);
        sq += dot(nibbles(q), a) + dot(nibbles(q >> 4u), b);
        sx += a + b;
    }
    let dm = unpack2x16float(wq[wb >> 2u]);
    return dm.x * sq + dm.y * (sx.x + sx.y + sx.z + sx.w);
}
