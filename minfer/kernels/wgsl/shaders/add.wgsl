// ---- out = x + y, elementwise over contiguous f32 ----
struct Params { n: u32, x_off: u32, y_off: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = g.y * nw.x * WG + g.x;
    if (i < P.n) { out[i] = x[P.x_off + i] + y[P.y_off + i]; }
}
