// ---- out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w: one workgroup per row (rms_sumsq.wgsl: the math) ----
// With groups > 1 a "row" is one run of d values: run g of x's row r is row r * groups + g (the per-head q / k
// norms: d = head_dim, w shared by the runs); out is [rows * groups, d], contiguous. Workgroups (x, y) cover the
// n_rows rows (y past 65535 of them).
struct Params { d: u32, x_off: u32, x_stride: u32, eps: f32, groups: u32, n_rows: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

fn norm_in(row: u32, c: u32) -> f32 { return x[P.x_off + (row / P.groups) * P.x_stride + (row % P.groups) * P.d + c]; }
fn norm_put(row: u32, c: u32, h: f32, v: f32) { out[row * P.d + c] = v; }

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let row = wg.y * nw.x + wg.x;
    if (row >= P.n_rows) { return; }  // uniform: the whole workgroup leaves
    row_scale(row, row_rstd(row, lane), lane);
}
