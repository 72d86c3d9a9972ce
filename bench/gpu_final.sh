#!/usr/bin/env bash
# The end-of-session check on the H200: the cuda backend's and the fused kernels' GPU tests, the
# vulkan kernel/backend tests on NVIDIA's driver (SKIP_VK=1: not), and `minfer bench` on the four issue-9 shapes.
# Carry [".gl", ".whl"] (for the vulkan part; see bench/vulkan_h200.sh).
set -uo pipefail
export PYTHONPATH=.:/tmp/pylib:${PYTHONPATH:-} PYTHONUNBUFFERED=1
M=${M:-/tmp/models}; mkdir -p "$M"
T0=$(date +%s); since() { echo "[$(( $(date +%s) - T0 )) s]"; }
synth() { [ -f "$M/$1-$2.gguf" ] || python3 -m minfer.cli synth "$1" "$2" "$M/$1-$2.gguf" > /dev/null; }
for spec in smollm2-135m:q4_1 qwen2.5-0.5b:q4_0 qwen2.5-7b:q4_0 llama3-8b:q4_k; do synth ${spec/:/ } & done
echo "== cuda tests $(since)"
MINFER_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider tests/backends/test_cuda_backend.py \
  tests/kernels/triton/test_gemv_fused.py 2>&1 | tail -2
if [ -z "${SKIP_VK:-}" ]; then
echo "== vulkan tests (NVIDIA) $(since)"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
if [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
for w in .whl/*.whl; do python3 -m zipfile -e "$w" /tmp/pylib; done
wait
MINFER_WGPU_ADAPTER=NVIDIA MINFER_MODEL="$M/smollm2-135m-q4_1.gguf" timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/backends/test_wgpu_kernels.py tests/backends/test_wgpu_backend.py 2>&1 | grep -v XDG | tail -3
fi
wait
echo "== bench $(since)"
for f in smollm2-135m-q4_1 qwen2.5-0.5b-q4_0; do
  timeout 60 python3 -m minfer.cli bench -m "$M/$f.gguf" --device cuda -p 0 -n 128 -r 3 2>&1 | grep -E " tg"; done
for f in qwen2.5-7b-q4_0 llama3-8b-q4_k; do
  timeout 90 python3 -m minfer.cli bench -m "$M/$f.gguf" --device cuda -p 512 -n 128 -r 3 2>&1 | grep -E " tg| pp"; done
echo "== done $(since)"
