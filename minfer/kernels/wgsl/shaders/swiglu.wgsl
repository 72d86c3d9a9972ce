// ---- out[r, c] = act(gate[r, c]) * up[r, c], act silu (ACT 0: SwiGLU) or gelu_tanh (ACT 1: GeGLU); ACT 2:
// gpt-oss's clamped SwiGLU, g sigmoid(ALPHA g) (u + 1) with g = min(gate, LIMIT), u = clamp(up, -LIMIT, LIMIT)
// (ALPHA, LIMIT: constants of the variant). gate and up may be column slices (row strides) ----
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
    let uv = up[P.u_off + r * P.u_stride + c];
    if (ACT == 2u) {
        let g = min(gv, LIMIT);
        out[r * P.d + c] = g / (1.0 + exp(-ALPHA * g)) * (clamp(uv, -LIMIT, LIMIT) + 1.0);
        return;
    }
    var a = silu(gv);
    if (ACT == 1u) { a = gelu_tanh(gv); }
    out[r * P.d + c] = a * uv;
}
