# Sourced (from the repo root on the GPU machine) by the server benches (gpu_serve.sh, gpu_structured.sh,
# gpu_prefix_cache.sh): the server's deps from the carried .whl/ into /tmp/pylib, the OUT and M folders, and
# F, the 7B Q4_0 synthetic model (made once per machine).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; M=${M:-/tmp/models}; mkdir -p "$OUT" "$M"
python3 -m pip install -q --no-index --no-deps --target /tmp/pylib .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=.:/tmp/pylib
F=$M/qwen2.5-7b-q4_0.gguf
[ -f "$F" ] || python3 -m minfer.cli synth qwen2.5-7b q4_0 "$F" > /dev/null
