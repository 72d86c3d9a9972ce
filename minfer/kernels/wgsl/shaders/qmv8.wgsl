// ---- out[m, n] = x[m, :] . dequant(W[n, :]) with int8 dot products: W Q4_0 / Q4_1 repacked into planes
// (repack_q4_0.wgsl, repack_q4_1.wgsl), x as int8 records (q8_act.wgsl: P8 passes per 32-block) ----
// qmv4.wgsl's grid and walk (a lane group of TPR invocations computes NR rows n for TM rows m; lane t
// takes whole blocks b = t, t + TPR, ..., U of them loaded before any is used): per block ONE 16-byte
// load of each row's quants and its scale word, x's block as 2 (P8 1) or 4 (P8 2) 16-byte code
// loads and one of (d, s), shared by the NR rows. A quant word's low nibbles (w & 0x0F0F0F0F) are
// elements 4j..4j+3 of the block and its high ones elements 16+4j.., the bytes of code words j and
// 4+j: 8 dot4I8Packed per pass, exact in i32. Per row and block, QT 0 (Q4_0, q - 8):
// acc += d_w (d_x isum - 8 s_x); QT 1 (Q4_1, d q + m): acc += d_w d_x isum + m_w s_x. Each
// accumulator sees the same sequence for any NR, TM, U and WG (TPR changes it): the GEMV and the
// tiled matmul of a row agree bit for bit. qmv_planes.wgsl: the parameters, bindings and grid.
@group(0) @binding(2) var<storage, read> xr: array<vec4<u32>>;

const RV: u32 = 2u * P8 + 1u;
const M4: u32 = 0x0F0F0F0Fu;

fn idot(q: vec4<u32>, a: vec4<u32>, b: vec4<u32>) -> i32 {
    return dot4I8Packed(q.x & M4, a.x) + dot4I8Packed(q.y & M4, a.y) + dot4I8Packed(q.z & M4, a.z)
         + dot4I8Packed(q.w & M4, a.w) + dot4I8Packed((q.x >> 4u) & M4, b.x) + dot4I8Packed((q.y >> 4u) & M4, b.y)
         + dot4I8Packed((q.z >> 4u) & M4, b.z) + dot4I8Packed((q.w >> 4u) & M4, b.w);
}

// the (scale, offset) of block blk: Q4_0 an f16 half-word (offset -8 applied through s), Q4_1 (d, m)
fn scales(blk: u32) -> vec2<f32> {
    if (QT == 0u) {
        return vec2<f32>(scale_q4_0(blk), 0.0);
    }
    let wi = P.d_off + blk;
    return unpack2x16float(wq[wi >> 2u][wi & 3u]);
}

@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wg: vec3<u32>) {
    let at = place(lane, wg);
    var acc: array<f32, NR * TM>;
    for (var b0 = at.t; b0 < at.nb; b0 += TPR * U) {
        var q: array<vec4<u32>, NR * U>;
        var s: array<vec2<f32>, NR * U>;
        for (var u = 0u; u < U; u++) {  // every load of the U blocks first (a block past nb: a repeat, unused)
            let b = min(b0 + u * TPR, at.nb - 1u);
            for (var c = 0u; c < NR; c++) {
                q[u * NR + c] = wq[at.rb[c] + b];
                s[u * NR + c] = scales(at.rb[c] + b);
            }
        }
        for (var u = 0u; u < U; u++) {
            let b = b0 + u * TPR;
            if (b >= at.nb) { break; }
            for (var i = 0u; i < TM; i++) {
                let r = min(at.m0 + i, P.m - 1u) * RV * at.nb + b;  // word 0 of (row, b): the planes at nb apart
                let a1 = xr[r];
                let b1 = xr[r + at.nb];
                var a2 = vec4<u32>();
                var b2 = vec4<u32>();
                if (P8 == 2u) { a2 = xr[r + 2u * at.nb]; b2 = xr[r + 3u * at.nb]; }
                let ds = bitcast<vec2<f32>>(xr[r + 2u * P8 * at.nb].xy);
                for (var c = 0u; c < NR; c++) {
                    let w = q[u * NR + c];
                    var isum = idot(w, a1, b1);
                    if (P8 == 2u) { isum = 254 * isum + idot(w, a2, b2); }
                    let sc = s[u * NR + c];
                    if (QT == 0u) {
                        acc[c * TM + i] += sc.x * (ds.x * f32(isum) - 8.0 * ds.y);
                    } else {
                        acc[c * TM + i] += sc.x * ds.x * f32(isum) + sc.y * ds.y;
                    }
                }
            }
        }
    }
    for (var c = 0u; c < NR; c++) {
        for (var i = 0u; i < TM; i++) {
            put(at, c, i, seg_sum(acc[c * TM + i], TPR, lane));
        }
    }
}
