// ---- what repack_q4_0.wgsl and repack_q4_1.wgsl share: the raw GGUF blocks in (`wq`, words), the
// planes out (the quant plane, then the scale plane from word d_off), a 2-D grid of groups_x
// workgroups per row ----
struct Params { nblk: u32, d_off: u32, groups_x: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read_write> planes: array<u32>;

// the invocation's index in the grid
fn grid_index(g: vec3<u32>) -> u32 { return g.y * P.groups_x * WG + g.x; }
