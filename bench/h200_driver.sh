#!/usr/bin/env bash
# One H200 session's measurements as a background driver (2026-12-04): the first device call starts it under setsid
# (so it outlives the call) and every later call only waits and copies its logs back. The machine stays warm while
# calls follow each other within its idle window, so the work no longer has to fit one 10-minute command, and a
# slow step costs no call boundary. Carry [".anchor", ".whl"] on the first call.
#
#   first call:  bash bench/h200_driver.sh start; bash bench/h200_driver.sh wait 540
#   later calls: bash bench/h200_driver.sh wait 570     (returns when the driver is done or after N s; then polls:
#                                                       copies /tmp/drv/*.txt into $OUT)
#   PARTS=cpu bash bench/h200_driver.sh start           only the host CPU's table (llama.cpp's CPU build alone, with
#                                                       all cores; the three files it needs): ~7 minutes
#   PARTS=small bash bench/h200_driver.sh start         small decode batches (issue 27): the GEMV's compiled tests,
#                                                       bench/gemv_rows.py, the 7B at B=1/2/4/8 against
#                                                       llama-batched-bench (its CUDA build made meanwhile): ~10 minutes
#   PARTS=small+cpu bash bench/h200_driver.sh start     both: small, then the host CPU's table (~11 minutes)
#   PARTS=moequick bash bench/h200_driver.sh start      the expert GEMV's tile sweep, then qwen3-30b-a3b pp512, tg128, B=16
#                                                       against llama.cpp (its CUDA build meanwhile): ~6 minutes
#                                                       (SWEEP_ROWS=0: no sweep; MM16SWEEP=1: moe_mm16's prompt tiles too)
#   PARTS=cpudiag bash bench/h200_driver.sh start       issue 26's two open cells: the Q4_0 product at 2 / 4 / 8 threads,
#                                                       Qwen2.5-0.5B at 4 / 8 threads x3, unpinned and one thread a
#                                                       core (OMP_PLACES / OMP_PROC_BIND), against llama.cpp: ~6 min
#   PARTS=moequick+cpudiag bash bench/h200_driver.sh start   both, one after the other: ~12 minutes
#   PARTS=moelean bash bench/h200_driver.sh start       the sweep's one-row tiles, then qwen3-30b-a3b B=16 on this tree,
#                                                       on .old/base (see the mode), on this tree again (no llama.cpp): ~4 min
#   PARTS=cpudec bash bench/h200_driver.sh start        the host CPU's small-model decode (tg32, 4 / 8 / 16 threads):
#                                                       this tree, $BASE's (.anchor/base-cpu) and llama.cpp's: ~4 min
#                                                       (PARTS=cpudec+cpu: then the host CPU's table, ~10 min in all)
#   PARTS=dnorm bash bench/h200_driver.sh start         the deferred RMSNorm (QMatMulAddNorm): its compiled tests,
#                                                       bench/studies/deferred_norm.py, then SmolLM2 and Qwen2.5-0.5B
#                                                       tg128 with and without it, and llama.cpp's: ~9 minutes
#   PARTS=moearch bash bench/h200_driver.sh start       the MoE kernels' compiled tests, moe_mm16's tiles, then
#                                                       qwen3moe (and on .anchor/base-tree), gpt-oss-20b, gemma3-1b,
#                                                       qwen3-8b, one round each against llama.cpp: ~18 minutes
#   PARTS=moe bash bench/h200_driver.sh start           only the mixtures of experts (issue 25): the two MoE files,
#                                                       their GPU tests (and tiny-gpt-oss on the tree at $BASE), the
#                                                       kernel tables of bench/moe_profile.py, minfer's runs while
#                                                       llama.cpp's CUDA build runs, then llama.cpp's and the tables
#                                                       (one round each): ~10 minutes; STUDY=0: the runs and tables
#                                                       alone (qwen3moe pp512 / tg128 / B=16, gpt-oss pp512 / tg128
#                                                       against llama.cpp): ~7 minutes
#
# Steps, in order (each one's log in /tmp/drv/<step>.txt; the ratio tables print into /tmp/drv/tables.txt):
#   setup     wheels into /tmp/pylib; llama.cpp's CUDA and CPU llama-bench / llama-batched-bench built in the
#             background (.anchor/device_build.sh cuda cpu); the synthetic files made in the background
#   gputests  the compiled kernels' tests this tree has never run on a GPU: MoE / gpt-oss conformance, the families
#   moe       qwen3-30b-a3b Q4_K_M tg128 / pp512 (minfer, llama.cpp, x2 interleaved), batched decode B=16   (issue 25)
#   gptoss    gpt-oss-20b MXFP4 tg128 / pp512 x2                                                            (issue 25)
#   arch      gemma3-1b Q4_0 and qwen3-8b Q4_K_M tg128 / pp512 x2 (the NormRoPE / NormAddRMSNorm fusions) (issue 24)
#   batch7b   qwen2.5-7b Q4_0 tg128 and batched decode B=1/2/4/8 against llama-batched-bench           (issue 27)
#   cpu       the host CPU: SmolLM2-135M Q4_1, Qwen2.5-0.5B Q4_0, Llama-3-8B Q4_K at 4 / 8 / 16 threads,
#             minfer bench --device cpu against llama.cpp's CPU llama-bench, interleaved; where the CPU has AMX,
#             the prompts again with MINFER_CPU_ISA=amx (the opt-in build) and llama.cpp's with --repack 0 (no
#             AMX / repacked layouts), and their ratios; first, where .old/q4_vnni.c was carried (e.g. `git
#             show fae6661:minfer/kernels/cpu/q4_vnni.c > .old/q4_vnni.c`, carry ".old" too), that kernel's
#             products against the tree's on the host's cores (bench/studies/cpu_gemm_versions.py: the same bits,
#             then timed at 1 / 4 / 16 threads) into /tmp/drv/gemm-versions.txt                         (issue 26)
#   moesweep  MOESWEEP=1 (after the cpu part): bench/moe_gemv_sweep.py, the expert GEMV's tiles   (issue 25)
set -uo pipefail
D=/tmp/drv; M=/tmp/models; LB=/tmp/llama.cpp/build-cuda/bin; LC=/tmp/llama.cpp/build-cpu/bin
export PYTHONPATH=$PWD:/tmp/pylib PYTHONUNBUFFERED=1

