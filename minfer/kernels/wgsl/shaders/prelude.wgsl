// ---- prelude: shared by every minfer WGSL kernel (minfer/kernels/wgpu/device.py assembles it) ----
// Every kernel is launched with a 1-D workgroup of WG invocations; `red` is its scratch for
// reductions. tree_sum is the shared-memory reduction every adapter can run.

var<workgroup> red: array<f32, WG>;

// The 4 nibbles at bits 0-3 of each byte of q (q >> 4: bits 4-7) as floats 0..15, each ORed into the
// mantissa of 2^23 and 2^23 subtracted: exact, f32(nibble)'s values without an int-to-float conversion
// (NVIDIA converts 16 values a clock an SM: a loop's bound where every weight took one).
fn nibbles(q: u32) -> vec4<f32> {
    let v = (vec4<u32>(q, q >> 8u, q >> 16u, q >> 24u) & vec4<u32>(15u)) | vec4<u32>(0x4B000000u);
    return bitcast<vec4<f32>>(v) - vec4<f32>(8388608.0);  // 2^23
}

// Sum of v over each run of `seg` consecutive invocations (seg a power of two dividing WG);
// every invocation of the run gets it. Call from workgroup-uniform control flow.
fn tree_sum(v: f32, seg: u32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    var s = seg / 2u;
    loop {
        if (s == 0u) { break; }
        if ((lid % seg) < s) { red[lid] += red[lid + s]; }
        workgroupBarrier();
        s = s / 2u;
    }
    let total = red[lid / seg * seg];
    workgroupBarrier();
    return total;
}

// Max of v over each run of `seg` consecutive invocations, as tree_sum.
fn tree_max(v: f32, seg: u32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    var s = seg / 2u;
    loop {
        if (s == 0u) { break; }
        if ((lid % seg) < s) { red[lid] = max(red[lid], red[lid + s]); }
        workgroupBarrier();
        s = s / 2u;
    }
    let total = red[lid / seg * seg];
    workgroupBarrier();
    return total;
}

fn f16_bits(bits: u32) -> f32 { return unpack2x16float(bits).x; }

fn silu(x: f32) -> f32 { return x / (1.0 + exp(-x)); }
// gelu_tanh(x) = x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), as x sigmoid(2u) (the same function;
// exp alone, where some drivers' tanh gives NaN for large arguments); tanh(t) = 2 sigmoid(2t) - 1 likewise
fn gelu_tanh(x: f32) -> f32 { return x / (1.0 + exp(-1.5957691216057308 * (x + 0.044715 * x * x * x))); }
fn tanh_exp(t: f32) -> f32 { return 2.0 / (1.0 + exp(-2.0 * t)) - 1.0; }
