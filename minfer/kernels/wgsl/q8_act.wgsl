// ---- activations quantized to int8 per 32-element block, for the int8-dot GEMVs (qmv8.wgsl) ----
// One record per (row, block) of x [m, k]: RV = 2 * P8 + 1 vec4<u32> words at (row * k / 32 + block) * RV:
//   words 0, 1: pass 1's 32 codes q1 = round(x / d1), d1 = max|x| / 127 (byte e = element e, signed);
//   words 2, 3 (P8 = 2): pass 2's codes q2 = round((x - d1 q1) / (d1 / 254)): the first rounding's error again;
//   word 2 * P8: (d, s, 0, 0) as f32 bits, x ~ d * c with c = q1 (d = d1) or 254 q1 + q2 (d = d1 / 254),
//   s = d * sum(c) (what a weight's offset multiplies: Q4_0's -8, Q4_1's min).
// The kernel that includes this declares `q8o: array<vec4<u32>>` (read_write) at a binding of its own.
const RV: u32 = 2u * P8 + 1u;

fn q8_block(v: ptr<function, array<f32, 32>>, rec: u32) {
    var amax = 0.0;
    for (var e = 0u; e < 32u; e++) { amax = max(amax, abs((*v)[e])); }
    let d1 = amax / 127.0;
    let id1 = select(0.0, 1.0 / d1, d1 > 0.0);
    var w1: array<u32, 8>;
    var w2: array<u32, 8>;
    var sum = 0i;
    for (var j = 0u; j < 8u; j++) {
        let x4 = vec4<f32>((*v)[4u * j], (*v)[4u * j + 1u], (*v)[4u * j + 2u], (*v)[4u * j + 3u]);
        let q1 = clamp(vec4<i32>(round(x4 * id1)), vec4<i32>(-127), vec4<i32>(127));
        w1[j] = pack4xI8(q1);
        if (P8 == 2u) {
            let q2 = clamp(vec4<i32>(round((x4 - d1 * vec4<f32>(q1)) * (254.0 * id1))), vec4<i32>(-127), vec4<i32>(127));
            w2[j] = pack4xI8(q2);
            let c = 254 * q1 + q2;
            sum += c.x + c.y + c.z + c.w;
        } else {
            sum += q1.x + q1.y + q1.z + q1.w;
        }
    }
    let d = select(d1, d1 / 254.0, P8 == 2u);
    let base = rec * RV;
    q8o[base] = vec4<u32>(w1[0], w1[1], w1[2], w1[3]);
    q8o[base + 1u] = vec4<u32>(w1[4], w1[5], w1[6], w1[7]);
    if (P8 == 2u) {
        q8o[base + 2u] = vec4<u32>(w2[0], w2[1], w2[2], w2[3]);
        q8o[base + 3u] = vec4<u32>(w2[4], w2[5], w2[6], w2[7]);
    }
    q8o[base + 2u * P8] = vec4<u32>(bitcast<u32>(d), bitcast<u32>(d * f32(sum)), 0u, 0u);
}
