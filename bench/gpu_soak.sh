#!/usr/bin/env bash
# The soak on the GPU machine (bench/soak.py): 64 concurrent streaming clients for 10 minutes with
# random lengths, stops, cancellations, slow readers and malformed requests, against `minfer serve`
# on cuda with a Qwen2.5-0.5B-shaped Q4_0 synthetic model (MODEL=7b: the 7B shape). The server's
# deps come from .whl/ (carried, as bench/gpu_serve.sh). Run from the repo root; ~11 minutes:
# the 10-minute soak fits one device call only with MIN<=9 (default 9); the table is printed last.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; M=${M:-/tmp/models}; mkdir -p "$OUT" "$M"
python3 -m pip install -q --no-index --no-deps --target /tmp/pylib .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=.:/tmp/pylib
case "${MODEL:-0.5b}" in
  7b) F=$M/qwen2.5-7b-q4_0.gguf; P=qwen2.5-7b ;;
  *) F=$M/qwen2.5-0.5b-q4_0.gguf; P=qwen2.5-0.5b ;;
esac
[ -f "$F" ] || python3 -m minfer.cli synth "$P" q4_0 "$F" > /dev/null
timeout $(( ${MIN:-9} * 60 + 120 )) python3 bench/soak.py -m "$F" --device cuda --clients ${CLIENTS:-64} \
  --minutes ${MIN:-9} --ctx ${CTX:-1024} --json "$OUT/soak.json" --server-log "$OUT/server.log" 2>&1 | tee "$OUT/soak.log" | tail -16
