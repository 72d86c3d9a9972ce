#!/usr/bin/env bash
# The vulkan backend's launch-variant sweep on the H200 (NVIDIA's Vulkan driver), in one device call of
# ~1.5-3 minutes (run 32: 63 s): the new kernels' GPU tests, then bench/studies/vulkan_sweep.py (copy bandwidth both ways, every GEMV
# variant at the 7B decode shapes, the attention variants, 7B Q4_0 and SmolLM2 decode with the best variant,
# the default (qmv8: int8 activations, two passes, NR 1, TPR4 16 on the wide rows), round 2's default (TPR4 32
# everywhere), run 35's qmv4 (f32 activations) and the default with one pass, each step also by kernel), its
# short table last. Logs and
# sweep.json land in $OUT.
#
# Carry [".gl", ".whl"] as for bench/vulkan_h200.sh (its header says how to fill them: the libvulkan1 and
# libglvnd .debs, and the wgpu, cffi, pycparser and rendercanvas wheels). Command: `bash bench/studies/vulkan_sweep.sh`.
set -uo pipefail
# 1. the Vulkan loader and NVIDIA's ICD, wgpu from its wheel (bench/vulkan_env.sh)
. bench/vulkan_env.sh

# 2. synthetic models (random weights in the real shapes); the 7B (4.4 GB) is written while the tests run
synth() { [ -f "$M/$1-$2.gguf" ] || { python3 -m minfer.cli synth "$1" "$2" "$M/$1-$2.tmp" > /dev/null \
          && mv "$M/$1-$2.tmp" "$M/$1-$2.gguf"; }; }
synth smollm2-135m q4_1
synth qwen2.5-7b q4_0 & SYNTH=$!

# 3. the WGSL kernels the sweep times, on NVIDIA's driver (subgroup size 32): every variant against the reference
echo "== pytest $(since)"
MINFER_MODEL="$M/smollm2-135m-q4_1.gguf" timeout ${PYTEST_TIMEOUT:-130} python3 -m pytest -q -p no:cacheprovider \
  tests/backends/test_wgpu_kernels.py tests/backends/test_wgpu_backend.py \
  -k "kernels or reduction_branch or strided or conforms or replayed or decode_pick or depend_on_the_batch" 2>&1 \
  | grep -v XDG_RUNTIME_DIR | tail -8 | tee "$OUT/pytest.txt"
wait $SYNTH; ls -la "$M"

# 4. the sweep (its table last)
echo "== sweep $(since)"
timeout ${SWEEP_TIMEOUT:-220} python3 bench/studies/vulkan_sweep.py --models "$M" --out "$OUT/sweep.json" 2>&1 \
  | grep -v XDG_RUNTIME_DIR | tee "$OUT/sweep.txt"
# 4b. (CHECKS_AB=1) the default GEMVs and 7B decode again with wgpu's runtime checks compiled in (MINFER_WGPU_CHECKS=1)
if [ "${CHECKS_AB:-0}" = 1 ]; then
  echo "== the default with MINFER_WGPU_CHECKS=1 $(since)"
  MINFER_WGPU_CHECKS=1 timeout 150 python3 bench/studies/vulkan_sweep.py --models "$M" --variants default --decode default \
    --out "$OUT/sweep-checks.json" 2>&1 | grep -v XDG_RUNTIME_DIR | tee "$OUT/sweep-checks.txt" | grep -A30 "== summary"
fi
# 5. (PROFILE=1) SmolLM2 through `minfer bench` on the default variant, then the same decode under cProfile:
# where a token's host time goes when the device step is short (run 42: 180 tok/s with a 1.8 ms step)
if [ "${PROFILE:-0}" = 1 ]; then
  echo "== SmolLM2 minfer bench + profile $(since)"
  timeout 90 python3 -m minfer.cli bench -m "$M/smollm2-135m-q4_1.gguf" --device vulkan -p 16 -n 128 -r 3 -b "" 2>&1 \
    | grep -v XDG_RUNTIME_DIR | tail -6 | tee "$OUT/smollm2-bench.txt"
  timeout 90 python3 -m cProfile -o "$OUT/smollm2.prof" -m minfer.cli bench -m "$M/smollm2-135m-q4_1.gguf" \
    --device vulkan -p 16 -n 256 -r 1 -b "" > /dev/null 2>&1
  python3 -c "import pstats; pstats.Stats('$OUT/smollm2.prof').sort_stats('tottime').print_stats(22)" 2>&1 \
    | tail -32 | tee "$OUT/smollm2-profile.txt"
fi
echo "== done $(since)"; grep -E "passed|failed" "$OUT/pytest.txt" | tail -1
