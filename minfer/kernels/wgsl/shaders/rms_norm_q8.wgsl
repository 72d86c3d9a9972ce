// ---- rms_norm.wgsl that also writes its rows' int8 records (q8_act.wgsl) for the next GEMV ----
// Workgroup (g, row) writes elements 4 WG g .. 4 WG (g + 1) of the row, each invocation 4 of them
// (q8_quad: 8 invocations a block, every block at once); each workgroup sums the whole row's squares
// itself, as rms_norm.wgsl does (rms_sumsq.wgsl: the same order, rstd and out values). No dispatch of
// its own for the GEMV's x. d a multiple of 32.
struct Params { d: u32, x_off: u32, x_stride: u32, eps: f32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> q8o: array<u32>;

fn norm_in(row: u32, c: u32) -> f32 { return x[P.x_off + row * P.x_stride + c]; }
fn norm_put(row: u32, c: u32, h: f32, v: f32) { out[row * P.d + c] = v; }
