#!/usr/bin/env bash
# The real SmolLM2-135M-Instruct (Q4_1, 98 MB) on the GPU machine, which no single call can carry
# (64 MiB): split it here (`split -n 2 -d FILE /tmp/smol.part`, parts in the ignored .m1/ and .m2/),
# carry .m1 in one call that copies it to /tmp/smol/ (`mkdir -p /tmp/smol && cp .m1/* /tmp/smol/`),
# then at once (the machine stays warm ~30 s) carry .m2 in this one. It reassembles and checks the
# file, then: the GPU tests, cuda-vs-cpu parity on the fixture prompts, perplexity of the fixture
# text with the f16 and the Q8_0 KV cache (the cpu's: 18.3629 at --chunk 512), the prompt-chunk
# attention benchmark and `minfer bench` on a 7B synthetic model.
set -uo pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
M=/tmp/models; mkdir -p $M
F=/tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
cat /tmp/smol/smol.part00 .m2/smol.part01 > "$F" && sha256sum "$F" | cut -c1-16   # b179c9523d0e6a0f
[ -f $M/qwen2.5-7b-q4_0.gguf ] || python3 -m minfer.cli synth qwen2.5-7b q4_0 $M/qwen2.5-7b-q4_0.gguf > /dev/null &
SYN=$!
echo "== GPU tests"
MINFER_TEST_DEVICE=cuda timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/triton/test_compile_sm90.py \
  tests/backends/test_cuda_backend.py tests/contracts/test_conformance.py -k "not conformance or attention or gemv" \
  2>&1 | tail -4
echo "== parity (SmolLM2, the fixture prompts)"
timeout 120 python3 bench/cuda_parity.py "$F" 2>&1 | tail -2
echo "== perplexity, tests/fixtures/text/gpl-3.txt, --chunk 512"
for kv in f16 q8_0; do
  timeout 120 python3 -m minfer.cli perplexity -m "$F" --device cuda --kv-cache $kv --chunk 512 -c 512 \
    tests/fixtures/text/gpl-3.txt 2>&1 | tail -1 | sed "s/^/$kv: /"
done
echo "== prompt-chunk attention"; timeout 120 python3 bench/studies/attention_prefill.py 2>&1 | tail -7
wait $SYN
echo "== bench 7B"
timeout 150 python3 -m minfer.cli bench -m $M/qwen2.5-7b-q4_0.gguf --device cuda -p 512 -n 128 -r 2 2>&1 | tail -3
