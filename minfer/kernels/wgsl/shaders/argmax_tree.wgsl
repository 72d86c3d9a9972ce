// ---- argmax's shared-memory tree on (value, index) pairs (argmax.wgsl, argmax_merge.wgsl) ----
const NONE: u32 = 0xffffffffu;  // an empty pair's index
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

// (best_v, best_i)[0] = the largest of the WG pairs, the smallest index of equal ones (NONE: empty).
fn argmax_tree(lid: u32) {
    var s = WG / 2u;
    loop {
        if (s == 0u) { break; }
        if (lid < s) {
            let ov = best_v[lid + s];
            let oi = best_i[lid + s];
            if (oi != NONE && (best_i[lid] == NONE || ov > best_v[lid] || (ov == best_v[lid] && oi < best_i[lid]))) {
                best_v[lid] = ov;
                best_i[lid] = oi;
            }
        }
        workgroupBarrier();
        s = s / 2u;
    }
}
