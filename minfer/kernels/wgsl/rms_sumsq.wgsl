// ---- a row's sum of squares, shared by rms_norm.wgsl and rms_norm_q8.wgsl (one order: the same rstd,
// the same out values) ----
// Rounds of 16 WG elements: invocation lid takes the quads at 4 lid + 4 WG u (u = 0..3), its 16 loads
// issued before any is summed (a 7B row of 3584 is one round at WG 256, not 28 dependent loads), then
// the workgroup's seg_sum. Call from workgroup-uniform control flow.
fn row_sumsq(xo: u32, d: u32, lane: Lane) -> f32 {
    var ss = 0.0;
    for (var c0 = 4u * lane.lid; c0 < d; c0 += 16u * WG) {
        var v = array<vec4<f32>, 4>();  // zeros past d, set each round (a bare `var` kept the last round's values on lavapipe)
        for (var u = 0u; u < 4u; u++) {
            for (var e = 0u; e < 4u; e++) {
                let c = c0 + 4u * WG * u + e;
                if (c < d) { v[u][e] = x[xo + c]; }
            }
        }
        for (var u = 0u; u < 4u; u++) { ss += (v[u].x * v[u].x + v[u].y * v[u].y) + (v[u].z * v[u].z + v[u].w * v[u].w); }
    }
    return seg_sum(ss, WG, lane);
}
