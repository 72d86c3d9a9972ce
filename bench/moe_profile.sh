#!/usr/bin/env bash
# Issue 25 / 27 on the H200: where the time goes, kernel by kernel (bench/moe_profile.py's torch-profiler tables) for
# qwen3-30b-a3b Q4_K_M, gpt-oss-20b MXFP4 and the 7B's small batches, plus bench/kernels.py --only moe. No llama.cpp
# (the ratios are bench/NOTES.md stop 40's). Runs in the background under setsid so it outlives a call:
#   bash bench/moe_profile.sh start; bash bench/moe_profile.sh wait 560     carry [".whl"]
set -uo pipefail
D=/tmp/prof; M=/tmp/models
export PYTHONPATH=$PWD:/tmp/pylib PYTHONUNBUFFERED=1
case ${1:-} in
start) mkdir -p $D $M /tmp/pylib; setsid nohup bash "$0" run > $D/driver.txt 2>&1 < /dev/null & echo started; exit 0 ;;
wait) for _ in $(seq "${2:-560}"); do grep -q "^== done" $D/driver.txt 2>/dev/null && break; sleep 1; done
      cat $D/driver.txt; cp $D/*.txt "${OUT:-/tmp/out}/" 2>/dev/null; exit 0 ;;
run) ;;
*) exit 2 ;;
esac
T0=$(date +%s); step() { echo "== $1 [$(( $(date +%s) - T0 )) s]"; }
synth() { [ -f "$M/$1-$2.gguf" ] || python3 -m minfer.cli synth "$1" "$2" "$M/$1-$2.gguf.part" > /dev/null \
          && mv "$M/$1-$2.gguf.part" "$M/$1-$2.gguf"; }
step setup
for w in .whl/*.whl; do python3 -m zipfile -e "$w" /tmp/pylib; done
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
(synth qwen3-30b-a3b q4_k_m; echo "synth 30b $(( $(date +%s) - T0 )) s"; synth gpt-oss-20b mxfp4; synth qwen2.5-7b q4_0
 echo "synth done $(( $(date +%s) - T0 )) s") > $D/synth.txt 2>&1 &
step kernels
timeout 240 python3 bench/kernels.py --only moe 2>&1 | tail -30
wait; cat $D/synth.txt
step qwen3moe
timeout 300 python3 bench/moe_profile.py $M/qwen3-30b-a3b-q4_k_m.gguf --rows 16 2>&1 | grep -v USDT | tail -100
step gptoss
timeout 240 python3 bench/moe_profile.py $M/gpt-oss-20b-mxfp4.gguf --rows 16 --top 15 2>&1 | grep -v USDT | tail -60
step 7b
timeout 200 python3 bench/moe_profile.py $M/qwen2.5-7b-q4_0.gguf --rows 2 --top 15 2>&1 | grep -v USDT | tail -60
step done
