// ---- y[r, :] += b for every row r, in place (a projection's bias) ----
struct Params { n: u32, y_off: u32, y_stride: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let c = g.x;
    let r = g.y;
    if (c >= P.n) { return; }
    let i = P.y_off + r * P.y_stride + c;
    y[i] = y[i] + b[c];
}
