// ---- causal GQA attention, split over the context (flash-decoding), pass 1 of 2 ----
// Workgroup (head h, row r, split s) attends positions s * CH .. s * CH + CH - 1 (those <= the
// row's position; a split past it returns at once). The WG invocations form G = WG / TK key
// groups of TK lanes, each lane owning NV quads of head dims (lane t: 4 (t + TK u) .., u < NV;
// TK = the power of two >= head_dim / 4, at most 32, so a key's lanes sit in one subgroup of
// NVIDIA's 32: a key summed over two of them came out wrong there at head_dim 256; NV = the
// quads past that): group g scores keys c0 + g, c0 + g + G, ... (q . k as NV vec4s per lane, the
// TK lanes' sum by seg_sum) and keeps its own online softmax (max m, sum l, p.V in a vec4 per
// lane). The G groups are merged in workgroup memory and the split's (m, l, acc[head_dim]) is
// written to `part` [rows, n_head, n_split, head_dim + 2]; attention_merge.wgsl combines the
// splits. Every loop bound is uniform over the workgroup (seg_sum may use barriers). f32
// throughout; the chunking depends only on the cache's ctx, so a row's result does not depend on
// the other rows of the batch. window > 0: only the row's last `window` positions (a split wholly before them
// writes an empty record: m NEG, l 0); softcap > 0: scores s become softcap * tanh(s / softcap).
struct Params {
    n_head: u32, n_kv: u32, hd: u32, ctx: u32, base: u32,
    q_off: u32, q_stride: u32, scale: f32, ch: u32, n_split: u32, window: u32, softcap: f32,
}
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> cache_k: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> cache_v: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> row_slots: array<i32>;
@group(0) @binding(5) var<storage, read> positions: array<i32>;
@group(0) @binding(6) var<storage, read_write> part: array<f32>;

const G: u32 = WG / TK;
const NEG: f32 = -3.0e38;
var<workgroup> gm: array<f32, G>;
var<workgroup> gl: array<f32, G>;
var<workgroup> gacc: array<vec4<f32>, WG * NV>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wg: vec3<u32>) {
    let lid = lane.lid;
    let h = wg.x;
    let r = wg.y;
    let s = wg.z;
    let n_pos = u32(positions[r]) + 1u;
    let c0 = s * P.ch;
    if (c0 >= n_pos) { return; }  // uniform: the whole workgroup leaves
    let c1 = min(c0 + P.ch, n_pos);
    var first = c0;  // the split's first position the row sees
    if (P.window > 0u && n_pos > P.window) { first = min(max(c0, n_pos - P.window), c1); }
    let g = lid / TK;
    let t = lid % TK;
    let kvh = h / (P.n_head / P.n_kv);
    let base4 = (P.base + (u32(row_slots[r]) * P.n_kv + kvh) * P.ctx * P.hd) / 4u;  // hd % 4 == 0
    let hd4 = P.hd / 4u;
    var qv = array<vec4<f32>, NV>();  // lane t's dims: 4 (t + TK u) .. + 3, u = 0..NV-1
    for (var u = 0u; u < NV; u++) {
        let d = 4u * (t + TK * u);
        if (d < P.hd) {
            let qo = P.q_off + r * P.q_stride + h * P.hd + d;
            qv[u] = vec4<f32>(q[qo], q[qo + 1u], q[qo + 2u], q[qo + 3u]) * P.scale;
        }
    }
    var m = NEG;
    var l = 0.0;
    var acc = array<vec4<f32>, NV>();
    let n_iter = (c1 - first + G - 1u) / G;
    for (var j = 0u; j < n_iter; j++) {
        let p = first + j * G + g;
        var part_dot = 0.0;
        var vv = array<vec4<f32>, NV>();
        for (var u = 0u; u < NV; u++) {
            let c = t + TK * u;
            if (p < c1 && 4u * c < P.hd) {
                part_dot += dot(qv[u], cache_k[base4 + p * hd4 + c]);
                vv[u] = cache_v[base4 + p * hd4 + c];
            }
        }
        var sc = seg_sum(part_dot, TK, lane);
        if (P.softcap > 0.0) { sc = P.softcap * tanh_exp(sc / P.softcap); }
        if (p < c1) {
            let m_new = max(m, sc);
            let corr = exp(m - m_new);
            let w = exp(sc - m_new);
            l = l * corr + w;
            for (var u = 0u; u < NV; u++) { acc[u] = acc[u] * corr + w * vv[u]; }
            m = m_new;
        }
    }
    // merge the G groups
    if (t == 0u) { gm[g] = m; gl[g] = l; }
    for (var u = 0u; u < NV; u++) { gacc[lid * NV + u] = acc[u]; }
    workgroupBarrier();
    var mm = NEG;
    for (var i = 0u; i < G; i++) { mm = max(mm, gm[i]); }
    let out_base = ((r * P.n_head + h) * P.n_split + s) * (P.hd + 2u);
    if (g == 0u) {
        var ll = 0.0;
        for (var i = 0u; i < G; i++) { ll += gl[i] * exp(gm[i] - mm); }  // an empty group: m = NEG, l = 0, acc = 0
        for (var u = 0u; u < NV; u++) {
            var a = vec4<f32>(0.0);
            for (var i = 0u; i < G; i++) { a += gacc[(i * TK + t) * NV + u] * exp(gm[i] - mm); }
            let d = 4u * (t + TK * u);
            if (d < P.hd) {
                part[out_base + 2u + d] = a.x;
                part[out_base + 3u + d] = a.y;
                part[out_base + 4u + d] = a.z;
                part[out_base + 5u + d] = a.w;
            }
        }
        if (t == 0u) { part[out_base] = mm; part[out_base + 1u] = ll; }
    }
}
