// ---- out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w: one workgroup per row (rms_sumsq.wgsl: the sum) ----
struct Params { d: u32, x_off: u32, x_stride: u32, eps: f32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.x;
    let xo = P.x_off + row * P.x_stride;
    let rstd = inverseSqrt(row_sumsq(xo, P.d, lane) / f32(P.d) + P.eps);
    for (var c0 = 4u * lane.lid; c0 < P.d; c0 += 16u * WG) {  // row_sumsq's rounds: the loads first
        var v = array<vec4<f32>, 4>();  // zeros past d, set each round (a bare `var` kept the last round's values on lavapipe)
        var g = array<vec4<f32>, 4>();
        for (var u = 0u; u < 4u; u++) {
            for (var e = 0u; e < 4u; e++) {
                let c = c0 + 4u * WG * u + e;
                if (c < P.d) { v[u][e] = x[xo + c]; g[u][e] = w[c]; }
            }
        }
        for (var u = 0u; u < 4u; u++) {
            for (var e = 0u; e < 4u; e++) {
                let c = c0 + 4u * WG * u + e;
                if (c < P.d) { out[row * P.d + c] = v[u][e] * rstd * g[u][e]; }
            }
        }
    }
}
