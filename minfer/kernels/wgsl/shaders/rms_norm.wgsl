// ---- out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w: one workgroup per row (rms_sumsq.wgsl: the math) ----
struct Params { d: u32, x_off: u32, x_stride: u32, eps: f32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

fn norm_in(row: u32, c: u32) -> f32 { return x[P.x_off + row * P.x_stride + c]; }
fn norm_put(row: u32, c: u32, h: f32, v: f32) { out[row * P.d + c] = v; }

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wg: vec3<u32>) {
    row_scale(wg.x, row_rstd(wg.x, lane), lane);
}
