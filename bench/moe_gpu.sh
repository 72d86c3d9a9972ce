#!/usr/bin/env bash
# Issue 25 on the H200: the mixtures of experts on cuda, side by side with llama.cpp's CUDA build, same files.
# One device call per PART (each fits the 10-minute command limit; /tmp stays while the machine is warm):
#
#   PART=build   carry [".anchor", ".whl"]   llama.cpp's CUDA llama-bench + llama-batched-bench (/work/shared/anchor:
#                                            `bash prepare.sh` here fills .anchor), the synthetic qwen3-30b-a3b Q4_K_M
#                                            (~18 GB: 128 experts of 768, 8 used; Q6_K ffn_down_exps in the more-bits
#                                            layers, as llama.cpp's mix) and this change's GPU tests (compiled kernels:
#                                            the MoE contracts' conformance, the tiny MoE families against llama.cpp)
#   PART=bench   (no carry; after build)     tg128 / pp512 of minfer and llama-bench (interleaved: minfer, llama.cpp,
#                                            minfer, llama.cpp), then batched decode B=16 (minfer bench -b 16, the
#                                            decode phase; llama-batched-bench -npl 16, its S_TG), the ratio table
#                                            against the issue's targets (tg128 >= 1.3x, pp512 >= 2x, B=16 >= 1.3x)
#                                            and the % of the copy roofline counting only the chosen experts' bytes
#   PART=kernels (no carry; after build)     bench/kernels.py --only moe: the router, the expert GEMV of a decode row,
#                                            the grouped MMQ of B=16 and of a 512-token prompt (moe_gemv vs moe_mmq at
#                                            B=16 decides the picker's fast path), the weighted sum
#   PART=mixtral (no carry; after build)     mixtral-8x7b Q4_K_M (~26 GB) tg128 / pp512, minfer and llama.cpp
#   PART=gptoss-build  carry [".anchor", ".whl"]   llama.cpp's CUDA build (as PART=build, skipped when there), the
#                                            synthetic gpt-oss-20b MXFP4 (12.1 GB, ggml-org's mix: experts MXFP4,
#                                            attention / embd / output Q8_0) and the gpt-oss GPU tests (compiled
#                                            kernels: the sink / expert-bias / swiglu_oai conformance cases, tiny-gpt-oss
#                                            against llama.cpp)
#   PART=gptoss  (no carry; after gptoss-build)  gpt-oss-20b MXFP4 tg128 / pp512, minfer and llama-bench
#                                            interleaved twice, the ratio table (issue target: tg128 >= 1.3x) and
#                                            the % of copy bandwidth counting only the 4 chosen experts of 32
# Tables print last; logs in $OUT.
set -uo pipefail
PART=${PART:-build}
export PYTHONPATH=.:/tmp/pylib:${PYTHONPATH:-} PYTHONUNBUFFERED=1
M=${M:-/tmp/models}; OUT=${OUT:-/tmp/out}; mkdir -p "$M" "$OUT" /tmp/pylib
T0=$(date +%s); since() { echo "[$(( $(date +%s) - T0 )) s]"; }
synth() { [ -f "$M/$1-$2.gguf" ] || python3 -m minfer.cli synth "$1" "$2" "$M/$1-$2.gguf" > /dev/null; }
wheels() { for w in .whl/*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/pylib; done; }
LB=/tmp/llama.cpp/build-cuda/bin/llama-bench
LBB=/tmp/llama.cpp/build-cuda/bin/llama-batched-bench
F="$M/qwen3-30b-a3b-q4_k_m.gguf"
G="$M/gpt-oss-20b-mxfp4.gguf"

# minfer_rows FILE LABEL ARGS...: `minfer bench --json` rows as {engine, file, test, tok_s, gbps, pct}
minfer_rows() {
  local f=$1 label=$2; shift 2
  timeout 300 python3 -m minfer.cli bench -m "$f" --device cuda "$@" --json 2>/dev/null | python3 -c "
import json, sys
d = json.load(sys.stdin)
for r in d['results']:
    print(json.dumps({'engine': 'minfer', 'file': '$label', 'test': r['test'], 'tok_s': r['tok_s'],
                      'gbps': r.get('gbs'), 'pct': r.get('pct_copy_bw')}))" | tee -a "$OUT/moe-bench.jsonl"
}
llama_rows() {
  local f=$1 label=$2
  timeout 200 $LB -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o json 2>/dev/null | python3 -c "
import json, sys
for r in json.load(sys.stdin):
    t = ('pp%d' % r['n_prompt']) if r['n_prompt'] else ('tg%d' % r['n_gen'])
    print(json.dumps({'engine': 'llama.cpp', 'file': '$label', 'test': t, 'tok_s': r['avg_ts']}))" \
    | tee -a "$OUT/moe-bench.jsonl"
}

# table: the ratio table of $OUT/moe-bench.jsonl (median of each engine's runs) against the issue's targets
table() {
  echo "== table $(since)"
  python3 - "$OUT/moe-bench.jsonl" <<'PY'
import json, sys, collections, statistics
rows, pct = collections.defaultdict(list), {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    test = r["test"]  # (minfer's b16: the decode phase, as llama-batched-bench's S_TG; b16e2e: whole requests)
    rows[(r["file"], test, r["engine"])].append(r["tok_s"])
    if r["engine"] == "minfer" and r.get("pct") is not None and test.startswith("tg"):
        pct[(r["file"], test)] = r["pct"]  # a decode row reads k of E experts: minfer bench's weight bytes
target = {("qwen3-30b-a3b", "tg128"): 1.3, ("qwen3-30b-a3b", "pp512"): 2.0, ("qwen3-30b-a3b", "b16"): 1.3,
          ("gpt-oss-20b", "tg128"): 1.3}
print(f"{'file':16} {'test':6} {'minfer':>10} {'llama.cpp':>10} {'ratio':>7} {'target':>7} {'% copy (chosen experts)':>24}")
for (f, t) in sorted({(f, t) for f, t, _ in rows}):
    m, l = rows.get((f, t, "minfer")), rows.get((f, t, "llama.cpp"))
    if not m or not l:
        continue
    mm, ll = statistics.median(m), statistics.median(l)
    p = pct.get((f, t))
    print(f"{f:16} {t:6} {mm:10.1f} {ll:10.1f} {mm / ll:7.2f} {target.get((f, t), float('nan')):7.1f} "
          f"{'' if p is None else f'{p:.1f}':>24}")
PY
}

case $PART in
build)
  wheels
  (bash .anchor/device_build.sh cuda > "$OUT/llama-build.txt" 2>&1; tail -1 "$OUT/llama-build.txt") &
  (synth qwen3-30b-a3b q4_k_m; echo "synth done $(since)") &
  echo "== cuda tests (compiled kernels) $(since)"
  MINFER_TEST_DEVICE=cuda timeout 300 python3 -m pytest -q -p no:cacheprovider tests/contracts/test_conformance.py \
    tests/backends/test_families_gpu.py -k "moe or mixtral" 2>&1 | grep -v XDG | tail -3
  wait
  ls -la $LB $LBB "$M" ;;
bench)
  [ -x $LB ] || { echo "!! no $LB: run PART=build first (same warm machine)"; exit 1; }
  synth qwen3-30b-a3b q4_k_m
  : > "$OUT/moe-bench.jsonl"
  for round in 1 2; do
    echo "== qwen3-30b-a3b round $round $(since)"
    minfer_rows "$F" qwen3-30b-a3b -p 512 -n 128 -r 3
    llama_rows "$F" qwen3-30b-a3b
  done
  echo "== batched decode B=16 $(since)"
  minfer_rows "$F" qwen3-30b-a3b -p 0 -n 0 -b 16 -r 2
  timeout 240 $LBB -m "$F" -ngl 99 -fa 1 -c 20000 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 16 2>&1 \
    | tee "$OUT/batched.txt" | python3 -c "
import json, re, sys
for line in sys.stdin:  # |    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s | ...
    f = [x.strip() for x in line.split('|')]
    if len(f) > 9 and f[3] == '16':
        print(json.dumps({'engine': 'llama.cpp', 'file': 'qwen3-30b-a3b', 'test': 'b16', 'tok_s': float(f[8])}))" \
    | tee -a "$OUT/moe-bench.jsonl"
  table
  ;;
kernels)
  timeout 500 python3 bench/kernels.py --only moe 2>&1 | tail -20 ;;
mixtral)
  [ -x $LB ] || { echo "!! no $LB: run PART=build first (same warm machine)"; exit 1; }
  synth mixtral-8x7b q4_k_m
  : > "$OUT/moe-bench.jsonl"
  minfer_rows "$M/mixtral-8x7b-q4_k_m.gguf" mixtral-8x7b -p 512 -n 128 -r 3
  llama_rows "$M/mixtral-8x7b-q4_k_m.gguf" mixtral-8x7b ;;
gptoss-build)
  wheels
  if [ -x $LB ]; then echo "llama.cpp: built already"; else
    (bash .anchor/device_build.sh cuda > "$OUT/llama-build.txt" 2>&1; tail -1 "$OUT/llama-build.txt") &
  fi
  (synth gpt-oss-20b mxfp4; echo "synth done $(since)") &
  echo "== cuda tests (compiled kernels) $(since)"
  MINFER_TEST_DEVICE=cuda timeout 300 python3 -m pytest -q -p no:cacheprovider tests/contracts/test_conformance.py \
    tests/backends/test_families_gpu.py -k "(attention or moe or swiglu_oai or gpt-oss) and not vulkan" 2>&1 | grep -v XDG | tail -3
  wait
  ls -la $LB "$M" ;;
gptoss)
  [ -x $LB ] || { echo "!! no $LB: run PART=gptoss-build first (same warm machine)"; exit 1; }
  synth gpt-oss-20b mxfp4
  : > "$OUT/moe-bench.jsonl"
  for round in 1 2; do
    echo "== gpt-oss-20b round $round $(since)"
    minfer_rows "$G" gpt-oss-20b -p 512 -n 128 -r 3
    llama_rows "$G" gpt-oss-20b
  done
  table ;;
*) echo "PART must be build, bench, kernels, mixtral, gptoss-build or gptoss"; exit 2 ;;
esac
echo "== done $(since)"
