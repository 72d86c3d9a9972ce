// ---- out[r, c] = dequant(raw row r)[c] for a [rows, cols] GGUF tensor, one invocation per element ----
struct Params { cols: u32, row_bytes: u32, rows: u32, out_off: u32, groups_x: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(workgroup_id) wg: vec3<u32>) {
    let c = g.x;
    let r = wg.z * 65535u + g.y;
    if (c >= P.cols || r >= P.rows) { return; }
    out[P.out_off + r * P.cols + c] = elem(r * P.row_bytes + (c / BE) * BB, c % BE);
}
