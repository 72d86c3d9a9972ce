// ---- out[r, c] = act(gate[r, c]) * up[r, c], act silu (GELU 0: SwiGLU) or gelu_tanh (GELU 1: GeGLU); gate and up
// may be column slices (row strides) ----
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
    let gv = gate[P.g_off + r * P.g_stride + c];
    var a = silu(gv);
    if (GELU != 0u) { a = gelu_tanh(gv); }
    out[r * P.d + c] = a * up[P.u_off + r * P.u_stride + c];
}
