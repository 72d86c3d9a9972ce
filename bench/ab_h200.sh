#!/usr/bin/env bash
# Same numbers before and after a change, in ONE device run: `minfer bench` of an old tree (a copy of an older
# commit's minfer/ at .ab/old, carried) and of this tree, interleaved (old, new, new, old) on the same
# synthetic files. Prepare here:  mkdir -p .ab/old && git archive <commit> minfer pyproject.toml | tar -x -C .ab/old
# One device run per PART (each fits the 10-minute command limit):
#   PART=single  carry [".ab"]                 tg128 (and pp512 on the 7B / 8B) of the four issue-9 shapes,
#                                              plus the cuda backend's GPU tests of this tree
#   PART=batch   carry [".ab", ".gl", ".whl"]  batched decode B=16/64 of the 7B, vulkan 7B tg128
# Prints one table last: test, old, new, new/old.
set -uo pipefail
PART=${PART:-single}
NEW=${NEW:-.}   # the new tree (default: this one)
export PYTHONUNBUFFERED=1
M=${M:-/tmp/models}; OUT=${OUT:-/tmp/out}; mkdir -p "$M" "$OUT"
T0=$(date +%s); since() { echo "[$(( $(date +%s) - T0 )) s]"; }
synth() { [ -f "$M/$1-$2.gguf" ] || PYTHONPATH=$NEW python3 -m minfer.cli synth "$1" "$2" "$M/$1-$2.gguf" > /dev/null; }
LOG="$OUT/ab-$PART.txt"; : > "$LOG"
# bench TREE LABEL ARGS...: one `minfer bench` with the tree's minfer first on the path; rows tagged with the label
bench() {
  local tree=$1 label=$2; shift 2
  PYTHONPATH=$tree:/tmp/pylib timeout 150 python3 -m minfer.cli bench "$@" 2>&1 | grep -v XDG \
    | grep -E "^[^ ].* (tg|pp|b)[0-9]+ " | sed "s/^/$label /" | tee -a "$LOG"
}
ab() { bench .ab/old old "$@"; bench "$NEW" new "$@"; bench "$NEW" new "$@"; bench .ab/old old "$@"; }

if [ "$PART" = single ]; then
  for spec in smollm2-135m:q4_1 qwen2.5-0.5b:q4_0 qwen2.5-7b:q4_0 llama3-8b:q4_k; do synth ${spec/:/ } & done
  echo "== cuda GPU tests of this tree $(since)"
  (cd "$NEW" && MINFER_TEST_DEVICE=cuda PYTHONPATH=. timeout 240 python3 -m pytest -q -p no:cacheprovider -x \
    tests/backends/test_cuda_backend.py tests/kernels/triton/test_gemv_fused.py 2>&1 | tail -15)
  wait
  echo "== A/B $(since)"
  for f in smollm2-135m-q4_1 qwen2.5-0.5b-q4_0; do ab -m "$M/$f.gguf" --device cuda -p 0 -n 128 -r 3; done
  for f in qwen2.5-7b-q4_0 llama3-8b-q4_k; do ab -m "$M/$f.gguf" --device cuda -p 512 -n 128 -r 3; done
else
  synth qwen2.5-7b q4_0
  echo "== A/B batched $(since)"
  ab -m "$M/qwen2.5-7b-q4_0.gguf" --device cuda -p 0 -n 0 -b 16,64 -r 2
  echo "== A/B vulkan $(since)"
  . bench/vulkan_env.sh > /dev/null 2>&1
  ab -m "$M/qwen2.5-7b-q4_0.gguf" --device vulkan -p 0 -n 128 -r 3
fi
echo "== table $(since)"
python3 - "$LOG" <<'PY'
import re, sys, collections
runs = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    f = line.split()
    m = re.search(r" (cuda|vulkan) +((?:tg|pp|b)\d+e?2?e?) +([\d.]+)", line)
    if m:
        runs[(line[4:38].strip()[:28], m.group(1), m.group(2))][f[0]].append(float(m.group(3)))
print(f"{'model':28} {'dev':6} {'test':6} {'old':>10} {'new':>10} {'new/old':>8}")
for (model, dev, test), r in runs.items():
    o, n = sum(r["old"]) / max(len(r["old"]), 1), sum(r["new"]) / max(len(r["new"]), 1)
    print(f"{model:28} {dev:6} {test:6} {o:10.1f} {n:10.1f} {n / o if o else float('nan'):8.3f}")
PY
