// ---- MoEMatMul: out[s, n] = x[s / XDIV, :] . dequant(W[ids[s] * N + n, :]) for the slots s of a step
// (s = t * k + j; XDIV = k: x [T, K] feeds every chosen expert of its row, XDIV = 1: x [T, k, K] one a
// slot), W the n_expert stacked [N, K] matrices of a 3-D expert tensor in its GGUF bytes. qmatmul.wgsl's
// walk (TPR invocations a column, each its blocks b = t, t + TPR, ...) with workgroup row y a slot:
// only the chosen experts' rows are read. Each slot's expert's bias added in the store (expert_bias:
// moe_bias.wgsl, gpt-oss; moe_no_bias.wgsl: 0). ----
struct Params {
    slots: u32, n: u32, k: u32,
    x_off: u32, xdiv: u32,
    row_bytes: u32,
    groups_x: u32,  // workgroups along x (columns beyond 65535 workgroups wrap into z)
}
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> ids: array<u32>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = lane.lid % TPR;
    let col = (wg.z * P.groups_x + wg.x) * (WG / TPR) + lane.lid / TPR;
    let s = wg.y;
    var acc = 0.0;
    if (col < P.n) {
        let base = (ids[s] * P.n + col) * P.row_bytes;
        let xo = P.x_off + s / P.xdiv * P.k;
        let nb = P.k / BE;
        for (var b = t; b < nb; b += TPR) { acc += block_dot(base + b * BB, xo + b * BE); }
    }
    let v = seg_sum(acc, TPR, lane);
    if (t == 0u && col < P.n) { out[s * P.n + col] = v + expert_bias(ids[s] * P.n + col); }
}
