#!/usr/bin/env bash
# The vulkan backend (WGSL kernels through wgpu) on the H200, on NVIDIA's Vulkan driver: one device call.
#
# The GPU machine has no Vulkan loader and no wgpu. Prepare once, here, in the repo root (both folders stay
# out of git through .git/info/exclude, and travel with `carry`):
#
#   echo /.gl/ >> .git/info/exclude; echo /.whl/ >> .git/info/exclude
#   mkdir -p .gl /tmp/amd64/partial; o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
#   apt-get $o update; (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
#   pip download wgpu==0.32.0 --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 -d .whl
#   pip download rendercanvas==2.7.2 pycparser==3.12 --no-deps --only-binary=:all: --python-version 3.12 -d .whl
#   pip download cffi==1.17.1 --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d .whl
#
# which gives (Debian 12 here, 2026-12-01; ~0.4 MB of .deb, ~4 MB of wheels):
#   .gl/libvulkan1_1.3.239.0-1_amd64.deb  .gl/libegl1_1.6.0-1_amd64.deb  .gl/libglvnd0_1.6.0-1_amd64.deb
#   .gl/libopengl0_1.6.0-1_amd64.deb      .gl/libgl1_1.6.0-1_amd64.deb   .gl/libglx0_1.6.0-1_amd64.deb
#   .gl/libgles2_1.6.0-1_amd64.deb
#   .whl/wgpu-0.32.0-py3-none-manylinux_2_28_x86_64.whl  .whl/rendercanvas-2.7.2-py3-none-any.whl
#   .whl/pycparser-3.12-py3-none-any.whl  .whl/cffi-1.17.1-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
#
# Then one device run: carry [".gl", ".whl"], command `bash bench/vulkan_h200.sh` (~8-9 minutes; logs in $OUT).
# The Vulkan tests run with MINFER_MODEL set to a synthetic SmolLM2 (the real 94 MB file does not travel):
# the greedy-vs-cpu test needs the real weights' decisive steps, so it is deselected there; bench/cuda_parity.py
# --device vulkan reports the same comparison (logits error, greedy agreement on decisive steps) instead.
set -uo pipefail
# 1. the Vulkan loader and NVIDIA's ICD, wgpu from its wheel (bench/vulkan_env.sh)
. bench/vulkan_env.sh

# 3. synthetic models (random weights in the real shapes)
synth() { [ -f "$M/$1-$2.gguf" ] || python3 -m minfer.cli synth "$1" "$2" "$M/$1-$2.gguf" > /dev/null; }
synth smollm2-135m q4_1 & synth qwen2.5-7b q4_0 & wait
ls -la "$M"

# 4. the vulkan tests on NVIDIA's driver: every WGSL kernel under its contract (both reduction paths), the backend
echo "== pytest (vulkan backend, NVIDIA Vulkan)"
MINFER_MODEL="$M/smollm2-135m-q4_1.gguf" timeout ${PYTEST_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider \
  tests/backends/test_wgpu_backend.py tests/backends/test_wgpu_kernels.py -k "not greedy_tokens_equal_cpu" 2>&1 \
  | grep -v XDG_RUNTIME_DIR | tail -15 | tee "$OUT/pytest.txt"

# 5. parity with cpu, the GEMV alone, and minfer bench
echo "== parity"
timeout 200 python3 bench/cuda_parity.py "$M/smollm2-135m-q4_1.gguf" --device vulkan 2>&1 | grep RESULT | tee "$OUT/parity.txt"
if [ "${SKIP_GEMV:-0}" != 1 ]; then  # (bench/studies/vulkan_sweep.sh times every GEMV variant; SKIP_GEMV=1 saves the time)
  echo "== GEMV"
  timeout 150 python3 bench/studies/vulkan_gemv.py 2>&1 | grep -v XDG_RUNTIME_DIR | tee "$OUT/gemv.txt"
fi
echo "== judge (the WGSL kernels at the models' layer sizes; judge.json feeds the picker's overheads)"
timeout 180 python3 -m minfer.contracts.judge --device vulkan --model SmolLM2-135M --model Qwen2.5-7B --out "$OUT/judge-vk" 2>&1 | grep -v XDG_RUNTIME_DIR \
  | grep -E "^\| vk_(qmatvec|matmul|attention|rms)" | head -30
echo "== bench"
for f in smollm2-135m-q4_1 qwen2.5-7b-q4_0; do
  timeout ${BENCH_TIMEOUT:-150} python3 -m minfer.cli bench -m "$M/$f.gguf" --device vulkan -p 512 -n 128 -r ${REPS:-3} \
    2>&1 | grep -v XDG_RUNTIME_DIR | tee -a "$OUT/bench.txt" | tail -4
done

# 5b. (DECODE_STEP=1) the 7B and SmolLM2 decode steps by kernel, default variant (bench/studies/vulkan_sweep.py's decode rows)
if [ "${DECODE_STEP:-0}" = 1 ]; then
  echo "== decode step by kernel"
  timeout 150 python3 bench/studies/vulkan_sweep.py --models "$M" --variants default --decode default --out "$OUT/step.json" 2>&1 \
    | grep -v XDG_RUNTIME_DIR | grep -A2 "^qwen2.5\|^smollm2" | tee "$OUT/step.txt"
fi

# 6. the short table
echo; echo "== summary (vulkan backend, $(head -1 "$OUT/devices.txt" | cut -c1-60))"
grep -E "passed|failed" "$OUT/pytest.txt" | tail -1
cat "$OUT/parity.txt"
grep -E "^7B ffn_up +Q4_0" "$OUT/gemv.txt" | sort -k11 -g -r | head -1 | awk '{print "best 7B Q4_0 GEMV (ffn_up):", $0}'
grep -E "pp512|tg128" "$OUT/bench.txt" | awk '{printf "%-36s %8s %10s tok/s  %s GB/s  %s\n", $1, $5, $6, $9, $10}'
