// ---- causal GQA attention, pass 2 of 2: out[r, h, :] = the splits of attention_split.wgsl merged ----
// One workgroup per (head, row); the splits past the row's position were never written and are
// not read. out = sum_s acc_s * exp(m_s - M) / sum_s l_s * exp(m_s - M), M = max_s m_s.
struct Params { n_head: u32, hd: u32, ch: u32, n_split: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read> positions: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

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
        out[(r * P.n_head + h) * P.hd + d] = a / l;
    }
}
