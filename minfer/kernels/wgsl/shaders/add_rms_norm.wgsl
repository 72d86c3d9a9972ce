// ---- the residual add and the RMSNorm after it, one workgroup per row: h = x + y into `hs`, out = h *
// rsqrt(mean(h^2) + eps) * w (rms_sumsq.wgsl: rms_norm.wgsl's math on h; add_norm_io.wgsl: the bindings) ----
@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wg: vec3<u32>) {
    row_scale(wg.x, row_rstd(wg.x, lane), lane);
}
