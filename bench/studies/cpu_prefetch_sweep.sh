#!/usr/bin/env bash
# The GEMM tiles' prefetch distance (q4_vnni.c W_AHEAD) on the GPU machine's host CPU: a decode step's time at
# 4 / 8 / 16 threads through bench/studies/cpu_step_profile.py --ahead N, the distances interleaved twice
# (Qwen2.5-0.5B Q4_0), once for SmolLM2-135M Q4_1. One device call, no carry: bash bench/studies/cpu_prefetch_sweep.sh
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
export PYTHONPATH=$PWD; M=/tmp/models; mkdir -p $M
for s in "smollm2-135m q4_1" "qwen2.5-0.5b q4_0"; do set -- $s; [ -f $M/$1-$2.gguf ] || python3 -m minfer.cli synth $1 $2 $M/$1-$2.gguf >/dev/null; done
for a in 0 1024 2048 4096 0 1024 2048; do
  timeout 100 python3 bench/studies/cpu_step_profile.py $M/qwen2.5-0.5b-q4_0.gguf --threads 4,8,16 --tokens 64 --ahead $a 2>&1 | grep -E "^##|^W_AHEAD"
done | tee $OUT/pf-qwen.txt
for a in 0 1024 2048; do
  timeout 100 python3 bench/studies/cpu_step_profile.py $M/smollm2-135m-q4_1.gguf --threads 4,8,16 --tokens 64 --ahead $a 2>&1 | grep -E "^##|^W_AHEAD"
done | tee $OUT/pf-smol.txt
