// ---- what qmv4.wgsl and qmv8.wgsl share: the parameters, the weight's planes (repack_q4_0.wgsl,
// repack_q4_1.wgsl) and the output, and the grid: a lane group of TPR invocations computes NR
// consecutive output rows n (of W) for TM rows m of x, its lane t walking whole blocks t, t + TPR, ... ----
struct Params {
    m: u32, n: u32, k: u32,
    x_off: u32, x_stride: u32,  // qmv4's x (qmv8's comes as records)
    out_off: u32, out_stride: u32,
    d_off: u32,  // the scale plane's first word
    groups_x: u32,
}
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// a lane's place: its lane t in the group, the group's first row n (row0) and m (m0), the blocks per
// row (nb), and each of its NR rows' first block (rb; past n: a repeat of row n - 1, not written)
struct Place { t: u32, row0: u32, m0: u32, nb: u32, rb: array<u32, NR> }

fn place(lane: Lane, wg: vec3<u32>) -> Place {
    var w: Place;
    w.t = lane.lid % TPR;
    w.row0 = ((wg.z * P.groups_x + wg.x) * (WG / TPR) + lane.lid / TPR) * NR;
    w.m0 = wg.y * TM;
    w.nb = P.k / 32u;
    for (var c = 0u; c < NR; c++) { w.rb[c] = min(w.row0 + c, P.n - 1u) * w.nb; }
    return w;
}

// Q4_0's f16 scale of block blk: the half (blk & 1) of scale word d_off + blk / 2
fn scale_q4_0(blk: u32) -> f32 {
    let wi = P.d_off + (blk >> 1u);
    return f16_bits(wq[wi >> 2u][wi & 3u] >> ((blk & 1u) * 16u));
}

// lane group's sum v of output (row0 + c, m0 + i), written by lane 0 when inside [m, n]
fn put(at: Place, c: u32, i: u32, v: f32) {
    if (at.t == 0u && at.row0 + c < P.n && at.m0 + i < P.m) { out[P.out_off + (at.m0 + i) * P.out_stride + at.row0 + c] = v; }
}
