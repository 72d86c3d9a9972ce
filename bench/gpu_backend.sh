#!/usr/bin/env bash
# One device call for the cuda backend: synthetic models, the backend's GPU tests, cuda-vs-cpu parity,
# and `minfer bench` on the issue's shapes. Run from the repo root on the GPU machine; logs in $OUT.
set -uo pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; M=${M:-/tmp/models}; mkdir -p "$OUT" "$M"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
synth() { [ -f "$M/$1-$2.gguf" ] || python3 -m minfer.cli synth "$1" "$2" "$M/$1-$2.gguf" > /dev/null; }
for spec in ${MODELS:-smollm2-135m:q4_1 qwen2.5-0.5b:q4_0 qwen2.5-7b:q4_0 llama3-8b:q4_k}; do synth ${spec/:/ } & done; wait
ls -la "$M"
if [ -z "${SKIP_TESTS:-}" ]; then
  echo "== pytest (cuda backend on the GPU)"
  MINFER_TEST_DEVICE=cuda timeout ${PYTEST_TIMEOUT:-240} python3 -m pytest -q -x -p no:cacheprovider \
    tests/backends/test_cuda_backend.py ${PYTEST_EXTRA:-} 2>&1 | tail -15
fi
echo "== parity"
for f in "$M"/smollm2-135m-q4_1.gguf "$M"/qwen2.5-0.5b-q4_0.gguf; do timeout 120 python3 bench/cuda_parity.py "$f" 2>&1 | tail -3; done
echo "== bench"
for f in ${BENCH:-smollm2-135m-q4_1 qwen2.5-0.5b-q4_0 qwen2.5-7b-q4_0 llama3-8b-q4_k}; do
  timeout ${BENCH_TIMEOUT:-150} python3 -m minfer.cli bench -m "$M/$f.gguf" --device cuda -r ${REPS:-3} \
    ${BENCH_ARGS:-} 2>&1 | tee -a "$OUT/bench.log" | tail -6
done
if [ -n "${BATCHED:-}" ]; then
  timeout 200 python3 -m minfer.cli bench -m "$M/qwen2.5-7b-q4_0.gguf" --device cuda -p 0 -n 0 -b "$BATCHED" -r 2 \
    2>&1 | tee -a "$OUT/bench.log" | tail -6
fi
if [ -n "${STUDY:-}" ]; then
  for f in $STUDY; do echo "== study $f"; timeout 150 python3 bench/studies/cuda_study.py "$M/$f.gguf" ${STUDY_ARGS:-} 2>&1 | tail -60; done
fi
if [ -n "${SWEEP:-}" ]; then
  echo "== gemv sweep"; timeout ${SWEEP_TIMEOUT:-400} python3 bench/studies/gemv_sweep.py $(for f in $SWEEP; do echo "$M/$f.gguf"; done) 2>&1 | tee "$OUT/sweep.log" | tail -80
fi
