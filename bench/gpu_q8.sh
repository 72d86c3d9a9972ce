#!/usr/bin/env bash
# One device call for the int8-activation decode GEMVs (GemvConfig.q8, MINFER_GEMV_Q8) and the KV write
# in the q+k+v GEMV's epilogue: GPU tests, the GEMV at the 7B / 8B shapes with 0 / 1 / 2 activation passes
# (bench/studies/gemv_sweep.py --q8), cuda-vs-cpu parity per pass count, and decode tok/s for each, back to back.
# Optional: AB=dir holding another checkout's `minfer` package, benched first as the baseline.
set -uo pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; M=${M:-/tmp/models}; mkdir -p "$OUT" "$M"
T0=$(date +%s); since() { echo "[$(( $(date +%s) - T0 )) s]"; }
synth() { [ -f "$M/$1-$2.gguf" ] || python3 -m minfer.cli synth "$1" "$2" "$M/$1-$2.gguf" > /dev/null; }
for spec in ${MODELS:-smollm2-135m:q4_1 qwen2.5-0.5b:q4_0 qwen2.5-7b:q4_0 llama3-8b:q4_k}; do synth ${spec/:/ } & done
echo "== kernel tests (cuda) $(since)"
MINFER_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/triton/test_qmatmul.py \
  tests/kernels/triton/test_gemv_fused.py tests/kernels/triton/test_quantize.py 2>&1 | tail -3
wait; ls -la "$M" | tail -4
if [ -z "${SKIP_TESTS:-}" ]; then
  echo "== cuda backend tests $(since)"
  MINFER_TEST_DEVICE=cuda timeout ${PYTEST_TIMEOUT:-200} python3 -m pytest -q -x -p no:cacheprovider \
    tests/backends/test_cuda_backend.py 2>&1 | tail -3
fi
echo "== GEMV: activation passes $(since)"
timeout ${SWEEP_TIMEOUT:-150} python3 bench/studies/gemv_sweep.py --q8 "$M/qwen2.5-7b-q4_0.gguf" "$M/llama3-8b-q4_k.gguf" \
  > "$OUT/gemv_q8.txt" 2>&1; grep -E "^  Q8|default" "$OUT/gemv_q8.txt"
echo "== parity vs cpu $(since)"
for f in ${PARITY:-smollm2-135m-q4_1 qwen2.5-0.5b-q4_0}; do
  for p in 0 1 2; do
    echo "-- $f q8=$p: $(MINFER_GEMV_Q8=$p timeout 90 python3 bench/cuda_parity.py "$M/$f.gguf" 2>&1 | grep RESULT)"
  done
done
echo "== decode $(since)"
for f in ${BENCH:-qwen2.5-7b-q4_0 llama3-8b-q4_k qwen2.5-0.5b-q4_0 smollm2-135m-q4_1}; do
  if [ -n "${AB:-}" ]; then
    echo "-- $f baseline ($AB) $(cd "$AB" && PYTHONPATH=. timeout 100 python3 -m minfer.cli bench -m "$M/$f.gguf" \
      --device cuda -p 0 -n 128 -r ${REPS:-3} 2>&1 | grep -E " tg" | tail -1)"
  fi
  for p in ${PASSES:-0 1 2}; do
    echo "-- $f q8=$p $(MINFER_GEMV_Q8=$p timeout 100 python3 -m minfer.cli bench -m "$M/$f.gguf" --device cuda \
      -p 0 -n 128 -r ${REPS:-3} 2>&1 | tee -a "$OUT/bench.log" | grep -E " tg" | tail -1)"
  done
done
echo "== done $(since)"
