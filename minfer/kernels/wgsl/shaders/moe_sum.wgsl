// ---- MoESum: out[r, c] = sum over j = 0..K-1, in that order, of w[r, j] * y[r, j, c] ----
struct Params { n: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let c = g.x;
    let r = g.y;
    if (c >= P.n) { return; }
    var acc = y[r * K * P.n + c] * w[r * K];
    for (var j = 1u; j < K; j++) { acc += y[(r * K + j) * P.n + c] * w[r * K + j]; }
    out[r * P.n + c] = acc;
}
