// ---- Q4_1 GGUF blocks (20 bytes: f16 d, f16 m, 16 quant bytes; every field 4-byte aligned) -> the
// planes qmv8.wgsl reads: block i's quant bytes as word 4i .. 4i + 3 of the quant plane (one 16-byte
// load), its (d, m) word at d_off + i (the scale plane after the quants). One invocation per block.
// repack_planes.wgsl: the parameters and bindings. ----

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let b = grid_index(g);
    if (b >= P.nblk) { return; }
    for (var w = 0u; w < 4u; w++) { planes[4u * b + w] = wq[5u * b + 1u + w]; }
    planes[P.d_off + b] = wq[5u * b];
}
