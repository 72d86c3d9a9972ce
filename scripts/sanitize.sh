#!/usr/bin/env bash
# minfer's C code under AddressSanitizer + UBSan: kernels/cpu/q4_vnni.c (the VNNI matmuls, packers,
# decode attention, RMSNorm, SwiGLU, the decode program) and kernels/wgpu/replay.c (the replay encoder), built with
# -fsanitize=address,undefined -fno-sanitize-recover=all (MINFER_SANITIZE=1, kernels/cbuild.py) into a
# cache of their own, then the tests that drive them over random and boundary shapes
# (tests/native/test_c_kernels.py, tests/engine/test_cpu_vnni.py, the decode program's synthetic models in
# tests/backends/test_cpu_native.py; other pytest paths if given). A library built with ASan loads into python only after libasan, so it is
# preloaded; leak checking is off (the interpreter keeps memory to its exit on purpose). Any report
# aborts the run: exit non-zero. tests/native/test_sanitizers.py runs this in the suite (CI).
#   usage: scripts/sanitize.sh [pytest paths and args]      (~40 s of CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
CC_=${CC:-cc}
ASAN=$("$CC_" -print-file-name=libasan.so)
if [ ! -e "$ASAN" ]; then
  echo "sanitize.sh: $CC_ has no libasan.so (Debian: apt-get install libasan8)" >&2
  exit 2
fi
LOGS=$(mktemp -d)
if [ -n "${MINFER_SANITIZE_CACHE:-}" ]; then CACHE=$MINFER_SANITIZE_CACHE; trap 'rm -rf "$LOGS"' EXIT
else CACHE=$(mktemp -d); trap 'rm -rf "$LOGS" "$CACHE"' EXIT; fi
export MINFER_SANITIZE=1 MINFER_CACHE="$CACHE"
# reports to files (pytest captures the test's stderr, and an abort would lose it), printed below
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1:detect_odr_violation=0:log_path=$LOGS/asan
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:log_path=$LOGS/ubsan
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ $# -eq 0 ]; then  # (and the decode program, prog_run, on the synthetic models)
  set -- tests/native/test_c_kernels.py tests/engine/test_cpu_vnni.py \
    tests/backends/test_cpu_native.py::test_program_equals_the_per_node_path_on_synthetic_models
fi
rc=0
LD_PRELOAD="$ASAN" "$PY" -m pytest -p no:cacheprovider "$@" || rc=$?
if compgen -G "$LOGS/*" >/dev/null; then cat "$LOGS"/* >&2; [ $rc -ne 0 ] || rc=1; fi
exit $rc
