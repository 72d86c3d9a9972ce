// ---- F32 rows, read in 32-element "blocks" ----
const BE: u32 = 32u;
const BB: u32 = 128u;
fn elem(wb: u32, j: u32) -> f32 { return bitcast<f32>(wq[(wb >> 2u) + j]); }
