// ---- the experts' biases for moe_qmatmul.wgsl (gpt-oss's ffn_*_exps.bias): expert e's n values at e * n ----
@group(0) @binding(5) var<storage, read> ebias: array<f32>;
fn expert_bias(i: u32) -> f32 { return ebias[i]; }
