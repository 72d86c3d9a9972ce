// ---- x [m, k] f32 (row-strided) -> its int8 records (q8_act.wgsl): one invocation per (row, 32-block) ----
struct Params { m: u32, k: u32, x_off: u32, x_stride: u32, groups_x: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> q8o: array<vec4<u32>>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let nb = P.k / 32u;
    let i = g.y * P.groups_x * WG + g.x;
    if (i >= P.m * nb) { return; }
    let row = i / nb;
    let xo = P.x_off + row * P.x_stride + (i % nb) * 32u;
    var v: array<f32, 32>;
    for (var e = 0u; e < 32u; e++) { v[e] = x[xo + e]; }
    q8_block(&v, i);
}
