// ---- rotary embedding of x [rows, n_heads * head_dim] at positions, from cos/sin [n_ctx, n_rot/2] ----
// One invocation per (row, head, pair i): (a, b) = (x[2i], x[2i+1]) ("normal") or (x[i], x[i + n_rot/2])
// (NEOX) turns by angle i; dims from n_rot on are copied. x may be a column slice.
struct Params { n_heads: u32, head_dim: u32, n_rot: u32, neox: u32, x_off: u32, x_stride: u32, rows: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> pos: array<i32>;
@group(0) @binding(3) var<storage, read> cos_t: array<f32>;
@group(0) @binding(4) var<storage, read> sin_t: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let half_dim = P.head_dim / 2u;
    let i = g.x % half_dim;  // a pair (or, past n_rot / 2, two copied dims)
    let h = g.x / half_dim;
    let r = g.y;
    if (h >= P.n_heads) { return; }
    let xo = P.x_off + r * P.x_stride + h * P.head_dim;
    let oo = (r * P.n_heads + h) * P.head_dim;
    let half_rot = P.n_rot / 2u;
    if (i >= half_rot) {  // pass-through dims n_rot .. head_dim, two per invocation
        let j = P.n_rot + 2u * (i - half_rot);
        out[oo + j] = x[xo + j];
        out[oo + j + 1u] = x[xo + j + 1u];
        return;
    }
    var ia = 2u * i;
    var ib = 2u * i + 1u;
    if (P.neox != 0u) { ia = i; ib = i + half_rot; }
    let t = u32(pos[r]) * half_rot + i;
    let c = cos_t[t];
    let s = sin_t[t];
    let a = x[xo + ia];
    let b = x[xo + ib];
    out[oo + ia] = a * c - b * s;
    out[oo + ib] = a * s + b * c;
}
