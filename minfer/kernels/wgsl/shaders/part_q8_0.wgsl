// ---- Q8_0 quarter-block dot for qmv.wgsl: quant words w and w + 4 (bytes 2 + 4w .. and 18 + 4w ..,
// 2-byte aligned) hold elements 4w .. 4w + 3 and 16 + 4w ..; d * (dot(q_a, xa) + dot(q_b, xb)). ----
fn word_at(o: u32) -> u32 {
    let i = o >> 2u;
    let a = wq[i];
    let b = wq[i + 1u];
    return select(a, (a >> 16u) | (b << 16u), (o & 2u) != 0u);
}
fn i8x4(q: u32) -> vec4<f32> {
    return vec4<f32>(vec4<i32>(bitcast<i32>(q << 24u), bitcast<i32>(q << 16u), bitcast<i32>(q << 8u),
                               bitcast<i32>(q)) >> vec4<u32>(24u));
}
// part_load: the quarter's words (two of quants, scale bits), part_use: its dot with x (loads-first qmv)
fn part_load(wb: u32, w: u32) -> vec4<u32> {
    let o = wb + 2u + 4u * w;
    return vec4<u32>(word_at(o), word_at(o + 16u), ld16(wb), 0u);
}
fn part_use(v: vec4<u32>, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    return f16_bits(v.z) * (dot(i8x4(v.x), xa) + dot(i8x4(v.y), xb));
}
fn part_dot(wb: u32, w: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32 { return part_use(part_load(wb, w), xa, xb); }
