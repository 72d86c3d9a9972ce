// ---- Q4_1 block dot: d * sum(q * x) + m * sum(x) ----
fn block_dot(wb: u32, xo: u32) -> f32 {
    var sq = 0.0;
    var sx = 0.0;
    for (var w = 0u; w < 4u; w++) {
        let q = wq[(wb >> 2u) + 1u + w];  // 20-byte blocks: every field is 4-aligned
        for (var e = 0u; e < 4u; e++) {
            let byte = (q >> (8u * e)) & 0xffu;
            let i = xo + 4u * w + e;
            sq += f32(byte & 15u) * x[i] + f32(byte >> 4u) * x[i + 16u];
            sx += x[i] + x[i + 16u];
        }
    }
    let dm = unpack2x16float(wq[wb >> 2u]);
    return dm.x * sq + dm.y * sx;
}
