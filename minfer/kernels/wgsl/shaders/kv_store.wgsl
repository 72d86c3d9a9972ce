// ---- write each row's k and v [rows, n_kv * head_dim] at (its slot, its position) of a layer's cache ----
// cache [slots, n_kv, ctx, head_dim] f32 (from element `base` of the buffer); k, v may be column slices.
struct Params {
    n_kv: u32, hd: u32, ctx: u32, base: u32,
    k_off: u32, k_stride: u32, v_off: u32, v_stride: u32,
}
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read> row_slots: array<i32>;
@group(0) @binding(4) var<storage, read> positions: array<i32>;
@group(0) @binding(5) var<storage, read_write> cache_k: array<f32>;
@group(0) @binding(6) var<storage, read_write> cache_v: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let e = g.x;  // element of the row: kv head e / hd, dim e % hd
    let r = g.y;
    if (e >= P.n_kv * P.hd) { return; }
    let h = e / P.hd;
    let at = P.base + ((u32(row_slots[r]) * P.n_kv + h) * P.ctx + u32(positions[r])) * P.hd + e % P.hd;
    cache_k[at] = k[P.k_off + r * P.k_stride + e];
    cache_v[at] = v[P.v_off + r * P.v_stride + e];
}
