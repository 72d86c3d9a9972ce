// ---- attention_merge.wgsl that also writes the int8 records (q8_act.wgsl) of its output for the
// o projection's qmv8 GEMV: each invocation merges 4 consecutive elements of the head (the same
// values: every element's own sum over the splits), 8 invocations a 32-block (q8_quad). head_dim a
// multiple of 32; row r's record of block h * head_dim / 32 + j. ----
struct Params { n_head: u32, hd: u32, ch: u32, n_split: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read> positions: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> q8o: array<u32>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wg: vec3<u32>) {
    let h = wg.x;
    let r = wg.y;
    let n_pos = u32(positions[r]) + 1u;
    let n_s = min((n_pos + P.ch - 1u) / P.ch, P.n_split);
    let pb = (r * P.n_head + h) * P.n_split * (P.hd + 2u);
    var mm = -3.0e38;
    for (var s = 0u; s < n_s; s++) { mm = max(mm, part[pb + s * (P.hd + 2u)]); }
    var l = 0.0;
    for (var s = 0u; s < n_s; s++) {
        let o = pb + s * (P.hd + 2u);
        l += part[o + 1u] * exp(part[o] - mm);
    }
    let ob = (r * P.n_head + h) * P.hd;
    for (var d0 = 0u; d0 < P.hd; d0 += 4u * WG) {  // workgroup-uniform bounds (q8_quad may use barriers)
        let d = d0 + 4u * lane.lid;
        let live = d < P.hd;
        var v = vec4<f32>();
        if (live) {
            for (var e = 0u; e < 4u; e++) {
                var a = 0.0;
                for (var s = 0u; s < n_s; s++) {
                    let o = pb + s * (P.hd + 2u);
                    a += part[o + 2u + d + e] * exp(part[o] - mm);
                }
                v[e] = a / l;
                out[ob + d + e] = v[e];
            }
        }
        q8_quad(v, ob / 32u + d / 32u, live, lane);
    }
}
