// ---- causal GQA attention of each row's q over positions 0..positions[row] of its slot's cache ----
// One workgroup per (head, row). Keys are visited in tiles of WG positions: each invocation scores
// one key of the tile (q . k * scale, q staged in workgroup memory), the tile's max updates the
// running max (online softmax, the accumulator rescaled), then every invocation adds the tile's
// weighted values for the dims it owns (d = lid, lid + WG, ...; head_dim <= 4 * WG). f32 throughout;
// a fixed visiting order, so the result is the same on every run. window > 0: only the row's last `window`
// positions; softcap > 0: scores s become softcap * tanh(s / softcap). SINKS 1: head h's sink logit
// (attn_sinks.wgsl) joins the max and the denominator after the last tile, adding no value.
struct Params {
    n_head: u32, n_kv: u32, hd: u32, ctx: u32, base: u32,
    q_off: u32, q_stride: u32, scale: f32, window: u32, softcap: f32,
}
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> cache_k: array<f32>;
@group(0) @binding(3) var<storage, read> cache_v: array<f32>;
@group(0) @binding(4) var<storage, read> row_slots: array<i32>;
@group(0) @binding(5) var<storage, read> positions: array<i32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

const MAX_HD: u32 = 4u * WG;
const NEG: f32 = -3.0e38;
var<workgroup> qs: array<f32, MAX_HD>;
var<workgroup> sc: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let h = wg.x;
    let r = wg.y;
    let kvh = h / (P.n_head / P.n_kv);
    let n_pos = u32(positions[r]) + 1u;
    var lo = 0u;
    if (P.window > 0u && n_pos > P.window) { lo = n_pos - P.window; }
    let base = P.base + (u32(row_slots[r]) * P.n_kv + kvh) * P.ctx * P.hd;
    for (var d = lid; d < P.hd; d += WG) { qs[d] = q[P.q_off + r * P.q_stride + h * P.hd + d]; }
    workgroupBarrier();
    var m = NEG;
    var l = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var p0 = lo; p0 < n_pos; p0 += WG) {
        let p = p0 + lid;
        var s = NEG;
        if (p < n_pos) {
            let ko = base + p * P.hd;
            var dot = 0.0;
            for (var d = 0u; d < P.hd; d++) { dot += qs[d] * cache_k[ko + d]; }
            s = dot * P.scale;
            if (P.softcap > 0.0) { s = P.softcap * tanh_exp(s / P.softcap); }
        }
        sc[lid] = s;
        workgroupBarrier();
        let n = min(WG, n_pos - p0);
        var mt = NEG;
        for (var j = 0u; j < n; j++) { mt = max(mt, sc[j]); }
        let m_new = max(m, mt);
        let corr = exp(m - m_new);
        l *= corr;
        for (var i = 0u; i < 4u; i++) { acc[i] *= corr; }
        for (var j = 0u; j < n; j++) {
            let w = exp(sc[j] - m_new);
            l += w;
            let vo = base + (p0 + j) * P.hd;
            for (var i = 0u; i < 4u; i++) {
                let d = lid + i * WG;
                if (d < P.hd) { acc[i] += w * cache_v[vo + d]; }
            }
        }
        m = m_new;
        workgroupBarrier();
    }
    if (SINKS != 0u) {
        let sk = sink_logit(h);
        let mf = max(m, sk);
        let c = exp(m - mf);
        l = l * c + exp(sk - mf);
        for (var i = 0u; i < 4u; i++) { acc[i] *= c; }
    }
    for (var i = 0u; i < 4u; i++) {
        let d = lid + i * WG;
        if (d < P.hd) { out[(r * P.n_head + h) * P.hd + d] = acc[i] / l; }
    }
}
