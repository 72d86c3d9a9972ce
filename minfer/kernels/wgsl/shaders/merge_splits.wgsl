// ---- what attention_merge.wgsl and attention_merge_q8.wgsl share: the split records of
// attention_split.wgsl (per (row, head) n_split of hd + 2 floats: m_s, l_s, acc_s[hd]) and their
// merge. Only the splits up to the row's position were written (n_s of them); M = max_s m_s,
// L = sum_s l_s * exp(m_s - M), element d = sum_s acc_s[d] * exp(m_s - M) / L. SINKS 1: head h's sink
// logit (attn_sinks.wgsl) joins M and adds exp(sink - M) to L (gpt-oss). ----
struct Params { n_head: u32, hd: u32, ch: u32, n_split: u32 }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read> positions: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

struct Merge { n_s: u32, pb: u32, mm: f32, l: f32 }

// row r's splits of head h: how many, where they start, M and L
fn merge_stats(h: u32, r: u32) -> Merge {
    let n_pos = u32(positions[r]) + 1u;
    let n_s = min((n_pos + P.ch - 1u) / P.ch, P.n_split);
    let pb = (r * P.n_head + h) * P.n_split * (P.hd + 2u);
    var mm = -3.0e38;
    for (var s = 0u; s < n_s; s++) { mm = max(mm, part[pb + s * (P.hd + 2u)]); }
    var l = 0.0;
    if (SINKS != 0u) {
        mm = max(mm, sink_logit(h));
        l = exp(sink_logit(h) - mm);
    }
    for (var s = 0u; s < n_s; s++) {
        let o = pb + s * (P.hd + 2u);
        l += part[o + 1u] * exp(part[o] - mm);
    }
    return Merge(n_s, pb, mm, l);
}

// element d of the merged head
fn merged(g: Merge, d: u32) -> f32 {
    var a = 0.0;
    for (var s = 0u; s < g.n_s; s++) {
        let o = g.pb + s * (P.hd + 2u);
        a += part[o + 2u + d] * exp(part[o] - g.mm);
    }
    return a / g.l;
}
