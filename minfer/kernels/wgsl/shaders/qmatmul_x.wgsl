// ---- x for qmatmul.wgsl: f32 elements, any offset ----
@group(0) @binding(2) var<storage, read> x: array<f32>;
fn xs(i: u32) -> f32 { return x[i]; }
fn xq(i: u32) -> vec4<f32> { return vec4<f32>(x[i], x[i + 1u], x[i + 2u], x[i + 3u]); }
