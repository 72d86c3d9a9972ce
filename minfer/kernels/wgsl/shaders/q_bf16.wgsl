// ---- BF16 rows (the upper half of an f32), read in 32-element "blocks" ----
const BE: u32 = 32u;
const BB: u32 = 64u;
fn elem(wb: u32, j: u32) -> f32 { return bitcast<f32>(ld16(wb + 2u * j) << 16u); }
