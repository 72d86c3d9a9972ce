// ---- the entry point rms_norm_q8.wgsl and add_rms_norm_q8.wgsl share: workgroup (g, row) scales elements
// 4 WG g .. 4 WG (g + 1) of the row (rms_sumsq.wgsl's quad_scale, the rstd its own sum of the whole row's
// squares gives) and writes their int8 records (q8_act.wgsl's q8_quad: 8 invocations a block) ----
@compute @workgroup_size(WG)
fn main(lane: Lane, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.y;
    let rstd = row_rstd(row, lane);
    let c = (wg.x * WG + lane.lid) * 4u;
    let live = c < P.d;
    q8_quad(quad_scale(row, c, rstd, live), row, c / 32u, P.d / 32u, live, lane);
}
