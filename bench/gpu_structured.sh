#!/usr/bin/env bash
# One device call: what structured outputs cost in decode tok/s on the H200 (issue 28's acceptance: <= 10 %
# at B=1 and B=16 on a 7B), then the grammar tests of the cuda backend on the real GPU (compiled, real graphs). Run from the repo root on the GPU machine,
# carrying .whl (the server's wheels, bench/gpu_serve.sh's, plus llguidance's):
#   pip download llguidance==1.9.1 --no-deps --only-binary=:all: --python-version 3.12 \
#       --platform manylinux_2_31_x86_64 -d .whl                       # here, once (one abi3 wheel, no deps)
#   device: bash bench/gpu_structured.sh        carry [".whl"]
source bench/gpu_server_env.sh  # (.whl deps, OUT, M, F: the 7B Q4_0 synthetic model)
echo "== decode tok/s, free text vs json_schema (7B Q4_0, greedy, ${TOKENS:-256} tokens a request)"
timeout 360 python3 bench/structured.py -m "$F" --device cuda --batch ${BATCH:-1,16} --tokens ${TOKENS:-256} \
  --rounds ${ROUNDS:-3} 2>&1 | tee "$OUT/structured.log" | tail -6
echo "== cuda tests: grammar rows picked on the device (masked decode graphs), the masks and embeddings"
MINFER_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider tests/backends/test_cuda_backend.py \
  -k "structured or grammar_rows or overlapped" 2>&1 | tail -4
