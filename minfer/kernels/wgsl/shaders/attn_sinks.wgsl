// ---- attention sinks (gpt-oss; ggml_soft_max_add_sinks): head h's learned logit, bound at SINK_AT (each
// attention shader's next free binding, a constant of the variant); kernels built with SINKS 1 join it to the
// softmax's max and denominator ----
@group(0) @binding(SINK_AT) var<storage, read> sinks: array<f32>;
fn sink_logit(h: u32) -> f32 { return sinks[h]; }
