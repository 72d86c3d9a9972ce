// ---- attention_merge.wgsl that also writes the int8 records (q8_act.wgsl) of its output for the
// o projection's qmv8 GEMV: the head's merged values staged in workgroup memory, then one invocation
// per 32-block of the head quantizes it (head_dim a multiple of 32; row r's record of block
// h * head_dim / 32 + j). The same out values. ----
struct Params { n_head: u32, hd: u32, ch: u32, n_split: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read> positions: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> q8o: array<vec4<u32>>;

var<workgroup> hv: array<f32, 256>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
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
    for (var d = lid; d < P.hd; d += WG) {
        var a = 0.0;
        for (var s = 0u; s < n_s; s++) {
            let o = pb + s * (P.hd + 2u);
            a += part[o + 2u + d] * exp(part[o] - mm);
        }
        let v = a / l;
        out[(r * P.n_head + h) * P.hd + d] = v;
        hv[d] = v;
    }
    workgroupBarrier();
    let hb = P.hd / 32u;
    if (lid < hb) {
        var v: array<f32, 32>;
        for (var e = 0u; e < 32u; e++) { v[e] = hv[lid * 32u + e]; }
        q8_block(&v, (r * P.n_head + h) * hb + lid);
    }
}
