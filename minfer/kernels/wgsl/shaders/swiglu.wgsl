// ---- out[r, c] = silu(gate[r, c]) * up[r, c]; gate and up may be column slices (row strides) ----
struct Params { d: u32, rows: u32, g_off: u32, g_stride: u32, u_off: u32, u_stride: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let c = g.x;
    let r = g.y;
    if (c >= P.d) { return; }
    out[r * P.d + c] = silu(gate[P.g_off + r * P.g_stride + c]) * up[P.u_off + r * P.u_stride + c];
}
