// ---- IQ4_XS block dot: per sub-block i, (d (ls_i - 32)) * sum(kvalues[q] * x); 136-byte blocks: the
// nibbles are 4-aligned ----
fn block_dot(wb: u32, xo: u32) -> f32 {
    var s = 0.0;
    for (var i = 0u; i < 8u; i++) {
        var t = 0.0;
        for (var w = 0u; w < 4u; w++) {
            let q = wq[(wb + 8u + 16u * i) / 4u + w];
            let x0 = xo + 32u * i + 4u * w;
            t += dot(lut16x4(KV_IQ4, q), xq(x0)) + dot(lut16x4(KV_IQ4, q >> 4u), xq(x0 + 16u));
        }
        s += iq4_xs_scale(wb, i) * t;
    }
    return s;
}
