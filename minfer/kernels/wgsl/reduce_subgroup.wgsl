// ---- reductions with subgroups: subgroupAdd inside each subgroup, then the subgroup sums ----
// A 1-D workgroup's subgroups are runs of sg_size consecutive invocations (every Vulkan and Metal
// driver lays them out so); when sg_size does not divide the run length, the tree is used.
struct Lane {
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_size) sg_size: u32,
    @builtin(subgroup_invocation_id) sg_id: u32,
}

fn seg_sum(v: f32, seg: u32, lane: Lane) -> f32 {
    if (lane.sg_size > seg || seg % lane.sg_size != 0u) { return tree_sum(v, seg, lane.lid); }
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
