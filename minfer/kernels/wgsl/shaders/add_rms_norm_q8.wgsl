// ---- add_rms_norm.wgsl that also writes its rows' int8 records (q8_act.wgsl), split as rms_norm_q8.wgsl ----
// Workgroup (g, row) writes elements 4 WG g .. 4 WG (g + 1) of the row's h, out and records; each workgroup
// sums the whole row's squares itself from x + y (the inputs, never hs: another workgroup may be writing
// it), by rms_sumsq.wgsl's order. d a multiple of 32. add_norm_io.wgsl: bindings 0-5.
@group(0) @binding(6) var<storage, read_write> q8o: array<u32>;
