// ---- Q4_1 quarter-block dot for qmv.wgsl (20-byte blocks: every field 4-aligned): quant word w
// holds elements 4w .. (low nibbles) and 16 + 4w .. (high); d * dot(q, x) + m * sum(x). ----
// part_load: the quarter's words (quants, d and m), part_use: its dot with x (loads-first qmv)
fn part_load(wb: u32, w: u32) -> vec4<u32> { let i = wb >> 2u; return vec4<u32>(wq[i + 1u + w], wq[i], 0u, 0u); }
fn part_use(v: vec4<u32>, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    let dm = unpack2x16float(v.y);
    let sx = xa + xb;
    return dm.x * (dot(nibbles(v.x), xa) + dot(nibbles(v.x >> 4u), xb)) + dm.y * (sx.x + sx.y + sx.z + sx.w);
}
fn part_dot(wb: u32, w: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32 { return part_use(part_load(wb, w), xa, xb); }
