// ---- out[m, n] = x[m, :] . dequant(W[n, :]) for Q4_0 repacked into planes (repack_q4_0.wgsl) ----
// The decode GEMV (TM = 1) and the tiled prefill matmul (TM > 1). A lane group of TPR invocations
// computes NR consecutive output rows n (of W) for TM rows m of x; lane t takes whole blocks
// b = t, t + TPR, ...: per block ONE 16-byte load of each row's quants (the quant plane, 16-byte
// aligned: a warp reads TPR consecutive blocks, 16 x TPR contiguous bytes) and a 2-byte scale (the
// scale plane), and x's 32 values as 8 vec4 loads shared by the NR rows. Each accumulator sees the
// same sequence for any NR, TM and WG (TPR changes it), so the GEMV and the tiled matmul of a row
// agree bit for bit. The TPR lanes' sums are reduced with seg_sum.
// qmv_planes.wgsl: the parameters, bindings and grid.

// word w of a block's quants: low nibbles are elements 4w .. 4w + 3, high ones 16 + 4w .. (prelude's nibbles)
fn wdot(q: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    return dot(nibbles(q) - 8.0, xa) + dot(nibbles(q >> 4u) - 8.0, xb);
}

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wg: vec3<u32>) {
    let at = place(lane, wg);
    var acc: array<f32, NR * TM>;
    for (var b = at.t; b < at.nb; b += TPR) {
        var q: array<vec4<u32>, NR>;
        var d: array<f32, NR>;
        for (var c = 0u; c < NR; c++) {
            let blk = at.rb[c] + b;
            q[c] = wq[blk];
            d[c] = scale_q4_0(blk);
        }
        for (var i = 0u; i < TM; i++) {
            let xo = P.x_off + min(at.m0 + i, P.m - 1u) * P.x_stride + b * 32u;
            let v0 = xq(xo);
            let v1 = xq(xo + 4u);
            let v2 = xq(xo + 8u);
            let v3 = xq(xo + 12u);
            let v4 = xq(xo + 16u);
            let v5 = xq(xo + 20u);
            let v6 = xq(xo + 24u);
            let v7 = xq(xo + 28u);
            for (var c = 0u; c < NR; c++) {
                let s = wdot(q[c].x, v0, v4) + wdot(q[c].y, v1, v5) + wdot(q[c].z, v2, v6) + wdot(q[c].w, v3, v7);
                acc[c * TM + i] += d[c] * s;
            }
        }
    }
    for (var c = 0u; c < NR; c++) {
        for (var i = 0u; i < TM; i++) {
            put(at, c, i, seg_sum(acc[c * TM + i], TPR, lane));
        }
    }
}
