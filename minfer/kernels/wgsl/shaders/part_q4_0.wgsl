// ---- Q4_0 quarter-block dot for qmv.wgsl: quant word w (bytes 2 + 4w .., at 2-byte alignment:
// two aligned words and a funnel shift) holds elements 4w .. 4w + 3 (low nibbles) and 16 + 4w ..
// (high ones); d * (dot(lo - 8, xa) + dot(hi - 8, xb)). A nibble becomes a float by OR-ing it into
// the mantissa of 2^23 (no int-to-float conversion): exact, the same values as f32(q) - 8. ----
fn word_at(o: u32) -> u32 {
    let i = o >> 2u;
    let a = wq[i];
    let b = wq[i + 1u];
    return select(a, (a >> 16u) | (b << 16u), (o & 2u) != 0u);
}
// part_load: the quarter's words (quants, scale bits), part_use: its dot with x (loads-first qmv)
fn part_load(wb: u32, w: u32) -> vec4<u32> { return vec4<u32>(word_at(wb + 2u + 4u * w), ld16(wb), 0u, 0u); }
fn part_use(v: vec4<u32>, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    return f16_bits(v.y) * (dot(nibbles(v.x) - 8.0, xa) + dot(nibbles(v.x >> 4u) - 8.0, xb));
}
fn part_dot(wb: u32, w: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32 { return part_use(part_load(wb, w), xa, xb); }
