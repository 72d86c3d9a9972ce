// ---- the residual add and the RMSNorm after it, one workgroup per row: h = x + y (add.wgsl's sum) into `hs`,
// out = h * rsqrt(mean(h^2) + eps) * w (rms_sumsq.wgsl: rms_norm.wgsl's math on h) ----
// h goes to a buffer of its own, never over x: the _q8 form's workgroups each read the whole row of x
// (wgsl_ops.add_rms_norm). x and y contiguous rows of d.
struct Params { d: u32, x_off: u32, y_off: u32, eps: f32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> hs: array<f32>;

fn norm_in(row: u32, c: u32) -> f32 { let i = row * P.d + c; return x[P.x_off + i] + y[P.y_off + i]; }
fn norm_put(row: u32, c: u32, h: f32, v: f32) { out[row * P.d + c] = v; hs[row * P.d + c] = h; }

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wg: vec3<u32>) {
    row_scale(wg.x, row_rstd(wg.x, lane), lane);
}
