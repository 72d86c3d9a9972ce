// ---- out[m, n] = x[m, :] . dequant(W[n, :]) for a 32-element-block GGUF weight (Q4_0, Q4_1, Q8_0) ----
// The decode GEMV (TM = 1) and the tiled prefill matmul (TM > 1) with coalesced loads. A lane
// group of TPR invocations (TPR % 4 == 0) computes NC consecutive output columns n for TM rows
// m; lane t takes quarter w = t % 4 of blocks b = t / 4, t / 4 + TPR / 4, ... (so the group reads
// TPR / 4 consecutive blocks of a row at a time and x as contiguous 64-byte runs): the quarter's
// 8 elements (4w .. 4w + 3 and 16 + 4w .. 16 + 4w + 3, the type's `part_dot`) dotted with two
// vec4s of x, which are loaded once for the NC columns. U iterations are unrolled (their loads in
// flight together); the sequence each accumulator sees depends only on TPR, so TM, NC, U and WG
// change no result bit. The TPR lanes' sums are reduced with seg_sum.
// LF = 1 (loads first): the iterations where every lane of the group has its block (nb / QPB of
// them, the same for all lanes) run U at a time with no guard, each chunk's U x NC weight quarters
// and U x TM pairs of x vec4s loaded into registers before any is used (all in flight together);
// the rest as with LF = 0. Each accumulator sees the same sequence either way.
struct Params {
    m: u32, n: u32, k: u32,
    x_off: u32, x_stride: u32,
    out_off: u32, out_stride: u32,
    row_bytes: u32,
    groups_x: u32,
}
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const QPB: u32 = TPR / 4u;  // blocks a lane group reads per iteration

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = lane.lid % TPR;
    let w = t % 4u;
    let col0 = ((wg.z * P.groups_x + wg.x) * (WG / TPR) + lane.lid / TPR) * NC;
    let m0 = wg.y * TM;
    let nb = P.k / 32u;
    var base: array<u32, NC>;
    for (var c = 0u; c < NC; c++) { base[c] = min(col0 + c, P.n - 1u) * P.row_bytes; }  // past n: a repeat, not written
    var acc: array<f32, NC * TM>;
    var b_start = t / 4u;
    if (LF == 1u) {
        let chunks = nb / QPB / U;
        for (var j = 0u; j < chunks; j++) {
            let bj = t / 4u + j * QPB * U;
            var wv: array<vec4<u32>, U * NC>;
            var xa: array<vec4<f32>, U * TM>;
            var xb: array<vec4<f32>, U * TM>;
            for (var u = 0u; u < U; u++) {
                for (var c = 0u; c < NC; c++) { wv[u * NC + c] = part_load(base[c] + (bj + u * QPB) * BB, w); }
                for (var i = 0u; i < TM; i++) {
                    let xo = P.x_off + min(m0 + i, P.m - 1u) * P.x_stride + (bj + u * QPB) * 32u + 4u * w;
                    xa[u * TM + i] = xq(xo);
                    xb[u * TM + i] = xq(xo + 16u);
                }
            }
            for (var u = 0u; u < U; u++) {
                for (var i = 0u; i < TM; i++) {
                    for (var c = 0u; c < NC; c++) {
                        acc[c * TM + i] += part_use(wv[u * NC + c], xa[u * TM + i], xb[u * TM + i]);
                    }
                }
            }
        }
        b_start += chunks * QPB * U;
    }
    for (var b0 = b_start; b0 < nb; b0 += QPB * U) {
        for (var u = 0u; u < U; u++) {
            let b = b0 + u * QPB;
            if (b < nb) {
                for (var i = 0u; i < TM; i++) {
                    let xo = P.x_off + min(m0 + i, P.m - 1u) * P.x_stride + b * 32u + 4u * w;
                    let xa = xq(xo);
                    let xb = xq(xo + 16u);
                    for (var c = 0u; c < NC; c++) { acc[c * TM + i] += part_dot(base[c] + b * BB, w, xa, xb); }
                }
            }
        }
    }
    for (var c = 0u; c < NC; c++) {
        for (var i = 0u; i < TM; i++) {
            let s = seg_sum(acc[c * TM + i], TPR, lane);
            if (t == 0u && col0 + c < P.n && m0 + i < P.m) { out[P.out_off + (m0 + i) * P.out_stride + col0 + c] = s; }
        }
    }
}
