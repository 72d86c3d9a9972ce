// ---- out[r] = the index of row r's largest value (the first of equal ones): one workgroup per row ----
struct Params { width: u32, x_off: u32, x_stride: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<i32>;

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let r = wg.x;
    let xo = P.x_off + r * P.x_stride;
    var bv = -3.4e38;
    var bi = 0xffffffffu;
    for (var c = lid; c < P.width; c += WG) {
        let v = x[xo + c];
        if (v > bv || bi == 0xffffffffu) { bv = v; bi = c; }  // c grows: a tie keeps the first
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    workgroupBarrier();
    var s = WG / 2u;
    loop {
        if (s == 0u) { break; }
        if (lid < s) {
            let ov = best_v[lid + s];
            let oi = best_i[lid + s];
            if (oi != 0xffffffffu && (ov > best_v[lid] || (ov == best_v[lid] && oi < best_i[lid]) ||
                                      best_i[lid] == 0xffffffffu)) {
                best_v[lid] = ov;
                best_i[lid] = oi;
            }
        }
        workgroupBarrier();
        s = s / 2u;
    }
    if (lid == 0u) { out[r] = i32(best_i[0]); }
}
