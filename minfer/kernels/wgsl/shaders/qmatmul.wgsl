// ---- out[m, n] = x[m, :] . dequant(W[n, :]) for a GGUF weight W [N, K] (rows of whole blocks) ----
// A workgroup computes WG / TPR output columns n for TM rows m: TPR invocations per column walk
// its blocks (b = t, t + TPR, ...), each block decoded once per m row from the byte stream, and
// the column's partial sums are reduced with seg_sum (subgroups where the adapter has them).
// TM = 1 is the decode GEMV (the weight streamed once per token); TM > 1 the tiled prefill matmul
// (each weight block read once for TM rows of x). f32 accumulation. x is bound by qmatmul_x.wgsl
// (scalar loads: any offset) or qmatmul_x4.wgsl (vec4 loads: rows of x 16-byte aligned), which give
// the block dots xq(i) (x[i .. i + 3], i % 4 == 0) and xs(i) (x[i]).
struct Params {
    m: u32, n: u32, k: u32,
    x_off: u32, x_stride: u32,  // x[m, :] starts at x_off + m * x_stride
    out_off: u32, out_stride: u32,  // out[m, n] at out_off + m * out_stride + n (a column slice of a wider output)
    row_bytes: u32,
    groups_x: u32,  // workgroups along x (columns beyond 65535 workgroups wrap into z)
}
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = lane.lid % TPR;
    let col = (wg.z * P.groups_x + wg.x) * (WG / TPR) + lane.lid / TPR;
    let m0 = wg.y * TM;
    var acc: array<f32, TM>;
    if (col < P.n) {
        let base = col * P.row_bytes;
        let nb = P.k / BE;
        for (var b = t; b < nb; b += TPR) {
            for (var i = 0u; i < TM; i++) {
                if (m0 + i < P.m) { acc[i] += block_dot(base + b * BB, P.x_off + (m0 + i) * P.x_stride + b * BE); }
            }
        }
    }
    for (var i = 0u; i < TM; i++) {
        let s = seg_sum(acc[i], TPR, lane);
        if (t == 0u && col < P.n && m0 + i < P.m) { out[P.out_off + (m0 + i) * P.out_stride + col] = s; }
    }
}
