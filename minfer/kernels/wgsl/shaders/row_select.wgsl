// ---- out[i, :] = x[rows[i], :] (x may be a column slice) ----
struct Params { width: u32, x_off: u32, x_stride: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> rows: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let c = g.x;
    let i = g.y;
    if (c >= P.width) { return; }
    out[i * P.width + c] = x[P.x_off + u32(rows[i]) * P.x_stride + c];
}
