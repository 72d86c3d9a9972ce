// ---- experts without biases (moe_qmatmul.wgsl) ----
fn expert_bias(i: u32) -> f32 { return 0.0; }
