// ---- reductions without subgroups: the shared-memory tree ----
struct Lane {
    @builtin(local_invocation_index) lid: u32,
}

fn seg_sum(v: f32, seg: u32, lane: Lane) -> f32 { return tree_sum(v, seg, lane.lid); }

fn seg_max(v: f32, seg: u32, lane: Lane) -> f32 { return tree_max(v, seg, lane.lid); }
