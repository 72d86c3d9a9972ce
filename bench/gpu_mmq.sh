#!/usr/bin/env bash
# One device call for the int8 MMQ (kernels/triton/mmq.py): its GPU tests and conformance, its kernel times
# against cuBLAS on the f16 copy at Qwen2.5-7B's shapes (bench/mmq_matmul.py), and the engine's prompt,
# decode and batched-decode tok/s with MINFER_MMQ unset (cuBLAS) and MINFER_MMQ=1 back to back, on the
# 7B Q4_0 and the 8B Q4_K; a short table last. Run from the repo root on the GPU machine:
#     bash bench/gpu_mmq.sh          (SKIP_TESTS=1 / SKIP_KERNELS=1 / SKIP_Q4_K=1 / SKIP_ENGINE=1 drop a part; MS=...)
set -uo pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; M=${M:-/tmp/models}; mkdir -p "$OUT" "$M"
T0=$(date +%s); since() { echo "[$(( $(date +%s) - T0 )) s]"; }
synth() { [ -f "$M/$1-$2.gguf" ] || python3 -m minfer.cli synth "$1" "$2" "$M/$1-$2.gguf" > /dev/null; }
if [ -z "${SKIP_ENGINE:-}" ]; then for spec in ${MODELS:-qwen2.5-7b:q4_0 llama3-8b:q4_k}; do synth ${spec/:/ } & done; fi
if [ -z "${SKIP_TESTS:-}" ]; then
  echo "== mmq kernel tests + conformance (cuda) $(since)"
  MINFER_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/triton/test_mmq.py 2>&1 | tail -3
  timeout 90 python3 -m minfer.contracts.conformance --device cuda --kernel mmq_q4_0 --kernel mmq_int4 \
    --kernel mmq_q8_0 --kernel mmq_q6_k --kernel mmq_planes 2>&1 | tail -2
fi
if [ -z "${SKIP_KERNELS:-}" ]; then
  echo "== kernels: cuBLAS f16 vs MMQ, Qwen2.5-7B shapes $(since)"
  timeout 150 python3 bench/mmq_matmul.py --types Q4_0 --ms ${MS:-1,2,4,8,16,32,64,512} > "$OUT/mmq_q4_0.log" 2>&1
  sed '/^autotuned/q' "$OUT/mmq_q4_0.log" | grep -v '^autotuned'; grep -A40 '^autotuned' "$OUT/mmq_q4_0.log" | grep 'M=\(4\|16\|64\|512\):'
  if [ -z "${SKIP_Q4_K:-}" ]; then
    timeout 90 python3 bench/mmq_matmul.py --types Q4_K --ms 4,16,64 > "$OUT/mmq_q4_k.log" 2>&1
    sed '/^autotuned/q' "$OUT/mmq_q4_k.log" | grep -v '^autotuned'; tail -3 "$OUT/mmq_q4_k.log" | grep -i error
  fi
fi
if [ -z "${SKIP_ENGINE:-}" ]; then
  wait; ls -la "$M" | tail -n +2
  echo "== engine: MINFER_MMQ unset vs 1 $(since)"
  for f in ${BENCH:-qwen2.5-7b-q4_0 llama3-8b-q4_k}; do
    for mmq in "" 1; do
      echo "-- $f MINFER_MMQ=${mmq:-unset}"
      MINFER_MMQ=$mmq timeout ${BENCH_TIMEOUT:-100} python3 -m minfer.cli bench -m "$M/$f.gguf" --device cuda \
        -p 512 -n 32 -b 4,16,64 -r 2 2>&1 | tee "$OUT/bench-$f-mmq${mmq:-0}.log" | grep -E " (pp|tg|b)[0-9]+ " | tail -6
    done
  done
fi
echo "== summary $(since)"
for log in "$OUT"/mmq_q4_0.log "$OUT"/mmq_q4_k.log; do [ -f "$log" ] && grep -A40 "^summary" "$log" | grep "M="; done
for log in "$OUT"/bench-*.log; do
  [ -f "$log" ] || continue
  printf '%-34s' "$(basename "$log" .log)"
  awk '$5 ~ /^(pp512|tg32|b4|b16|b64)$/ {printf " %s %s", $5, $6}' "$log"; echo
done
