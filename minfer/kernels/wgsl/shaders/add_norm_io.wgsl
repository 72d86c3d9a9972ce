// ---- what add_rms_norm.wgsl and add_rms_norm_q8.wgsl share: the parameters, bindings 0-5 and rms_sumsq.wgsl's
// element hooks. h = x + y (add.wgsl's one f32 add) is what is normed; it goes to `hs`, a buffer of its own,
// never over x: the _q8 form's workgroups each read the whole row of x (wgsl.norm.add_rms_norm). x and y
// contiguous rows of d. ----
struct Params { d: u32, x_off: u32, y_off: u32, eps: f32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> hs: array<f32>;

fn norm_in(row: u32, c: u32) -> f32 { let i = row * P.d + c; return x[P.x_off + i] + y[P.y_off + i]; }
fn norm_put(row: u32, c: u32, h: f32, v: f32) { out[row * P.d + c] = v; hs[row * P.d + c] = h; }
