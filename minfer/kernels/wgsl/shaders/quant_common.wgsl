// ---- byte loads from a GGUF block stream bound as `wq: array<u32>` ----
// Every block field of the supported types starts at an even byte (18-, 34-, 210-byte strides
// are 2-aligned, not 4-aligned), so 16- and 32-bit loads take at most two words; MXFP4's
// 17-byte blocks are read with ld8 and ld32u (any byte).
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
// the lookup types (IQ4_NL, IQ4_XS, MXFP4): a 4-bit code indexes 16 int8 values, held as 4 words
// (byte b of word w: code 4 w + b): kvalues_iq4nl, and MXFP4's e2m1 values doubled
const KV_IQ4: vec4<u32> = vec4<u32>(0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u);
const KV_MXFP4: vec4<u32> = vec4<u32>(0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu);
fn lut16(t: vec4<u32>, q: u32) -> f32 {
    let w = select(select(t.x, t.y, q >= 4u), select(t.z, t.w, q >= 12u), q >= 8u);
    return f32(bitcast<i32>(w << (24u - 8u * (q & 3u))) >> 24u);
}
// the values of the 4 codes in bits 0-3 of each byte of q
fn lut16x4(t: vec4<u32>, q: u32) -> vec4<f32> {
    return vec4<f32>(lut16(t, q & 15u), lut16(t, (q >> 8u) & 15u), lut16(t, (q >> 16u) & 15u), lut16(t, (q >> 24u) & 15u));
}
// the 32-bit little-endian word at any byte b (MXFP4's 17-byte blocks start at odd bytes)
fn ld32u(b: u32) -> u32 {
    let i = b >> 2u;
    let s = (b & 3u) * 8u;
    if (s == 0u) { return wq[i]; }
    return (wq[i] >> s) | (wq[i + 1u] << (32u - s));
}
// MXFP4's shared exponent: 2^(e - 128) (ggml_e8m0_to_fp32_half: e < 2 the subnormals)
fn e8m0_half(e: u32) -> f32 { return bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << e, e < 2u)); }
