// ---- argmax, pass 1: workgroup (g, r) takes elements 4 WG g .. 4 WG (g + 1) of row r, 4 an
// invocation (coalesced: c = 4 WG g + e WG + lid, e = 0..3), then a shared-memory tree on (value,
// index); ties keep the smaller index. FINAL 1 (a row of one workgroup): out[r] = the index; else
// out[2 (r G + g)..] = (value bits, index), reduced by argmax_merge.wgsl. Many workgroups a row: a
// 152064-wide row is 149 of them, not 594 serial loads of one. ----
struct Params { width: u32, x_off: u32, x_stride: u32, groups: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let r = wg.y;
    let xo = P.x_off + r * P.x_stride;
    let c0 = wg.x * 4u * WG + lid;
    var v4 = vec4<f32>(-3.4e38);
    for (var e = 0u; e < 4u; e++) {  // the loads first: 4 in flight
        if (c0 + e * WG < P.width) { v4[e] = x[xo + c0 + e * WG]; }
    }
    var bv = -3.4e38;
    var bi = NONE;
    for (var e = 0u; e < 4u; e++) {
        let c = c0 + e * WG;
        if (c < P.width && (v4[e] > bv || bi == NONE)) { bv = v4[e]; bi = c; }  // c grows: a tie keeps the first
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    workgroupBarrier();
    argmax_tree(lid);
    if (lid == 0u) {
        if (FINAL == 1u) {
            out[r] = best_i[0];
        } else {
            let o = 2u * (r * P.groups + wg.x);
            out[o] = bitcast<u32>(best_v[0]);
            out[o + 1u] = best_i[0];
        }
    }
}
