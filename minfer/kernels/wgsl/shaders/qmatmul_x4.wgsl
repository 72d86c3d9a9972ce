// ---- x for qmatmul.wgsl: vec4 loads (x's offset and row stride multiples of 4 elements) ----
@group(0) @binding(2) var<storage, read> x4: array<vec4<f32>>;
fn xs(i: u32) -> f32 { return x4[i >> 2u][i & 3u]; }
fn xq(i: u32) -> vec4<f32> { return x4[i >> 2u]; }
