// ---- the dot of one weight block with x[xo .. xo + BE], element by element (the types without a dot_<type>.wgsl) ----
fn block_dot(wb: u32, xo: u32) -> f32 {
    var s = 0.0;
    for (var j = 0u; j < BE; j++) { s += elem(wb, j) * xs(xo + j); }
    return s;
}
