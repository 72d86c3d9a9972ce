#!/usr/bin/env bash
# One device call for the prefix cache on the H200 (issue 28 item 4): the server's deps from .whl/
# (carried), a 7B Q4_0 synthetic model, the cuda test of the cache compiled, then 64 concurrent
# requests sharing a 2,000-token prefix + 100 own tokens through HTTP, cache on vs off (TTFT p50,
# aggregate tok/s, hit / miss tokens, greedy outputs identical). Run from the repo root on the GPU machine.
source bench/gpu_server_env.sh  # (.whl deps, OUT, M, F: the 7B Q4_0 synthetic model)
echo "== pytest (compiled kernels)"
MINFER_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -x -p no:cacheprovider \
  tests/backends/test_cuda_backend.py -k prefix_cache 2>&1 | tail -4
echo "== HTTP: cache on vs off"
timeout 480 python3 bench/prefix_cache.py -m "$F" --device cuda --concurrency ${CONC:-64} \
  --prefix-tokens ${PREFIX:-2000} --own-tokens ${OWN:-100} --gen-tokens ${GEN:-128} --rounds ${ROUNDS:-2} --json \
  2>&1 | tee "$OUT/prefix-cache.log" | tail -8
