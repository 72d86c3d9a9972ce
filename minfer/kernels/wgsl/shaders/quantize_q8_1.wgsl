// ---- x [m, k] f32 (row-strided) -> its int8 records (q8_act.wgsl): one invocation per 4 elements,
// 8 per (row, 32-block) ----
struct Params { m: u32, k: u32, x_off: u32, x_stride: u32, groups_x: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> q8o: array<u32>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wg: vec3<u32>) {
    let kq = P.k / 4u;
    let i = (wg.y * P.groups_x + wg.x) * WG + lane.lid;  // the quad: row i / kq, elements 4 (i % kq)..
    let live = i < P.m * kq;
    let row = min(i / kq, P.m - 1u);
    let c = (i % kq) * 4u;
    let xo = P.x_off + row * P.x_stride + c;
    var v = vec4<f32>();
    if (live) { v = vec4<f32>(x[xo], x[xo + 1u], x[xo + 2u], x[xo + 3u]); }
    q8_quad(v, row, c / 32u, P.k / 32u, live, lane);  // uniform: no invocation returned
}
