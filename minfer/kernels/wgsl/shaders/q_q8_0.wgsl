// ---- Q8_0: 34-byte blocks of 32: f16 d, 32 signed bytes ----
// x = q * d
const BE: u32 = 32u;
const BB: u32 = 34u;
fn elem(wb: u32, j: u32) -> f32 {
    let b = wb + 2u + j;
    return f32(bitcast<i32>(ld8(b) << 24u) >> 24u) * ldf16(wb);
}
