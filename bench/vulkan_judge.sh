#!/usr/bin/env bash
# The judge on NVIDIA's Vulkan driver (one device call, ~3-5 min): every Vulkan contract's kernel at the layer
# sizes of SmolLM2-135M and Qwen2.5-7B (µs, GB/s, % of the WGSL copy, error vs float64, bit-stability),
# judge.json + judge.md into $OUT/judge-vk; then `minfer bench --device vulkan` on the synthetic 7B Q4_0.
# Carry [".gl", ".whl"] (bench/vulkan_h200.sh's header). Command: `bash bench/vulkan_judge.sh`.
set -uo pipefail
. bench/vulkan_env.sh
synth() { [ -f "$M/$1-$2.gguf" ] || python3 -m minfer.cli synth "$1" "$2" "$M/$1-$2.gguf" > /dev/null; }
synth qwen2.5-7b q4_0 & SYNTH=$!
echo "== judge $(since)"
timeout ${JUDGE_TIMEOUT:-330} python3 -m minfer.contracts.judge --device vulkan --model SmolLM2-135M --model Qwen2.5-7B \
  --out "$OUT/judge-vk" 2>&1 | grep -v XDG_RUNTIME_DIR | tail -40
wait $SYNTH
echo "== bench $(since)"
timeout ${BENCH_TIMEOUT:-120} python3 -m minfer.cli bench -m "$M/qwen2.5-7b-q4_0.gguf" --device vulkan -p 512 -n 128 \
  -r ${REPS:-3} 2>&1 | grep -v XDG_RUNTIME_DIR | tee "$OUT/bench.txt"
echo "== done $(since)"
