// ---- rms_norm.wgsl that also writes its rows' int8 records (q8_act.wgsl) for the next GEMV ----
// The same out values, written as rms_norm.wgsl writes them (element c by invocation c % WG); each
// round's WG values are staged in workgroup memory and its WG / 32 blocks quantized by as many
// invocations: no dispatch of its own for the GEMV's x. d a multiple of 32, WG of 32.
struct Params { d: u32, x_off: u32, x_stride: u32, eps: f32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> q8o: array<vec4<u32>>;

var<workgroup> hv: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.x;
    let xo = P.x_off + row * P.x_stride;
    var ss = 0.0;
    for (var c = lane.lid; c < P.d; c += WG) { ss += x[xo + c] * x[xo + c]; }
    let rstd = inverseSqrt(seg_sum(ss, WG, lane) / f32(P.d) + P.eps);
    let nb = P.d / 32u;
    for (var c0 = 0u; c0 < P.d; c0 += WG) {  // workgroup-uniform: every invocation reaches the barriers
        let c = c0 + lane.lid;
        if (c < P.d) {
            let v = x[xo + c] * rstd * w[c];
            out[row * P.d + c] = v;
            hv[lane.lid] = v;
        }
        workgroupBarrier();
        let b = c0 / 32u + lane.lid;
        if (lane.lid < WG / 32u && b < nb) {
            var v: array<f32, 32>;
            for (var e = 0u; e < 32u; e++) { v[e] = hv[lane.lid * 32u + e]; }
            q8_block(&v, row * nb + b);
        }
        workgroupBarrier();
    }
}
