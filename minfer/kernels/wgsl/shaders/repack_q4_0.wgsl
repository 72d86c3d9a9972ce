// ---- Q4_0 GGUF blocks -> the planes qmv4.wgsl reads: block i's 16 quant bytes as word 4i .. 4i + 3
// of the quant plane (one 16-byte load), its f16 scale the half (i & 1) of word d_off + i / 2 (the
// scale plane after the quants). One invocation per pair of blocks (so a scale word is written
// whole). quant_common.wgsl gives ld16 / ld32 on the raw stream `wq`, repack_planes.wgsl
// the parameters and bindings. ----

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let i = grid_index(g);  // the pair
    let b0 = 2u * i;
    if (b0 >= P.nblk) { return; }
    var d = 0u;
    for (var j = 0u; j < 2u; j++) {
        let b = b0 + j;
        if (b < P.nblk) {
            let wb = b * 18u;
            for (var w = 0u; w < 4u; w++) { planes[4u * b + w] = ld32(wb + 2u + 4u * w); }
            d |= ld16(wb) << (16u * j);
        }
    }
    planes[P.d_off + i] = d;
}
