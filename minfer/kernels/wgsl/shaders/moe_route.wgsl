// ---- MoERoute: (weights, ids) [rows, K] of router logits [rows, E]: one invocation a row (E <= 1024,
// K <= 64: K scans of the row). probs = softmax (GATING 0), sigmoid (1) or the logits (2, gpt-oss: the
// K chosen softmaxed); the K largest of probs + bias, largest first, the lower expert first among equal
// values (each scan takes the largest below the last chosen in that order); weights divided by their
// sum (NORM 1, the sum clamped at 2^-14) and times scale. ----
struct Params { rows: u32, e: u32, l_off: u32, l_stride: u32, scale: f32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> wout: array<f32>;
@group(0) @binding(4) var<storage, read_write> iout: array<u32>;

fn prob(l: f32, mx: f32, inv: f32) -> f32 {
    if (GATING == 0u) { return exp(l - mx) * inv; }
    if (GATING == 1u) { return 1.0 / (1.0 + exp(-l)); }
    return l;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let r = g.x;
    if (r >= P.rows) { return; }
    let base = P.l_off + r * P.l_stride;
    var mx = -3.4e38;
    for (var e = 0u; e < P.e; e++) { mx = max(mx, logits[base + e]); }
    var inv = 1.0;
    if (GATING == 0u) {
        var s = 0.0;
        for (var e = 0u; e < P.e; e++) { s += exp(logits[base + e] - mx); }
        inv = 1.0 / s;
    }
    var w: array<f32, K>;
    var last_v = 3.4e38;
    var last_i = 0xffffffffu;
    for (var j = 0u; j < K; j++) {
        var best_v = -3.4e38;
        var best_i = 0xffffffffu;
        for (var e = 0u; e < P.e; e++) {
            let v = prob(logits[base + e], mx, inv) + bias[e];
            let below = v < last_v || (v == last_v && (last_i == 0xffffffffu || e > last_i));
            if (below && (best_i == 0xffffffffu || v > best_v)) { best_v = v; best_i = e; }
        }
        if (best_i == 0xffffffffu) { best_i = min(j, P.e - 1u); }  // NaN rows: still an expert (the matmuls index with it)
        last_v = best_v;
        last_i = best_i;
        w[j] = prob(logits[base + best_i], mx, inv);
        iout[r * K + j] = best_i;
    }
    if (GATING == 2u) {
        var m = -3.4e38;
        for (var j = 0u; j < K; j++) { m = max(m, w[j]); }
        var s = 0.0;
        for (var j = 0u; j < K; j++) { w[j] = exp(w[j] - m); s += w[j]; }
        for (var j = 0u; j < K; j++) { w[j] = w[j] / s; }
    }
    var d = 1.0;
    if (NORM != 0u) {
        var s = 0.0;
        for (var j = 0u; j < K; j++) { s += w[j]; }
        d = max(s, 6.103515625e-5);
    }
    for (var j = 0u; j < K; j++) { wout[r * K + j] = w[j] / d * P.scale; }
}
