// ---- attention_merge.wgsl that also writes the int8 records (q8_act.wgsl) of its output for the
// o projection's qmv8 GEMV: each invocation merges 4 consecutive elements of the head (the same
// values: every element's own sum over the splits), 8 invocations a 32-block (q8_quad). head_dim a
// multiple of 32; row r's record of block h * head_dim / 32 + j. merge_splits.wgsl: the records,
// bindings 0-3 and the merge. ----
@group(0) @binding(4) var<storage, read_write> q8o: array<u32>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wg: vec3<u32>) {
    let h = wg.x;
    let r = wg.y;
    let g = merge_stats(h, r);
    let ob = (r * P.n_head + h) * P.hd;
    for (var d0 = 0u; d0 < P.hd; d0 += 4u * WG) {  // workgroup-uniform bounds (q8_quad may use barriers)
        let d = d0 + 4u * lane.lid;
        let live = d < P.hd;
        var v = vec4<f32>();
        if (live) {
            for (var e = 0u; e < 4u; e++) {
                v[e] = merged(g, d + e);
                out[ob + d + e] = v[e];
            }
        }
        q8_quad(v, r, (h * P.hd + d) / 32u, P.n_head * P.hd / 32u, live, lane);
    }
}
