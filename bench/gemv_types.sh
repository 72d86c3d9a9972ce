#!/usr/bin/env bash
# One device call for the decode GEMVs of every weight type (issue 9, build item 3):
#   1. GPU conformance of the planes GEMVs (Q8_0, Q6_K, Q5_0/Q5_1/Q5_K, Q3_K, Q2_K) under
#      MINFER_TEST_DEVICE=cuda: their kernel tests (tests/kernels/triton/test_qmatmul.py), their contracts'
#      conformance cases, the cuda backend's mixed-type fused q+k+v test;
#   2. bench/kernels.py: each GEMV at the 7B/8B decode shapes against cuBLAS on the f16 copy
#      (linear_f16, what one decode row of these types ran before), µs, GB/s, % of copy bandwidth;
#   3. `minfer bench` decode (tg128) on synthetic Llama-3-8B Q4_K (Q6_K output), Llama-3-8B Q4_K_M
#      (Q6_K attn_v / ffn_down in 16 of 32 layers: mixed q+k+v) and Qwen2.5-7B Q8_0;
#   then a short table. Run from the repo root on the GPU machine: `bash bench/gemv_types.sh` (about
#   5-6 minutes; the timeouts bound it at ~8.5: pytest 120 s, kernels 110 s, 3 x tg 90 s).
# Knobs: MODELS="preset:quant ...", SKIP_TESTS=1, ONLY (bench/kernels.py regex), REPS, OUT, M, SWEEP (model
# names for bench/studies/gemv_sweep.py: the planes types' configs, best in a second call).
set -uo pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; M=${M:-/tmp/models}; mkdir -p "$OUT" "$M"
T0=$(date +%s)
since() { echo "[$(( $(date +%s) - T0 )) s]"; }
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
git log --oneline -1 2>/dev/null || true

# the models are written in the background while the tests run (random weights in the real shapes)
MODELS=${MODELS:-llama3-8b:q4_k llama3-8b:q4_k_m qwen2.5-7b:q8_0}
declare -A SYNTH
for spec in $MODELS; do
  f="$M/${spec/:/-}.gguf"
  if [ ! -f "$f" ]; then
    python3 -m minfer.cli synth ${spec/:/ } "$f.part" > "$OUT/synth-${spec/:/-}.log" 2>&1 && mv "$f.part" "$f" &
    SYNTH[$spec]=$!
  fi
done

if [ -z "${SKIP_TESTS:-}" ]; then
  echo "== GPU tests $(since)"
  MINFER_TEST_DEVICE=cuda timeout ${PYTEST_TIMEOUT:-120} python3 -m pytest -q -x -p no:cacheprovider \
    tests/kernels/triton/test_qmatmul.py tests/contracts/test_conformance.py tests/backends/test_cuda_backend.py \
    -k "${TESTS:-planes or mixed or q8_0_gemv or q6_k_gemv or q5_gemv or q3_k_gemv or q2_k_gemv}" 2>&1 \
    | tee "$OUT/pytest.log" | tail -8
fi

echo "== bench/kernels.py (decode GEMVs at 7B/8B shapes) $(since)"
timeout ${BENCH_TIMEOUT:-110} python3 bench/kernels.py --only "${ONLY:-planes|linear_f16|int4_gemv}" \
  > "$OUT/bench_kernels.log" 2>&1; echo "bench rc=$?"

echo "== minfer bench tg128 $(since)"
for spec in $MODELS; do
  f="$M/${spec/:/-}.gguf"
  [ -n "${SYNTH[$spec]:-}" ] && wait "${SYNTH[$spec]}"
  ls -la "$f" 2>/dev/null | awk '{print $5, $9}' || tail -3 "$OUT/synth-${spec/:/-}.log"
  timeout ${TG_TIMEOUT:-90} python3 -m minfer.cli bench -m "$f" --device cuda -p 0 -n 128 -r ${REPS:-2} 2>&1 \
    | tee "$OUT/bench-${spec/:/-}.log" | tail -4
done

if [ -n "${SWEEP:-}" ]; then  # a second call: SWEEP="llama3-8b-q4_k_m qwen2.5-7b-q8_0" SKIP_TESTS=1 ONLY=none
  echo "== gemv sweep $(since)"
  timeout ${SWEEP_TIMEOUT:-300} python3 bench/studies/gemv_sweep.py $(for f in $SWEEP; do echo "$M/$f.gguf"; done) 2>&1 \
    | tee "$OUT/sweep.log" | tail -40
fi

echo "== table $(since)"
python3 - "$OUT" $MODELS <<'EOF'
import re, sys
from pathlib import Path
out, models = Path(sys.argv[1]), sys.argv[2:]
rows = {}  # shape -> kernel -> (µs, GB/s, % copy)
bw = ""
for line in (out / "bench_kernels.log").read_text().splitlines():
    if line.startswith("#") and "copy bandwidth" in line:
        bw = line
    m = re.match(r"(\S+)\s+(\d+x\d+ \S+ \S+)\s+\S+\s+(\S+)\s+(\S+)\s+(\S+)%", line)
    if m:
        rows.setdefault(m.group(2), {})[m.group(1)] = (float(m.group(3)), float(m.group(4)), float(m.group(5)))
print(bw)
kernels = ["linear_f16[m=1]", "int4_gemv[Q4_K]"] + [f"planes_gemv[{t}]" for t in
                                                         ("Q8_0", "Q6_K", "Q5_K", "Q5_0", "Q5_1", "Q3_K", "Q2_K")]
labels = ["f16 cuBLAS", "Q4_K int4"] + [k[12:-1] for k in kernels[2:]]
print(f"{'shape':<32}" + "".join(f"{x:>16}" for x in labels))
print(f"{'':<32}" + "".join(f"{'µs / % copy':>16}" for _ in kernels))
for shape, ks in rows.items():
    cells = [f"{ks[k][0]:7.1f} /{ks[k][2]:4.0f}%" if k in ks else "" for k in kernels]
    print(f"{shape:<32}" + "".join(f"{c:>16}" for c in cells))
print("(f16 row: cuBLAS on the f16 copy, 2 bytes per weight; % copy = the kernel's bytes / time / copy bandwidth)")
for spec in models:
    f = out / f"bench-{spec.replace(':', '-')}.log"
    tg = [l for l in f.read_text().splitlines() if "tg128" in l] if f.exists() else []
    print(f"{spec:<22} " + (tg[-1].strip() if tg else "no tg128 row (see the log)"))
EOF
grep -E "passed|failed|error" "$OUT/pytest.log" 2>/dev/null | tail -2
echo "done $(since)"
