#!/usr/bin/env bash
# Speculative decoding on the H200 (issue 27 item 4): the real SmolLM2-135M-Instruct with prompt-lookup drafts,
# cuda and the host cpu, bench/spec_prompts.json's copy and free sets, drafts off vs on, alternating.
# The model cannot travel in one call (98 MB > 64 MiB): as bench/gpu_smollm2.sh says, split it here into .m1/.m2,
# carry .m1 in one call (`mkdir -p /tmp/smol && cp .m1/* /tmp/smol/`), then at once carry .m2 in this one.
set -uo pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
F=/tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$F" ] || cat /tmp/smol/smol.part00 .m2/smol.part01 > "$F"
sha256sum "$F" | cut -c1-16   # b179c9523d0e6a0f
echo "== draft rows on the GPU (compiled): rows of one slot vs one by one"
MINFER_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider tests/backends/test_cuda_backend.py \
  -k draft_rows 2>&1 | tail -2
for dev in cuda cpu; do
  echo "== $dev"
  timeout 240 python3 bench/spec_decode.py --model "$F" --device $dev --max-tokens 128 --reps 3 2>&1 | tail -3
done
