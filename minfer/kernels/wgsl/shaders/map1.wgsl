// ---- out = op(x) elementwise over contiguous f32: OP 0 scale (x c), OP 1 soft-cap (c tanh(x / c)) ----
struct Params { n: u32, x_off: u32, c: f32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = g.y * nw.x * WG + g.x;
    if (i >= P.n) { return; }
    let v = x[P.x_off + i];
    if (OP == 0u) { out[i] = v * P.c; } else { out[i] = P.c * tanh_exp(v / P.c); }
}
