#!/usr/bin/env bash
# One device call for the server on the H200: the server's deps from .whl/ (carried), a 7B synthetic
# model, the engine's batched numbers (decode phase and whole request), the engine alone under the
# server's workload, then the server through HTTP. Run from the repo root on the GPU machine.
source bench/gpu_server_env.sh  # (.whl deps, OUT, M, F: the 7B Q4_0 synthetic model)
C=${CONC:-1,16,64}
if [ -n "${TESTS:-}" ]; then
  echo "== pytest $TESTS"
  MINFER_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -x -p no:cacheprovider $TESTS ${K:+-k "$K"} 2>&1 | tail -8
fi
if [ -n "${ATTN:-}" ]; then echo "== prompt-chunk attention"; timeout 120 python3 bench/studies/attention_prefill.py 2>&1 | tail -9; fi
echo "== minfer bench (pp, tg; -b: decode phase, and whole request)"
timeout 240 python3 -m minfer.cli bench -m "$F" --device cuda -p ${PP:-512} -n ${TG:-128} -b "${C#1,}" -r ${REPS:-2} \
  2>&1 | tee "$OUT/bench-b.log" | tail -8
echo "== engine alone, the server's workload"
timeout 200 python3 bench/engine_load.py "$F" --device cuda --concurrency "$C" 2>&1 | tee "$OUT/engine-load.log" | tail -8
echo "== HTTP"
timeout 300 python3 bench/serve.py -m "$F" --device cuda --concurrency "$C" --prompt-tokens 128 --gen-tokens 128 \
  --rounds ${ROUNDS:-2} ${SERVE_ARGS:-} 2>&1 | tee "$OUT/serve.log" | tail -12
