// ---- activations quantized to int8 per 32-element block, for the int8-dot GEMVs (qmv8.wgsl) ----
// Per (row, block) of x [m, k] RV = 2 * P8 + 1 vec4<u32> words, in planes: word w of block b of row r at
// (r * RV + w) * nb + b (nb = k / 32), so the lanes of a GEMV that take consecutive blocks load
// consecutive 16-byte words (one 512-byte run a warp, not 32 words at a record's stride: run 42's x loads
// touched ~5x the L1 lines the weights did):
//   words 0, 1: pass 1's 32 codes q1 = round(x / d1), d1 = max|x| / 127 (byte e = element e, signed);
//   words 2, 3 (P8 = 2): pass 2's codes q2 = round((x - d1 q1) / (d1 / 254)): the first rounding's error again;
//   word 2 * P8: (d, s, 0, 0) as f32 bits, x ~ d * c with c = q1 (d = d1) or 254 q1 + q2 (d = d1 / 254),
//   s = d * sum(c) (what a weight's offset multiplies: Q4_0's -8, Q4_1's min).
// A block is quantized by 8 consecutive invocations, each holding 4 of its elements: max|x| and
// sum(c) by seg_max / seg_sum over the 8 (the sum of integers below 2^24: exact in f32, any order),
// each invocation writing its own code words: every block at once, no invocation walks a block.
// The kernel that includes this declares `q8o: array<u32>` (read_write) at a binding of its own
// (qmv8.wgsl reads the same buffer as vec4 words), and calls q8_quad from workgroup-uniform
// control flow (the reductions may shuffle or use barriers): `live` false for the invocations
// past the data (their values ignored, nothing written; a block is wholly live or not).
const RV: u32 = 2u * P8 + 1u;

// the u32 index of component c of word w of (row, blk), nb blocks a row
fn q8_word(row: u32, blk: u32, nb: u32, w: u32, c: u32) -> u32 { return ((row * RV + w) * nb + blk) * 4u + c; }

// x4: elements 4j..4j+3 of block blk of the row (j = lane.lid % 8: the 8 invocations of a block are
// consecutive and start at a multiple of 8); nb blocks a row.
fn q8_quad(x4: vec4<f32>, row: u32, blk: u32, nb: u32, live: bool, lane: Lane) {
    let j = lane.lid % 8u;
    let a4 = abs(select(vec4<f32>(), x4, live));
    let amax = seg_max(max(max(a4.x, a4.y), max(a4.z, a4.w)), 8u, lane);
    let d1 = amax / 127.0;
    let id1 = select(0.0, 1.0 / d1, d1 > 0.0);
    let q1 = clamp(vec4<i32>(round(x4 * id1)), vec4<i32>(-127), vec4<i32>(127));
    var c = q1;
    var w2 = 0u;
    if (P8 == 2u) {
        let q2 = clamp(vec4<i32>(round((x4 - d1 * vec4<f32>(q1)) * (254.0 * id1))), vec4<i32>(-127), vec4<i32>(127));
        w2 = pack4xI8(q2);
        c = 254 * q1 + q2;
    }
    let sum = seg_sum(select(0.0, f32(c.x + c.y + c.z + c.w), live), 8u, lane);
    let d = select(d1, d1 / 254.0, P8 == 2u);
    if (live) {
        q8o[q8_word(row, blk, nb, j / 4u, j % 4u)] = pack4xI8(q1);
        if (P8 == 2u) { q8o[q8_word(row, blk, nb, 2u + j / 4u, j % 4u)] = w2; }
        if (j < 4u) { q8o[q8_word(row, blk, nb, 2u * P8, j)] = select(0u, bitcast<u32>(select(d, d * sum, j == 1u)), j < 2u); }
    }
}
