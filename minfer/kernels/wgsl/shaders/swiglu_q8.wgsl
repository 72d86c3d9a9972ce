// ---- swiglu.wgsl that also writes the int8 records (q8_act.wgsl) of its rows: each invocation
// 4 consecutive elements (the same values as swiglu.wgsl), 8 invocations a block (q8_quad).
// d a multiple of 32. ----
struct Params { d: u32, rows: u32, g_off: u32, g_stride: u32, u_off: u32, u_stride: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> q8o: array<u32>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wg: vec3<u32>) {
    let c = (wg.x * WG + lane.lid) * 4u;
    let r = wg.y;
    let live = c < P.d;
    var v = vec4<f32>();
    if (live) {
        for (var e = 0u; e < 4u; e++) {
            v[e] = silu(gate[P.g_off + r * P.g_stride + c + e]) * up[P.u_off + r * P.u_stride + c + e];
            out[r * P.d + c + e] = v[e];
        }
    }
    q8_quad(v, r, c / 32u, P.d / 32u, live, lane);
}
