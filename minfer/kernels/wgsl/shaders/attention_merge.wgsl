// ---- causal GQA attention, pass 2 of 2: out[r, h, :] = the splits of attention_split.wgsl merged
// (merge_splits.wgsl: the records, bindings and the merge) ----
// One workgroup per (head, row); the splits past the row's position were never written and are
// not read. out = sum_s acc_s * exp(m_s - M) / sum_s l_s * exp(m_s - M), M = max_s m_s.
@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let h = wg.x;
    let r = wg.y;
    let g = merge_stats(h, r);
    for (var d = lid; d < P.hd; d += WG) { out[(r * P.n_head + h) * P.hd + d] = merged(g, d); }
}
