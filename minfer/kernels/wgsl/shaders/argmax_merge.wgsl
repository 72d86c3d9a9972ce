// ---- argmax, pass 2: out[r] = the index of the largest of row r's G (value, index) pairs that
// argmax.wgsl wrote (the smallest index of equal values), one workgroup per row ----
struct Params { groups: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> part: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let r = wg.x;
    var bv = -3.4e38;
    var bi = NONE;
    for (var g = lid; g < P.groups; g += WG) {  // g grows, and so do the groups' indices: a tie keeps the first
        let o = 2u * (r * P.groups + g);
        let v = bitcast<f32>(part[o]);
        let i = part[o + 1u];
        if (i != NONE && (bi == NONE || v > bv)) { bv = v; bi = i; }
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    workgroupBarrier();
    argmax_tree(lid);
    if (lid == 0u) { out[r] = best_i[0]; }
}
