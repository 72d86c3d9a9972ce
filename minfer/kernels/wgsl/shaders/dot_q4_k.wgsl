// ---- Q4_K block dot: per sub-block j, d * scale_j * sum(q * x) - dmin * min_j * sum(x); each 32-bit
// load of a 64-element chunk holds 4 low nibbles (sub-block 2c) and 4 high ones (sub-block 2c + 1) ----
fn block_dot(wb: u32, xo: u32) -> f32 {
    let d = ldf16(wb);
    let dmin = ldf16(wb + 2u);
    var s = 0.0;
    for (var c = 0u; c < 4u; c++) {
        let lo = scale_min_k4(wb, 2u * c);
        let hi = scale_min_k4(wb, 2u * c + 1u);
        var ql = 0.0; var qh = 0.0;
        var xl = vec4<f32>(0.0); var xh = vec4<f32>(0.0);
        for (var w = 0u; w < 8u; w++) {
            let q = wq[(wb + 16u + 32u * c) / 4u + w];  // 144-byte blocks: the nibbles are 4-aligned
            let a = xq(xo + 64u * c + 4u * w);
            let b = xq(xo + 64u * c + 4u * w + 32u);
            ql += dot(nibbles(q), a);
            qh += dot(nibbles(q >> 4u), b);
            xl += a;
            xh += b;
        }
        let sl = xl.x + xl.y + xl.z + xl.w;
        let sh = xh.x + xh.y + xh.z + xh.w;
        s += d * (lo.x * ql + hi.x * qh) - dmin * (lo.y * sl + hi.y * sh);
    }
    return s;
}
