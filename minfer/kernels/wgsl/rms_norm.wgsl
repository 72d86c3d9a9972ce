// ---- out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w: one workgroup per row ----
struct Params { d: u32, x_off: u32, x_stride: u32, eps: f32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.x;
    let xo = P.x_off + row * P.x_stride;
    var ss = 0.0;
    for (var c = lane.lid; c < P.d; c += WG) { ss += x[xo + c] * x[xo + c]; }
    let rstd = inverseSqrt(seg_sum(ss, WG, lane) / f32(P.d) + P.eps);
    for (var c = lane.lid; c < P.d; c += WG) { out[row * P.d + c] = x[xo + c] * rstd * w[c]; }
}
