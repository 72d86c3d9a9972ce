// ---- reductions with subgroups ----
// A 1-D workgroup's subgroups are runs of sg_size consecutive invocations (every Vulkan and Metal
// driver lays them out so). A run of `seg` invocations (a power of two) inside one subgroup is
// reduced by butterfly shuffles; a run of whole subgroups by subgroupAdd, then the subgroup sums
// through workgroup memory; anything else by the tree.
struct Lane {
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_size) sg_size: u32,
    @builtin(subgroup_invocation_id) sg_id: u32,
}

fn seg_sum(v: f32, seg: u32, lane: Lane) -> f32 {
    if (seg < lane.sg_size && lane.sg_size % seg == 0u) {
        var t = v;
        for (var o = seg / 2u; o > 0u; o = o / 2u) { t += subgroupShuffleXor(t, o); }
        return t;
    }
    if (seg % lane.sg_size != 0u) { return tree_sum(v, seg, lane.lid); }
    let s = subgroupAdd(v);
    if (seg == lane.sg_size) { return s; }
    red[lane.lid] = s;
    workgroupBarrier();
    let base = lane.lid / seg * seg;
    var total = 0.0;
    for (var i = 0u; i < seg; i += lane.sg_size) { total += red[base + i]; }
    workgroupBarrier();
    return total;
}

// Max of v over each run of `seg` invocations: butterfly shuffles inside a subgroup, else the tree.
fn seg_max(v: f32, seg: u32, lane: Lane) -> f32 {
    if (seg <= lane.sg_size && lane.sg_size % seg == 0u) {
        var t = v;
        for (var o = seg / 2u; o > 0u; o = o / 2u) { t = max(t, subgroupShuffleXor(t, o)); }
        return t;
    }
    return tree_max(v, seg, lane.lid);
}
