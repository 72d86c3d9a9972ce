// ---- add_rms_norm.wgsl that also writes its rows' int8 records (q8_act.wgsl), split as rms_norm_q8.wgsl ----
// Workgroup (g, row) writes elements 4 WG g .. 4 WG (g + 1) of the row's h, out and records; each workgroup
// sums the whole row's squares itself from x + y (the inputs, never hs: another workgroup may be writing
// it), by rms_sumsq.wgsl's order. d a multiple of 32.
struct Params { d: u32, x_off: u32, y_off: u32, eps: f32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> hs: array<f32>;
@group(0) @binding(6) var<storage, read_write> q8o: array<u32>;

fn norm_in(row: u32, c: u32) -> f32 { let i = row * P.d + c; return x[P.x_off + i] + y[P.y_off + i]; }
fn norm_put(row: u32, c: u32, h: f32, v: f32) { out[row * P.d + c] = v; hs[row * P.d + c] = h; }

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.y;
    let rstd = row_rstd(row, lane);
    let c = (wg.x * WG + lane.lid) * 4u;
    let live = c < P.d;
    q8_quad(quad_scale(row, c, rstd, live), row, c / 32u, P.d / 32u, live, lane);
}