case ${1:-} in
start)
  mkdir -p $D $M /tmp/pylib
  setsid nohup bash "$0" run > $D/driver.txt 2>&1 < /dev/null &
  echo "driver started (pid $!)"; exit 0 ;;
wait)
  for _ in $(seq "${2:-570}"); do grep -q "^== done" $D/driver.txt 2>/dev/null && break; sleep 1; done
  exec bash "$0" poll ;;
poll)
  OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
  tail -5 $D/driver.txt; echo "--- tables"; cat $D/tables.txt 2>/dev/null
  (cd $D && tar czf "$OUT/drv.tgz" ./*.txt ./*.jsonl 2>/dev/null); df -h /tmp | tail -1; exit 0 ;;
run) ;;
*) echo "usage: h200_driver.sh start|wait [SECONDS]|poll"; exit 2 ;;
esac

T0=$(date +%s); since() { echo "[$(( $(date +%s) - T0 )) s]"; }
step() { echo "== $1 $(since)"; }
synth() { [ -f "$M/$1-$2.gguf" ] || python3 -m minfer.cli synth "$1" "$2" "$M/$1-$2.gguf.part" > /dev/null \
          && mv "$M/$1-$2.gguf.part" "$M/$1-$2.gguf"; }
have() { while [ ! -f "$M/$1-$2.gguf" ]; do sleep 2; done; }

# minfer_rows FILE LABEL DEVICE ARGS...: minfer bench --json rows as {engine, file, test, tok_s, pct}
minfer_rows() {
  local f=$1 label=$2 dev=$3; shift 3
  timeout 400 python3 -m minfer.cli bench -m "$f" --device "$dev" "$@" --json 2>>$D/errors.txt | python3 -c "
import json, sys
d = json.load(sys.stdin)
for r in d['results']:
    print(json.dumps({'engine': 'minfer', 'file': '$label', 'test': r['test'], 'tok_s': r['tok_s'],
                      'pct': r.get('pct_copy_bw')}))" | tee -a $D/bench.jsonl
}
# llama_rows BIN FILE LABEL ARGS...: llama-bench -o json rows
llama_rows() {
  local bin=$1 f=$2 label=$3; shift 3
  timeout 300 $bin/llama-bench -m "$f" "$@" -o json 2>>$D/errors.txt | python3 -c "
import json, sys
for r in json.load(sys.stdin):
    t = ('pp%d' % r['n_prompt']) if r['n_prompt'] else ('tg%d' % r['n_gen'])
    print(json.dumps({'engine': 'llama.cpp', 'file': '$label', 'test': t, 'tok_s': r['avg_ts']}))" | tee -a $D/bench.jsonl
}
# batched_rows FILE LABEL NPL: llama-batched-bench's S_TG per B as test b<B>
batched_rows() {
  timeout 300 $LB/llama-batched-bench -m "$1" -ngl 99 -fa 1 -c 20000 -b 2048 -ub 512 -npp 128 -ntg 128 -npl "$3" 2>&1 \
    | tee -a $D/batched.txt | python3 -c "
import json, sys
for line in sys.stdin:
    f = [x.strip() for x in line.split('|')]
    if len(f) > 9 and f[3].isdigit():
        print(json.dumps({'engine': 'llama.cpp', 'file': '$2', 'test': 'b' + f[3], 'tok_s': float(f[8])}))" \
    | tee -a $D/bench.jsonl
}
table() {
  python3 - $D/bench.jsonl "$1" >> $D/tables.txt <<'PY'
import json, sys, collections, statistics
rows, pct = collections.defaultdict(list), {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows[(r["file"], r["test"], r["engine"])].append(r["tok_s"])
    if r["engine"] == "minfer" and r.get("pct") is not None:
        pct[(r["file"], r["test"])] = r["pct"]
print(f"--- {sys.argv[2]}")
print(f"{'file':22} {'test':7} {'minfer':>10} {'llama.cpp':>10} {'ratio':>6} {'% copy':>7}  runs")
for (f, t) in sorted({(f, t) for f, t, _ in rows if f.startswith(sys.argv[2])}):
    m, l = rows.get((f, t, "minfer")), rows.get((f, t, "llama.cpp"))
    if not m or not l:
        continue
    mm, ll = statistics.median(m), statistics.median(l)
    p = pct.get((f, t))
    print(f"{f:22} {t:7} {mm:10.1f} {ll:10.1f} {mm / ll:6.2f} {'' if p is None else f'{p:.1f}':>7}  "
          f"{'/'.join(f'{x:.0f}' for x in m)} vs {'/'.join(f'{x:.0f}' for x in l)}")
PY
}

# llama.cpp's builds from .anchor's sources (device_build.sh's flags): build_cpu JOBS, build_cuda JOBS (llama-bench,
# llama-batched-bench); each ends its output with "<kind> build rc=N [T s]"
llama_src() { W=/tmp/llama.cpp; [ -d $W ] || tar xzf .anchor/llama-src.tgz -C /tmp; cd $W; }
build_cpu() {
  ([ -x $LC/llama-bench ] && { echo "cpu build rc=0 (made before)"; exit 0; }; llama_src
   cmake -S . -B build-cpu -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
     -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON > cmake-cpu.log 2>&1 \
     && cmake --build build-cpu --target llama-bench -j$1 > build-cpu.log 2>&1; echo "cpu build rc=$? $(since)")
}
build_cuda() {  # (skipped where an earlier part on this machine built it: parts can follow each other warm)
  ([ -x $LB/llama-bench ] && [ -x $LB/llama-batched-bench ] && { echo "cuda build rc=0 (made before)"; exit 0; }
   llama_src
   cmake -S . -B build-cuda -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
     -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > cmake-cuda.log 2>&1 \
     && cmake --build build-cuda --target llama-bench llama-batched-bench -j$1 > build-cuda.log 2>&1
   echo "cuda build rc=$? $(since)")
}

# moe_gputests TIMEOUT: the newest MoE kernels compiled (the GLU fusion, the route's top-k, the f32 GEMV, moe_mm16)
# and the split decode attention
moe_gputests() {
  MINFER_TEST_DEVICE=cuda timeout $1 python3 -m pytest -q -p no:cacheprovider tests/contracts/test_conformance.py \
    tests/kernels/triton/test_moe.py tests/kernels/triton/test_gemv_f32.py tests/backends/test_cuda_backend.py \
    tests/kernels/triton/test_families.py \
    -k "glu or gemv_f32 or expert_gate_up or route or mm16 or attention_rows" \
    > $D/gputests.txt 2>&1
  tail -3 $D/gputests.txt
}

# issue 26's open cells: Qwen2.5-0.5B Q4_0 pp512 at 4 threads (0.79x), tg32 at 8 (0.97x): the Q4_0 product's scaling
# (2 / 4 / 8 threads, twice), then the model at 4 and 8 threads three times, unpinned and with libgomp's threads one
# per core (OMP_PLACES=cores OMP_PROC_BIND=spread), against llama.cpp
cpudiag() {
  build_cpu 16 > $D/llama-build.txt 2>&1
  [ "$PARTS" = cpudiag ] && synth qwen2.5-0.5b q4_0; have qwen2.5-0.5b q4_0; cat $D/llama-build.txt
  grep -c ^processor /proc/cpuinfo; lscpu -e 2>/dev/null | head -20 > $D/lscpu.txt
  cp minfer/kernels/cpu/q4_vnni.c /tmp/same_q4_vnni.c
  step products
  for rep in 1 2; do python3 bench/studies/cpu_gemm_versions.py /tmp/same_q4_vnni.c --types Q4_0,Q4_1 \
    --threads 2,4,8 2>&1 | grep " P1 " >> $D/gemm-threads.txt; done; cat $D/gemm-threads.txt
  step models
  f=$M/qwen2.5-0.5b-q4_0.gguf
  for rep in 1 2 3; do for th in 4 8; do
    minfer_rows $f "cpu-qwen-t$th" cpu -t $th -p 512 -n 32 -r 2 -b ""
    OMP_PLACES=cores OMP_PROC_BIND=spread minfer_rows $f "pinned-qwen-t$th" cpu -t $th -p 512 -n 32 -r 2 -b ""
    llama_rows $LC $f "cpu-qwen-t$th" -t $th -p 512 -n 32 -r 2
    tail -2 $D/bench.jsonl | sed "s/cpu-qwen-t$th/pinned-qwen-t$th/" >> $D/bench.jsonl  # (the same llama.cpp rows)
  done; done
  table cpu-qwen; table pinned-qwen
}

PARTS=${PARTS:-all}
step setup
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
grep -m1 "model name" /proc/cpuinfo; nproc; grep -o -w -E "avx512_vnni|avx512f|avx_vnni|amx_tile" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
for w in .whl/*.whl; do python3 -m zipfile -e "$w" /tmp/pylib; done
if [ "$PARTS" = cpu ]; then  # the CPU build alone, every core on it (device_build.sh's flags)
  build_cpu 16 > $D/llama-build.txt 2>&1 &
  (synth smollm2-135m q4_1; synth qwen2.5-0.5b q4_0; synth llama3-8b q4_k; echo "synth done $(since)") > $D/synth.txt 2>&1 &
  # while it builds (the CPU is busy anyway): the GPU conformance run that segfaulted on the C kernels' cases
  MINFER_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider tests/contracts/test_conformance.py \
    -k "moe or gpt or swiglu" > $D/gputests.txt 2>&1; tail -3 $D/gputests.txt
  wait; cat $D/synth.txt $D/llama-build.txt
  : > $D/bench.jsonl
elif [ "$PARTS" = small ] || [ "$PARTS" = small+cpu ]; then  # small decode batches (issue 27 item 1): the 7B at
  # B=1/2/4/8 and the GEMV rows; small+cpu: then the host CPU's table (its llama.cpp build and files made meanwhile)
  (llama_src) # (unpacked once, before the two builds share it)
  [ "$PARTS" = small ] || {
  build_cpu 4 > $D/llama-build-cpu.txt 2>&1 &
  (synth smollm2-135m q4_1; synth qwen2.5-0.5b q4_0; synth llama3-8b q4_k; echo "synth done $(since)") \
    > $D/synth-cpu.txt 2>&1 & }
  build_cuda 12 > $D/llama-build.txt 2>&1 &
  (synth qwen2.5-7b q4_0; echo "synth done $(since)") > $D/synth.txt 2>&1 &
  [ "${STUDY:-1}" = 0 ] || {
  step gputests
  MINFER_TEST_DEVICE=cuda timeout 400 python3 -m pytest -q -p no:cacheprovider tests/kernels/triton/test_qmatmul.py \
    tests/backends/test_cuda_backend.py tests/backends/test_families_gpu.py \
    -k "small or batched or bucket or mixed or (cuda and gpt)" > $D/gputests.txt 2>&1
  grep -E "passed|failed|Error" $D/gputests.txt | tail -8
  step gemv_rows
  timeout 300 python3 bench/gemv_rows.py > $D/gemv_rows.txt 2>&1; cat $D/gemv_rows.txt; }
  while ! grep -q "synth done" $D/synth.txt; do sleep 2; done; cat $D/synth.txt
  step check  # 2, 3, 4 rows together against each alone, on the 7B's shapes (the GEMVs' row programs included)
  timeout 200 python3 bench/small_batch_check.py $M/qwen2.5-7b-q4_0.gguf > $D/check.txt 2>&1; cat $D/check.txt
  : > $D/bench.jsonl
  step minfer
  S=$M/qwen2.5-7b-q4_0.gguf
  minfer_rows $S qwen2.5-7b cuda -p 512 -n 128 -r 3 -b 1,2,4,8
  step llama; while ! grep -q "build rc" $D/llama-build.txt; do sleep 2; done; cat $D/llama-build.txt
  llama_rows $LB $S qwen2.5-7b -ngl 99 -fa 1 -p 512 -n 128 -r 3
  batched_rows $S qwen2.5-7b 1,2,4,8
  table qwen2.5-7b
  [ "$PARTS" = small ] && { step done; exit 0; }
  while ! grep -q "build rc" $D/llama-build-cpu.txt; do sleep 2; done; cat $D/llama-build-cpu.txt
  while ! grep -q "synth done" $D/synth-cpu.txt; do sleep 2; done; cat $D/synth-cpu.txt
elif [ "$PARTS" = moequick ] || [ "$PARTS" = moequick+cpudiag ]; then  # a short budget: the expert GEMV's tiles,
  # then qwen3moe pp512, tg128 and B=16 only; moequick+cpudiag: then cpudiag (its file made meanwhile)
  build_cuda 14 > $D/llama-build.txt 2>&1 &
  [ "$PARTS" = moequick ] || (synth qwen2.5-0.5b q4_0 &)
  (synth qwen3-30b-a3b q4_k_m; echo "synth done $(since)") > $D/synth.txt 2>&1 &
  step gputests
  moe_gputests 240
  [ "${SWEEP_ROWS:-1,16}" = 0 ] || { step moesweep  # SWEEP_ROWS=0: no sweep
  timeout 360 python3 bench/moe_gemv_sweep.py --rows ${SWEEP_ROWS:-1,16} --glu > $D/moe-gemv-sweep.txt 2>&1
  sed -n '/^--- moe_gemv/,$p' $D/moe-gemv-sweep.txt >> $D/tables.txt; cat $D/tables.txt; }
  [ "${MM16SWEEP:-0}" = 1 ] && { step mm16sweep  # MM16SWEEP=1: moe_mm16's prompt tiles, plain and GLU (~4 min)
  timeout 300 python3 bench/moe_mm16_sweep.py --glu --rows 512 --quick > $D/mm16-sweep.txt 2>&1
  cat $D/mm16-sweep.txt >> $D/tables.txt; }
  while ! grep -q "synth done" $D/synth.txt; do sleep 2; done; cat $D/synth.txt
  : > $D/bench.jsonl
  step minfer
  F=$M/qwen3-30b-a3b-q4_k_m.gguf
  minfer_rows $F qwen3-30b-a3b cuda -p 0 -n 0 -b 16 -r 2
  minfer_rows $F qwen3-30b-a3b cuda -p 512 -n 128 -r 3 -b ""
  if [ -d .anchor/base-tree/minfer ]; then  # the tree before a change, sent inside .anchor (carried): the same rows
    step base
    B=$PWD/.anchor/base-tree
    (cd $B && PYTHONPATH=$B:/tmp/pylib minfer_rows $F base-qwen3-30b-a3b cuda -p 0 -n 0 -b 16 -r 2
     cd $B && PYTHONPATH=$B:/tmp/pylib minfer_rows $F base-qwen3-30b-a3b cuda -p 512 -n 128 -r 3 -b "")
    grep base- $D/bench.jsonl >> $D/tables.txt
  fi
  step llama; while ! grep -q "build rc" $D/llama-build.txt; do sleep 2; done; cat $D/llama-build.txt
  batched_rows $F qwen3-30b-a3b 16
  llama_rows $LB $F qwen3-30b-a3b -ngl 99 -fa 1 -p 512 -n 128 -r 3
  table qwen3-30b
  [ "$PARTS" = moequick ] || { rm -f $F; step cpudiag; cpudiag; }
  step done; exit 0
elif [ "$PARTS" = moearch ]; then  # one call: the MoE kernels' compiled tests, moe_mm16's tiles (MM16SWEEP=0: none),
  # qwen3moe B=16 / pp512 / tg128 (and on .anchor/base-tree), gpt-oss-20b, gemma3-1b and qwen3-8b (gemma3-1b on the
  # base tree too), each one round against llama.cpp: ~18 min
  build_cuda 14 > $D/llama-build.txt 2>&1 &
  (synth qwen3-30b-a3b q4_k_m; synth gemma3-1b q4_0; echo "synth done $(since)") > $D/synth.txt 2>&1 &
  (synth gpt-oss-20b mxfp4; synth qwen3-8b q4_k_m; echo "synth done $(since)") > $D/synth2.txt 2>&1 &
  step gputests
  moe_gputests 300
  [ "${MM16SWEEP:-1}" = 1 ] && { step mm16sweep
  timeout 300 python3 bench/moe_mm16_sweep.py --glu --rows 512 --quick > $D/mm16-sweep.txt 2>&1
  cat $D/mm16-sweep.txt >> $D/tables.txt; }
  while ! grep -q "synth done" $D/synth.txt; do sleep 2; done; cat $D/synth.txt
  : > $D/bench.jsonl
  step minfer
  F=$M/qwen3-30b-a3b-q4_k_m.gguf; E=$M/gemma3-1b-q4_0.gguf
  minfer_rows $F qwen3-30b-a3b cuda -p 0 -n 0 -b 16 -r 2
  minfer_rows $F qwen3-30b-a3b cuda -p 512 -n 128 -r 3 -b ""
  minfer_rows $E gemma3-1b cuda -p 512 -n 128 -r 3 -b ""
  if [ -d .anchor/base-tree/minfer ]; then
    step base
    B=$PWD/.anchor/base-tree
    (cd $B && PYTHONPATH=$B:/tmp/pylib minfer_rows $F base-qwen3-30b-a3b cuda -p 0 -n 0 -b 16 -r 2
     cd $B && PYTHONPATH=$B:/tmp/pylib minfer_rows $F base-qwen3-30b-a3b cuda -p 512 -n 128 -r 3 -b ""
     cd $B && PYTHONPATH=$B:/tmp/pylib minfer_rows $E base-gemma3-1b cuda -p 512 -n 128 -r 3 -b "")
    grep base- $D/bench.jsonl >> $D/tables.txt
  fi
  while ! grep -q "synth done" $D/synth2.txt; do sleep 2; done; cat $D/synth2.txt
  G=$M/gpt-oss-20b-mxfp4.gguf; Q=$M/qwen3-8b-q4_k_m.gguf
  minfer_rows $G gpt-oss-20b cuda -p 512 -n 128 -r 3 -b ""
  minfer_rows $Q qwen3-8b-q4_k_m cuda -p 512 -n 128 -r 3 -b ""
  step llama; while ! grep -q "build rc" $D/llama-build.txt; do sleep 2; done; cat $D/llama-build.txt
  batched_rows $F qwen3-30b-a3b 16
  llama_rows $LB $F qwen3-30b-a3b -ngl 99 -fa 1 -p 512 -n 128 -r 3
  llama_rows $LB $G gpt-oss-20b -ngl 99 -fa 1 -p 512 -n 128 -r 3
  llama_rows $LB $E gemma3-1b -ngl 99 -fa 1 -p 512 -n 128 -r 3
  llama_rows $LB $Q qwen3-8b-q4_k_m -ngl 99 -fa 1 -p 512 -n 128 -r 3
  table qwen3-30b; table gpt-oss; table gemma3; table qwen3-8b
  step done; exit 0
elif [ "$PARTS" = dnorm ]; then  # the deferred RMSNorm (QMatMulAddNorm): its compiled tests, the chain study, then
  # SmolLM2 and Qwen2.5-0.5B tg128 with it and without it (bench/studies/fusion_ab.py drops the rule), interleaved,
  # and llama.cpp's (its CUDA build meanwhile, -j12) on the same files: ~9 minutes
  build_cuda 12 > $D/llama-build.txt 2>&1 &
  (synth smollm2-135m q4_1; synth qwen2.5-0.5b q4_0; echo "synth done $(since)") > $D/synth.txt 2>&1 &
  step gputests
  MINFER_TEST_DEVICE=cuda timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/triton/test_gemv_fused.py \
    tests/backends/test_cuda_backend.py -k "add_norm or rstd or deferred" > $D/gputests.txt 2>&1; tail -3 $D/gputests.txt
  step study
  timeout 300 python3 bench/studies/deferred_norm.py > $D/dnorm.txt 2>&1; cat $D/dnorm.txt >> $D/tables.txt
  while ! grep -q "synth done" $D/synth.txt; do sleep 2; done
  : > $D/bench.jsonl
  step models
  for round in 1 2; do for f in smollm2-135m-q4_1 qwen2.5-0.5b-q4_0; do
    minfer_rows $M/$f.gguf $f cuda -p 512 -n 128 -r 3 -b ""
    timeout 400 python3 bench/studies/fusion_ab.py matmul_add_norm bench -m $M/$f.gguf --device cuda -p 512 -n 128 \
      -r 3 -b "" --json 2>>$D/errors.txt | python3 -c "
import json, sys
for r in json.load(sys.stdin)['results']:
    print(json.dumps({'engine': 'minfer', 'file': 'no-dnorm-$f', 'test': r['test'], 'tok_s': r['tok_s']}))" \
      | tee -a $D/bench.jsonl
  done; done
  wait; cat $D/llama-build.txt
  for f in smollm2-135m-q4_1 qwen2.5-0.5b-q4_0; do
    llama_rows $LB $M/$f.gguf $f -ngl 99 -fa 1 -p 512 -n 128 -r 3
    grep "\"llama.cpp\", \"file\": \"$f\"" $D/bench.jsonl | sed "s/\"file\": \"$f\"/\"file\": \"no-dnorm-$f\"/" \
      >> $D/bench.jsonl  # (the same llama.cpp rows beside the runs without the deferred norm)
  done
  table smollm2; table qwen2.5; table no-dnorm
  step done; exit 0
elif [ "$PARTS" = cpudec ] || [ "$PARTS" = cpudec+cpu ]; then  # the host CPU's small-model decode: this tree
  # against $BASE's (the base tree carried under .anchor, `git archive REV minfer | tar x -C .anchor/base-cpu`) and
  # llama.cpp's CPU build, tg32 of SmolLM2-135M Q4_1 and Qwen2.5-0.5B Q4_0 at 4 / 8 / 16 threads, one round
  # interleaved (~4 minutes); cpudec+cpu: then the host CPU's table (the cpu part below, ~6 more minutes)
  BASE=${BASE:-.anchor/base-cpu}
  build_cpu 16 > $D/llama-build.txt 2>&1 &
  (synth smollm2-135m q4_1; synth qwen2.5-0.5b q4_0; [ "$PARTS" = cpudec ] || synth llama3-8b q4_k
   echo "synth done $(since)") > $D/synth.txt 2>&1 &
  wait; cat $D/synth.txt $D/llama-build.txt
  : > $D/bench.jsonl
  for th in 4 8 16; do
    for spec in smollm2-135m-q4_1 qwen2.5-0.5b-q4_0; do
      f=$M/$spec.gguf
      minfer_rows $f "cpu-$spec-t$th" cpu -t $th -p 0 -n 32 -r 3 -b ""
      (cd $BASE && PYTHONPATH=$PWD:/tmp/pylib minfer_rows $f "base-$spec-t$th" cpu -t $th -p 0 -n 32 -r 3 -b "")
      llama_rows $LC $f "cpu-$spec-t$th" -t $th -p 0 -n 32 -r 3
    done
  done
  table cpu-
  python3 - $D/bench.jsonl >> $D/tables.txt <<'PY'
import json, sys  # this tree and the base tree against llama.cpp, same run
rows = [json.loads(x) for x in open(sys.argv[1])]
get = {(r["engine"], r["file"]): r["tok_s"] for r in rows}
for (eng, f), v in get.items():
    if eng == "minfer" and f.startswith("cpu-"):
        b, l = get.get(("minfer", f.replace("cpu-", "base-", 1))) or 0, get.get(("llama.cpp", f)) or 0
        print(f"{f:30} tg32 this tree {v:7.1f}  base {b:7.1f}  llama.cpp {l:7.1f}  tree/base x{v / b if b else 0:.3f}"
              f"  tree/llama {v / l if l else 0:.2f}  base/llama {b / l if l else 0:.2f}")
PY
  [ "$PARTS" = cpudec ] && { step done; exit 0; }
  mv $D/bench.jsonl $D/bench-cpudec.jsonl; : > $D/bench.jsonl  # (the table below: its own rows)
elif [ "$PARTS" = cpudiag ]; then
  cpudiag; step done; exit 0
elif [ "$PARTS" = moelean ]; then  # the shortest budget: no llama.cpp build; qwen3moe B=16 on this tree and on $BASE
  (synth qwen3-30b-a3b q4_k_m; echo "synth done $(since)") > $D/synth.txt 2>&1 &
  # the base tree travels as files (the device's copy has no .git): here, before the call,
  #   rm -rf .old/base && mkdir -p .old/base && git archive REV minfer | tar x -C .old/base   (carry ".old")
  cp -r .old/base /tmp/base || exit 1
  [ "${SWEEP_ROWS:-1}" = 0 ] || { step moesweep
  timeout 200 python3 bench/moe_gemv_sweep.py --rows ${SWEEP_ROWS:-1} > $D/moe-gemv-sweep.txt 2>&1
  sed -n '/^--- moe_gemv/,$p' $D/moe-gemv-sweep.txt >> $D/tables.txt; cat $D/tables.txt; }
  [ "${MM16SWEEP:-0}" = 1 ] && { step mm16sweep  # MM16SWEEP=1: moe_mm16's prompt tiles, plain and GLU (~4 min)
  timeout 300 python3 bench/moe_mm16_sweep.py --glu --rows 512 --quick > $D/mm16-sweep.txt 2>&1
  cat $D/mm16-sweep.txt >> $D/tables.txt; }
  while ! grep -q "synth done" $D/synth.txt; do sleep 2; done; cat $D/synth.txt
  : > $D/bench.jsonl
  step minfer
  F=$M/qwen3-30b-a3b-q4_k_m.gguf
  minfer_rows $F qwen3-30b-a3b cuda -p 0 -n 0 -b 16 -r 2
  (cd /tmp/base && PYTHONPATH=/tmp/base:/tmp/pylib minfer_rows $F "base-qwen3-30b-a3b" cuda -p 0 -n 0 -b 16 -r 2)
  [ "${SWEEP_ROWS:-1}" = 0 ] || minfer_rows $F qwen3-30b-a3b cuda -p 0 -n 0 -b 16 -r 2
  step done; exit 0
elif [ "$PARTS" = moe ]; then  # minfer's runs while llama.cpp builds (-j12: 4 cores left to the runs), then llama.cpp's
  build_cuda 12 > $D/llama-build.txt 2>&1 &
  (synth qwen3-30b-a3b q4_k_m; synth gpt-oss-20b mxfp4; echo "synth done $(since)") > $D/synth.txt 2>&1 &
  [ "${STUDY:-1}" = 0 ] || {  # STUDY=0: the measurements alone (a short device budget)
  step gputests
  MINFER_TEST_DEVICE=cuda timeout 300 python3 -m pytest -q -s -p no:cacheprovider tests/kernels/triton/test_moe.py \
    tests/contracts/test_conformance.py tests/backends/test_families_gpu.py -k "(moe or mixtral or gpt) and not vulkan" \
    > $D/gputests.txt 2>&1; grep -E "on cuda:|passed|failed" $D/gputests.txt | tail -8
  if git rev-parse -q --verify "${BASE:-e393d3d}^{commit}" > /dev/null 2>&1; then  # the same test on the session's start
    git worktree add -f /tmp/base "${BASE:-e393d3d}" > /dev/null 2>&1
    (cd /tmp/base && MINFER_TEST_DEVICE=cuda PYTHONPATH=/tmp/base:/tmp/pylib timeout 200 python3 -m pytest -q -s \
       -p no:cacheprovider tests/backends/test_families_gpu.py -k "cuda-tiny-gpt-oss]" 2>&1 | grep -E "on cuda:|passed|failed" \
       | sed 's/^/base: /')
  fi
  }
  wait_synth() { while ! grep -q "synth done" $D/synth.txt; do sleep 2; done; }
  wait_synth; cat $D/synth.txt
  [ "${STUDY:-1}" = 0 ] || { step profile
  timeout 300 python3 bench/moe_profile.py $M/qwen3-30b-a3b-q4_k_m.gguf --rows 16 --top 10 2>&1 | grep -v USDT \
    > $D/profile.txt; cat $D/profile.txt; }
  : > $D/bench.jsonl
  step minfer
  F=$M/qwen3-30b-a3b-q4_k_m.gguf; G=$M/gpt-oss-20b-mxfp4.gguf
  minfer_rows $F qwen3-30b-a3b cuda -p 512 -n 128 -r 3 -b ""
  minfer_rows $F qwen3-30b-a3b cuda -p 0 -n 0 -b 16 -r 2
  minfer_rows $G gpt-oss-20b cuda -p 512 -n 128 -r 3 -b ""
  step llama; while ! grep -q "build rc" $D/llama-build.txt; do sleep 2; done; cat $D/llama-build.txt
  llama_rows $LB $F qwen3-30b-a3b -ngl 99 -fa 1 -p 512 -n 128 -r 3
  batched_rows $F qwen3-30b-a3b 16
  llama_rows $LB $G gpt-oss-20b -ngl 99 -fa 1 -p 512 -n 128 -r 3
  table qwen3-30b; table gpt-oss
  step done; exit 0
else
  (bash .anchor/device_build.sh cuda cpu > $D/llama-build.txt 2>&1; echo "llama.cpp builds done $(since)") &
  # the big files first, two at a time (disk: ~46 GB of the 64 GiB)
  (synth qwen3-30b-a3b q4_k_m; synth qwen3-8b q4_k_m; synth qwen2.5-7b q4_0; echo "synth A done $(since)") > $D/synth.txt 2>&1 &
  (synth gpt-oss-20b mxfp4; synth gemma3-1b q4_0; synth smollm2-135m q4_1; synth qwen2.5-0.5b q4_0; synth llama3-8b q4_k
   echo "synth B done $(since)") >> $D/synth.txt 2>&1 &
  step gputests
  MINFER_TEST_DEVICE=cuda timeout 330 python3 -m pytest -q -p no:cacheprovider -x tests/contracts/test_conformance.py \
    tests/backends/test_families_gpu.py -k "(moe or mixtral or gpt or swiglu_oai or norm_rope or geglu or softcap) and not vulkan" \
    > $D/gputests.txt 2>&1; tail -3 $D/gputests.txt
  wait; cat $D/synth.txt; tail -2 $D/llama-build.txt; ls -la $M; df -h /tmp | tail -1
  : > $D/bench.jsonl
fi

case $PARTS in cpu|small+cpu|cpudec+cpu) ;; *)
step moe
F=$M/qwen3-30b-a3b-q4_k_m.gguf
for round in 1 2; do
  minfer_rows $F qwen3-30b-a3b cuda -p 512 -n 128 -r 3 -b ""
  llama_rows $LB $F qwen3-30b-a3b -ngl 99 -fa 1 -p 512 -n 128 -r 3
done
minfer_rows $F qwen3-30b-a3b cuda -p 0 -n 0 -b 16 -r 2
batched_rows $F qwen3-30b-a3b 16
table qwen3-30b; rm -f $F

step gptoss
G=$M/gpt-oss-20b-mxfp4.gguf
for round in 1 2; do
  minfer_rows $G gpt-oss-20b cuda -p 512 -n 128 -r 3 -b ""
  llama_rows $LB $G gpt-oss-20b -ngl 99 -fa 1 -p 512 -n 128 -r 3
done
table gpt-oss; rm -f $G

step arch
for spec in gemma3-1b-q4_0 qwen3-8b-q4_k_m; do
  for round in 1 2; do
    minfer_rows $M/$spec.gguf $spec cuda -p 512 -n 128 -r 3 -b ""
    llama_rows $LB $M/$spec.gguf $spec -ngl 99 -fa 1 -p 512 -n 128 -r 3
  done
done
table gemma3; table qwen3-8b

step batch7b
S=$M/qwen2.5-7b-q4_0.gguf
minfer_rows $S qwen2.5-7b cuda -p 512 -n 128 -r 3 -b 1,2,4,8
llama_rows $LB $S qwen2.5-7b -ngl 99 -fa 1 -p 512 -n 128 -r 3
batched_rows $S qwen2.5-7b 1,2,4,8
table qwen2.5-7b
;; esac

step cpu
[ -f .old/q4_vnni.c ] && python3 bench/studies/cpu_gemm_versions.py .old/q4_vnni.c --threads 1,4,16 \
  --types Q4_0,Q4_1,Q4_K,Q6_K,Q8_0 > $D/gemm-versions.txt 2>&1  # (a C tile change on the host's cores)
for th in 4 8 16; do
  for spec in smollm2-135m-q4_1:512 qwen2.5-0.5b-q4_0:512 llama3-8b-q4_k:128; do
    f=$M/${spec%:*}.gguf; p=${spec#*:}
    MINFER_CPU_NATIVE=1 minfer_rows $f "cpu-${spec%:*}-t$th" cpu -t $th -p $p -n 32 -r 2 -b ""
    [ "$PARTS" = cpu ] && [ "${spec%:*}" != llama3-8b-q4_k ] && MINFER_CPU_NATIVE=0 \
      minfer_rows $f "cpu-pernode-${spec%:*}-t$th" cpu -t $th -p 0 -n 32 -r 2 -b ""  # the decode step node by node
    grep -q -w amx_int8 /proc/cpuinfo && MINFER_CPU_ISA=amx \
      minfer_rows $f "amx-${spec%:*}-t$th" cpu -t $th -p $p -n 0 -r 2 -b ""  # the prompt on the AMX tile unit (opt-in)
    llama_rows $LC $f "cpu-${spec%:*}-t$th" -t $th -p $p -n 32 -r 2
    [ "$PARTS" = cpu ] && llama_rows $LC $f "norepack-${spec%:*}-t$th" -t $th -p $p -n 0 -r 2 --repack 0  # no AMX / repack
  done
done
table cpu-
python3 - $D/bench.jsonl >> $D/tables.txt <<'PY'
import json, sys  # the amx build's prompts against the default build's (avx512) and llama.cpp's, same run
rows = [json.loads(x) for x in open(sys.argv[1])]
get = {(r["engine"], r["file"], r["test"]): r["tok_s"] for r in rows}
for r in rows:
    if r["engine"] == "minfer" and r["file"].startswith("amx-") and r["test"].startswith("pp"):
        base = r["file"].replace("amx-", "cpu-", 1)
        a, l = get.get(("minfer", base, r["test"])), get.get(("llama.cpp", base, r["test"]))
        nr = get.get(("llama.cpp", r["file"].replace("amx-", "norepack-", 1), r["test"]))
        print(f"{r['file']:28} {r['test']} amx {r['tok_s']:8.1f}  avx512 {a or 0:8.1f}  llama.cpp {l or 0:8.1f} "
              f"(--repack 0: {nr or 0:8.1f})  amx/avx512 {r['tok_s'] / a if a else 0:.2f}  "
              f"amx/llama.cpp {r['tok_s'] / l if l else 0:.2f}")
PY
python3 - $D/bench.jsonl >> $D/tables.txt <<'PY'
import json, sys  # decode as one C call against node by node (MINFER_CPU_NATIVE=0), same run
rows = [json.loads(x) for x in open(sys.argv[1])]
per = {r["file"].replace("cpu-pernode-", "cpu-"): r["tok_s"] for r in rows if r["file"].startswith("cpu-pernode-")}
for r in rows:
    if r["engine"] == "minfer" and r["test"] == "tg32" and r["file"] in per:
        print(f"{r['file']:28} tg32 one call {r['tok_s']:8.1f}  node by node {per[r['file']]:8.1f}  "
              f"x{r['tok_s'] / per[r['file']]:.2f}")
PY
[ "${MOESWEEP:-0}" = 1 ] && { step moesweep  # the expert GEMV's tiles on the GPU, after the host's timings (issue 25)
  timeout 480 python3 bench/moe_gemv_sweep.py > $D/moe-gemv-sweep.txt 2>&1
  sed -n '/^--- moe_gemv/,$p' $D/moe-gemv-sweep.txt >> $D/tables.txt; }
step done
