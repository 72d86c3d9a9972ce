// ---- RMSNorm's row math, shared by rms_norm(_q8).wgsl and add_rms_norm(_q8).wgsl: one order of float ops, so
// the same rstd and the same out values whichever of them runs (the fused kernel's bit-equal to add then rms_norm) ----
// The kernel that includes this declares Params (with d and eps) and the weight `w`, and defines
//   fn norm_in(row: u32, c: u32) -> f32: element c of the row normed (rms_norm: x; add_rms_norm: x + y, the one
//     f32 add the add kernel makes);
//   fn norm_put(row: u32, c: u32, h: f32, v: f32): stores v = h * rstd * w[c] (add_rms_norm: h too).

// The row's sum of squares in rounds of 16 WG elements: invocation lid takes the quads at 4 lid + 4 WG u (u = 0..3),
// its 16 loads issued before any is summed (a 7B row of 3584 is one round at WG 256, not 28 dependent loads), then
// the workgroup's seg_sum. Call from workgroup-uniform control flow.
fn row_sumsq(row: u32, lane: Lane) -> f32 {
    var ss = 0.0;
    for (var c0 = 4u * lane.lid; c0 < P.d; c0 += 16u * WG) {
        var v = array<vec4<f32>, 4>();  // zeros past d, set each round (a bare `var` kept the last round's values on lavapipe)
        for (var u = 0u; u < 4u; u++) {
            for (var e = 0u; e < 4u; e++) {
                let c = c0 + 4u * WG * u + e;
                if (c < P.d) { v[u][e] = norm_in(row, c); }
            }
        }
        for (var u = 0u; u < 4u; u++) { ss += (v[u].x * v[u].x + v[u].y * v[u].y) + (v[u].z * v[u].z + v[u].w * v[u].w); }
    }
    return seg_sum(ss, WG, lane);
}

fn row_rstd(row: u32, lane: Lane) -> f32 { return inverseSqrt(row_sumsq(row, lane) / f32(P.d) + P.eps); }

// One workgroup's whole row scaled, in row_sumsq's rounds (each element by the invocation that read it there).
fn row_scale(row: u32, rstd: f32, lane: Lane) {
    for (var c0 = 4u * lane.lid; c0 < P.d; c0 += 16u * WG) {  // the loads first
        var v = array<vec4<f32>, 4>();
        var g = array<vec4<f32>, 4>();
        for (var u = 0u; u < 4u; u++) {
            for (var e = 0u; e < 4u; e++) {
                let c = c0 + 4u * WG * u + e;
                if (c < P.d) { v[u][e] = norm_in(row, c); g[u][e] = w[c]; }
            }
        }
        for (var u = 0u; u < 4u; u++) {
            for (var e = 0u; e < 4u; e++) {
                let c = c0 + 4u * WG * u + e;
                if (c < P.d) { norm_put(row, c, v[u][e], v[u][e] * rstd * g[u][e]); }
            }
        }
    }
}

// Elements c .. c + 3 of the row scaled (the _q8 kernels: 4 an invocation, the row over many workgroups); zeros
// where not live.
fn quad_scale(row: u32, c: u32, rstd: f32, live: bool) -> vec4<f32> {
    var v = vec4<f32>();
    if (live) {
        for (var e = 0u; e < 4u; e++) {
            let h = norm_in(row, c + e);
            v[e] = h * rstd * w[c + e];
            norm_put(row, c + e, h, v[e]);
        }
    }
    return v;
}
