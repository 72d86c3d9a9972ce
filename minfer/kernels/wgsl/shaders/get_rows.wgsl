// ---- out[i, c] = dequant(table row ids[i])[c]: the embedding gather, one invocation per element ----
// The table may be rows first .. first + n_rows - 1 of a larger one of `total` rows (a chunk: the whole table
// binds more bytes than the device allows): ids of other rows are left to the other chunks' dispatches.
struct Params { n_embd: u32, row_bytes: u32, n_rows: u32, out_off: u32, first: u32, total: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> ids: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let c = g.x;
    let i = g.y;
    if (c >= P.n_embd) { return; }
    let whole = u32(clamp(ids[i], 0, i32(P.total) - 1));  // an id the table has not: its edge row, never out of bounds
    if (whole < P.first || whole >= P.first + P.n_rows) { return; }  // another chunk's row
    let id = whole - P.first;
    out[P.out_off + i * P.n_embd + c] = elem(id * P.row_bytes + (c / BE) * BB, c % BE);
}
