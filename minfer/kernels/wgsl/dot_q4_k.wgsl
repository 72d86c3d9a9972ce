// ---- Q4_K block dot: per sub-block j, d * scale_j * sum(q * x) - dmin * min_j * sum(x) ----
fn block_dot(wb: u32, xo: u32) -> f32 {
    let d = ldf16(wb);
    let dmin = ldf16(wb + 2u);
    var s = 0.0;
    for (var c = 0u; c < 4u; c++) {
        let lo = scale_min_k4(wb, 2u * c);
        let hi = scale_min_k4(wb, 2u * c + 1u);
        var ql = 0.0; var qh = 0.0; var xl = 0.0; var xh = 0.0;
        for (var w = 0u; w < 8u; w++) {
            let q = wq[(wb + 16u + 32u * c) / 4u + w];  // 144-byte blocks: the nibbles are 4-aligned
            for (var e = 0u; e < 4u; e++) {
                let byte = (q >> (8u * e)) & 0xffu;
                let i = xo + 64u * c + 4u * w + e;
                ql += f32(byte & 15u) * x[i];
                qh += f32(byte >> 4u) * x[i + 32u];
                xl += x[i];
                xh += x[i + 32u];
            }
        }
        s += d * (lo.x * ql + hi.x * qh) - dmin * (lo.y * xl + hi.y * xh);
    }
    return s;
}
