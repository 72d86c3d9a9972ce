#!/usr/bin/env bash
# One device call for the kernel work (issue: kernels I): environment, conformance at full sizes,
# the judge report, the kernel benchmark, the GPU pytest run. Run from the repo root on the GPU
# machine; writes logs to $OUT and prints a short table last.
set -uo pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1 MINFER_TEST_DEVICE=cuda
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
echo "== conformance (full sizes)"
timeout 240 python3 -m minfer.contracts.conformance --full --device cuda --failures 2>&1 | tee "$OUT/conformance.log" | tail -8
echo "== judge"
timeout 240 python3 -m minfer.contracts.judge --out "$OUT" 2>&1 | tail -3
echo "== bench/kernels.py"
timeout 150 python3 bench/kernels.py ${BENCH_ARGS:-} 2>&1 > "$OUT/bench_kernels.log"; echo "bench rc=$?"
echo "== pytest (cuda)"
timeout ${PYTEST_TIMEOUT:-150} python3 -m pytest -q -x -p no:cacheprovider tests/kernels tests/contracts 2>&1 | tail -6
echo "== bench table"
cat "$OUT/bench_kernels.log" | tail -80
echo "== judge table"
cat "$OUT/judge.md" 2>/dev/null | head -60
if [ -n "${STUDY:-}" ]; then echo "== gemv study"; timeout 90 python3 bench/studies/gemv_study.py 2>&1 | tail -25; fi
