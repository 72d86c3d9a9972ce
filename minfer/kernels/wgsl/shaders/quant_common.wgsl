// ---- byte loads from a GGUF block stream bound as `wq: array<u32>` ----
// Every block field of the supported types starts at an even byte (18-, 34-, 210-byte strides
// are 2-aligned, not 4-aligned), so 16- and 32-bit loads take at most two words.
fn ld8(b: u32) -> u32 { return (wq[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu; }
fn ld16(b: u32) -> u32 { return (wq[b >> 2u] >> ((b & 2u) * 8u)) & 0xffffu; }
fn ld32(b: u32) -> u32 {
    let i = b >> 2u;
    if ((b & 2u) == 0u) { return wq[i]; }
    return (wq[i] >> 16u) | (wq[i + 1u] << 16u);
}
fn ldf16(b: u32) -> f32 { return f16_bits(ld16(b)); }
// byte e (0..3) of word w as a signed 8-bit value
fn i8_of(w: u32, e: u32) -> f32 { return f32(bitcast<i32>(w << (24u - 8u * e)) >> 24u); }
// the K-quants' 6-bit scales and mins (Q4_K, Q5_K: 12 bytes after f16 d and dmin)
// llama.cpp's get_scale_min_k4: (scale, min) of sub-block j of the super-block at byte wb
fn scale_min_k4(wb: u32, j: u32) -> vec2<f32> {
    let s = wb + 4u;
    if (j < 4u) { return vec2<f32>(f32(ld8(s + j) & 63u), f32(ld8(s + j + 4u) & 63u)); }
    let sc = (ld8(s + j + 4u) & 15u) | ((ld8(s + j - 4u) >> 6u) << 4u);
    let mn = (ld8(s + j + 4u) >> 4u) | ((ld8(s + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(mn));
}
