// ---- Q8_0 block dot: d * sum(q * x), four signed bytes per 32-bit load ----
fn block_dot(wb: u32, xo: u32) -> f32 {
    var s = 0.0;
    for (var w = 0u; w < 8u; w++) {
        let q = ld32(wb + 2u + 4u * w);
        for (var e = 0u; e < 4u; e++) { s += i8_of(q, e) * x[xo + 4u * w + e]; }
    }
    return ldf16(wb) * s;
}
