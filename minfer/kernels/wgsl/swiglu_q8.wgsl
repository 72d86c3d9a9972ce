// ---- swiglu.wgsl that also writes the int8 records (q8_act.wgsl) of its rows: one invocation per
// element as swiglu.wgsl (the same values), the workgroup's WG values staged in workgroup memory
// and its WG / 32 blocks quantized by as many invocations. d a multiple of 32, WG of 32. ----
struct Params { d: u32, rows: u32, g_off: u32, g_stride: u32, u_off: u32, u_stride: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> q8o: array<vec4<u32>>;

var<workgroup> hv: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let c = wg.x * WG + lid;
    let r = wg.y;
    if (c < P.d) {
        let v = silu(gate[P.g_off + r * P.g_stride + c]) * up[P.u_off + r * P.u_stride + c];
        out[r * P.d + c] = v;
        hv[lid] = v;
    }
    workgroupBarrier();
    let nb = P.d / 32u;
    let b = wg.x * (WG / 32u) + lid;
    if (lid < WG / 32u && b < nb) {
        var v: array<f32, 32>;
        for (var e = 0u; e < 32u; e++) { v[e] = hv[lid * 32u + e]; }
        q8_block(&v, r * nb + b);
    }
}
