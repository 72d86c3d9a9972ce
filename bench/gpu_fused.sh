#!/usr/bin/env bash
# One device call for the fused-epilogue GEMVs (gemv_swiglu, gemv_rope): their GPU tests and conformance,
# the cuda backend's GPU tests, the kernels against the unfused ones (bench/kernels.py), and decode tok/s
# with the fusion on and off (MINFER_NO_FUSE=1) back to back. Run from the repo root on the GPU machine.
set -uo pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; M=${M:-/tmp/models}; mkdir -p "$OUT" "$M"
T0=$(date +%s); since() { echo "[$(( $(date +%s) - T0 )) s]"; }
synth() { [ -f "$M/$1-$2.gguf" ] || python3 -m minfer.cli synth "$1" "$2" "$M/$1-$2.gguf" > /dev/null; }
for spec in ${MODELS:-qwen2.5-7b:q4_0 llama3-8b:q4_k}; do synth ${spec/:/ } & done
echo "== kernel tests + conformance (cuda) $(since)"
MINFER_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/triton/test_gemv_fused.py \
  tests/contracts/test_conformance.py -k "gemv or rope or swiglu" 2>&1 | tail -4
timeout 100 python3 -m minfer.contracts.conformance --full --device cuda --kernel gemv_swiglu --kernel gemv_rope \
  2>&1 | tail -2
echo "== bench/kernels.py $(since)"
timeout 100 python3 bench/kernels.py --only 'gemv_rope|gemv_swiglu|unfused|^q4_0_gemv' 2>&1 | tail -24
wait; ls -la "$M"
if [ -z "${SKIP_TESTS:-}" ]; then
  echo "== cuda backend tests $(since)"
  MINFER_TEST_DEVICE=cuda timeout ${PYTEST_TIMEOUT:-200} python3 -m pytest -q -x -p no:cacheprovider \
    tests/backends/test_cuda_backend.py 2>&1 | tail -4
fi
echo "== decode, fused vs MINFER_NO_FUSE=1 $(since)"
for f in ${BENCH:-qwen2.5-7b-q4_0 llama3-8b-q4_k}; do
  for fuse in 1 0; do
    if [ $fuse = 1 ]; then unset MINFER_NO_FUSE; else export MINFER_NO_FUSE=1; fi
    echo "-- $f fuse=$fuse"
    timeout ${BENCH_TIMEOUT:-100} python3 -m minfer.cli bench -m "$M/$f.gguf" --device cuda -p ${PP:-0} -n 128 \
      -r ${REPS:-3} 2>&1 | tee -a "$OUT/bench.log" | grep -E "tg|pp" | tail -3
  done
done
unset MINFER_NO_FUSE
echo "== done $(since)"
