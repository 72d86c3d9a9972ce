// ---- Q8_0 block dot: d * sum(q * x), four signed bytes per 32-bit load, one vec4 dot each ----
fn block_dot(wb: u32, xo: u32) -> f32 {
    var s = 0.0;
    for (var w = 0u; w < 8u; w++) {
        let q = ld32(wb + 2u + 4u * w);
        s += dot(vec4<f32>(i8_of(q, 0u), i8_of(q, 1u), i8_of(q, 2u), i8_of(q, 3u)), xq(xo + 4u * w));
    }
    return ldf16(wb) * s;
}
