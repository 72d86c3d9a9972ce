#!/usr/bin/env bash
# The amx build's prompt product against the avx512 build and against an older amx form, on the GPU machine's host
# CPU (issue 26: the prompt cells at 8 / 16 threads, where llama.cpp's own AMX kernels run). One device call (~5 min):
#
#   git show REV:minfer/kernels/cpu/q4_vnni.c > .old/q4_vnni.c        # here: the form to compare against
#   carry [".anchor", ".old", ".whl"]; command `bash bench/studies/host_amx_check.sh`
#
# 1. bench/studies/cpu_gemm_versions.py .old/q4_vnni.c --isa amx: the same bits, then old / new amx timed at 1, 4 and
#    16 threads (nothing else running); 2. llama.cpp's CPU llama-bench built (.anchor's sources, GGML_NATIVE) while
#    the synthetic files are made; 3. SmolLM2-135M Q4_1 and Qwen2.5-0.5B Q4_0 pp512 at 4 / 8 / 16 threads:
#    minfer avx512, minfer amx, llama.cpp, one after the other, twice; the ratios last.
set -uo pipefail
OUT=${OUT:-/tmp/out}; M=/tmp/models; mkdir -p "$OUT" $M /tmp/pylib
export PYTHONPATH=$PWD:/tmp/pylib PYTHONUNBUFFERED=1
for w in .whl/gguf*.whl; do python3 -m zipfile -e "$w" /tmp/pylib; done
grep -m1 "model name" /proc/cpuinfo; nproc
[ -f .old/q4_vnni.c ] && timeout 240 python3 bench/studies/cpu_gemm_versions.py .old/q4_vnni.c --isa amx \
  --types Q4_0,Q4_1,Q4_K,Q8_0 --threads 1,4,16 2>&1 | grep -v " 1x\| 4x" | tee "$OUT/gemm-versions.txt"
(tar xzf .anchor/llama-src.tgz -C /tmp && cd /tmp/llama.cpp && cmake -S . -B build-cpu -DLLAMA_CURL=OFF \
   -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
   -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON > /dev/null && cmake --build build-cpu --target llama-bench -j16 \
   > /dev/null; echo "llama.cpp cpu build rc=$?") > "$OUT/build.txt" 2>&1 &
python3 -m minfer.cli synth smollm2-135m q4_1 $M/s.gguf > /dev/null; python3 -m minfer.cli synth qwen2.5-0.5b q4_0 $M/q.gguf > /dev/null
wait; cat "$OUT/build.txt"
: > "$OUT/rows.txt"
for rep in 1 2; do for th in 4 8 16; do for f in s q; do
  for isa in avx512 amx; do
    MINFER_CPU_ISA=$isa timeout 200 python3 -m minfer.cli bench -m $M/$f.gguf --device cpu -t $th -p 512 -n 0 -r 2 -b "" \
      --json 2>/dev/null | python3 -c "import json,sys; [print('$f t$th $isa', r['tok_s']) for r in json.load(sys.stdin)['results']]" \
      >> "$OUT/rows.txt"
  done
  timeout 200 /tmp/llama.cpp/build-cpu/bin/llama-bench -m $M/$f.gguf -t $th -p 512 -n 0 -r 2 -o json 2>/dev/null \
    | python3 -c "import json,sys; [print('$f t$th llama.cpp', r['avg_ts']) for r in json.load(sys.stdin)]" >> "$OUT/rows.txt"
done; done; done
python3 - "$OUT/rows.txt" <<'PY'
import collections, statistics, sys
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f, th, eng, x = line.split()
    v[(f, th, eng)].append(float(x))
print(f"{'file':5} {'thr':4} {'avx512':>9} {'amx':>9} {'llama.cpp':>9} {'amx/avx512':>10} {'best/llama':>10}  runs")
for f, th in sorted({(f, th) for f, th, _ in v}, key=lambda k: (k[0], int(k[1][1:]))):
    a, m, l = (statistics.median(v[(f, th, e)]) if v[(f, th, e)] else 0.0 for e in ("avx512", "amx", "llama.cpp"))
    print(f"{f:5} {th:4} {a:9.1f} {m:9.1f} {l:9.1f} {m / a if a else 0:10.2f} {max(a, m) / l if l else 0:10.2f}  "
          + " | ".join("/".join(f"{x:.0f}" for x in v[(f, th, e)]) for e in ("avx512", "amx", "llama.cpp")))
PY
