#!/usr/bin/env bash
# The lookup quant types (IQ4_NL, IQ4_XS, MXFP4; issue 25 item 3) on the H200. One device call per PART (each fits
# the 10-minute command limit; the machine keeps /tmp between calls while it stays warm):
#
#   PART=build   carry [".anchor", ".whl"]   llama.cpp's CUDA llama-bench (/work/shared/anchor: `bash prepare.sh` here
#                                            fills .anchor) in the background, the synthetic Qwen2.5-7B files (Q4_0,
#                                            IQ4_XS, MXFP4), and this change's GPU tests with the compiled kernels: the
#                                            GEMV (its byte-permute table lookup is inline PTX the interpreter never
#                                            runs: THE check of it), MMQ, dequant, embedding, fused GEMVs, their
#                                            conformance (with --full: the two-pass int8 activations above 2^24 weights)
#                                            and the tiny models on cuda against cpu
#   PART=bench   (no carry; after build)     bench/kernels.py: each lookup type's GEMV at the 7B/8B decode shapes
#                                            beside Q4_0's (µs, GB/s, % of copy bandwidth) and their MMQ; then tg128
#                                            (and pp512) of minfer and llama-bench on qwen2.5-7b Q4_0 / IQ4_XS / MXFP4,
#                                            interleaved (minfer, llama.cpp, minfer, llama.cpp)
# Tables print last; logs in $OUT.
set -uo pipefail
PART=${PART:-build}
export PYTHONPATH=.:/tmp/pylib:${PYTHONPATH:-} PYTHONUNBUFFERED=1
M=${M:-/tmp/models}; OUT=${OUT:-/tmp/out}; mkdir -p "$M" "$OUT" /tmp/pylib
T0=$(date +%s); since() { echo "[$(( $(date +%s) - T0 )) s]"; }
synth() { [ -f "$M/$1-$2.gguf" ] || python3 -m minfer.cli synth "$1" "$2" "$M/$1-$2.gguf" > /dev/null; }
wheels() { for w in .whl/*.whl; do [ -f "$w" ] && python3 -m zipfile -e "$w" /tmp/pylib; done; }
FILES=${FILES:-qwen2.5-7b:q4_0 qwen2.5-7b:iq4_xs qwen2.5-7b:mxfp4}
LB=/tmp/llama.cpp/build-cuda/bin/llama-bench

case $PART in
build)
  wheels
  [ -d .anchor ] && (bash .anchor/device_build.sh cuda > "$OUT/llama-build.txt" 2>&1; tail -1 "$OUT/llama-build.txt") &
  for spec in $FILES; do synth ${spec/:/ } & done
  echo "== GPU tests of the lookup types (compiled kernels) $(since)"
  MINFER_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kernels/triton/test_lut4.py \
    tests/kernels/triton/test_mmq.py tests/kernels/triton/test_dequant.py tests/kernels/triton/test_embed.py \
    tests/kernels/triton/test_gemv_fused.py tests/kernels/triton/test_qmatmul.py 2>&1 | grep -v XDG | tail -4
  MINFER_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider tests/backends/test_cuda_backend.py \
    -k "iq4 or mxfp4" 2>&1 | grep -v XDG | tail -3
  echo "== conformance, compiled, with the large class (int8 activations) $(since)"
  timeout 150 python3 -m minfer.contracts.conformance --device cuda --full --failures --kernel lut4_gemv \
    --kernel mmq_lut4 --kernel gemv_swiglu --kernel gemv_rope --kernel dequant --kernel embed_rows 2>&1 | tail -4
  wait
  ls -la $LB "$M" 2>&1 | tail -5 ;;
bench)
  for spec in $FILES; do synth ${spec/:/ }; done
  echo "== bench/kernels.py: lookup GEMVs and MMQ beside Q4_0's $(since)"
  timeout 150 python3 bench/kernels.py --only 'lut4|q4_0_gemv\[ref|mmq_q4_0' > "$OUT/lut4-kernels.txt" 2>&1
  echo "rc=$?"
  [ -x $LB ] || echo "!! no $LB: run PART=build first (same warm machine); minfer rows only"
  : > "$OUT/lut4-bench.jsonl"
  for spec in $FILES; do
    f="$M/${spec/:/-}.gguf"
    for round in 1 2; do
      echo "== $spec round $round $(since)"
      timeout 120 python3 -m minfer.cli bench -m "$f" --device cuda -p 512 -n 128 -r 3 --json 2>/dev/null \
        | python3 -c "import json,sys; d=json.load(sys.stdin); [print(json.dumps({'engine':'minfer','file':'$spec','test':r['test'],'tok_s':r['tok_s']})) for r in d['results']]" \
        | tee -a "$OUT/lut4-bench.jsonl"
      [ -x $LB ] && timeout 100 $LB -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o json 2>/dev/null \
        | python3 -c "import json,sys; [print(json.dumps({'engine':'llama.cpp','file':'$spec','test':('pp%d' % r['n_prompt']) if r['n_prompt'] else ('tg%d' % r['n_gen']),'tok_s':r['avg_ts']})) for r in json.load(sys.stdin)]" \
        | tee -a "$OUT/lut4-bench.jsonl"
    done
  done
  echo "== tables $(since)"
  python3 - "$OUT/lut4-kernels.txt" <<'PY'
import re, sys
rows, bw = {}, ""
for line in open(sys.argv[1]):
    if line.startswith("#") and "copy bandwidth" in line:
        bw = line.strip()
    m = re.match(r"(\S+)\s+(\d+x\d+(?:x\d+)? \S+(?: \S+)?)\s+\S+\s+(\S+)\s+(\S+)\s+(\S+)%", line)
    if m:
        rows.setdefault(m.group(2), {})[m.group(1)] = (float(m.group(3)), float(m.group(5)))
print(bw)
cols = ["q4_0_gemv[ref]", "lut4_gemv[IQ4_NL]", "lut4_gemv[IQ4_XS]", "lut4_gemv[MXFP4]", "mmq_q4_0",
        "mmq_lut4[IQ4_NL]", "mmq_lut4[IQ4_XS]", "mmq_lut4[MXFP4]"]
print(f"{'shape':34}" + "".join(f"{c.replace('lut4_gemv', 'gemv').replace('_gemv[ref]', ''):>18}" for c in cols))
for shape, ks in rows.items():
    cells = [f"{ks[c][0]:8.1f} /{ks[c][1]:4.0f}%" if c in ks else "" for c in cols]
    print(f"{shape:34}" + "".join(f"{c:>18}" for c in cells))
print("(µs of device time / % of copy bandwidth: the file's bytes of W + x + out over the time)")
PY
  python3 - "$OUT/lut4-bench.jsonl" <<'PY'
import json, sys, collections, statistics
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows[(r["file"], r["test"], r["engine"])].append(r["tok_s"])
print(f"{'file':22} {'test':6} {'minfer':>10} {'llama.cpp':>10} {'ratio':>7}")
for (f, t) in sorted({(f, t) for f, t, _ in rows}):
    m, l = rows.get((f, t, "minfer")), rows.get((f, t, "llama.cpp"))
    mm = statistics.median(m) if m else float("nan")
    ll = statistics.median(l) if l else float("nan")
    print(f"{f:22} {t:6} {mm:10.1f} {ll:10.1f} {mm / ll:7.2f}")
PY
  ;;
*) echo "PART must be build or bench"; exit 2 ;;
esac
