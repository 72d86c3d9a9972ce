// ---- F16 rows, read in 32-element "blocks" ----
const BE: u32 = 32u;
const BB: u32 = 64u;
fn elem(wb: u32, j: u32) -> f32 { return ldf16(wb + 2u * j); }
