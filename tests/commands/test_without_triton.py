"""A machine without Triton (`pip install 'minfer[vulkan]'` only): the vulkan and cpu backends run,
sampling included; `--device cuda` says in one line what to install; `minfer kernels` lists the
CUDA kernels as unbound, not as broken.

CI has Triton installed, so each run here is a subprocess whose `import triton` is made impossible
(a meta-path finder that raises ModuleNotFoundError, as a missing package does) and whose
environment has no TRITON_INTERPRET.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

NO_TRITON = """
import sys
class NoTriton:
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoTriton())
"""
PROMPT = "The capital of France is"


def _minfer(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = NO_TRITON + "from minfer.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_prelude_makes_triton_unimportable():
    done = subprocess.run([sys.executable, "-c", NO_TRITON + "import triton"], capture_output=True, text=True)
    assert done.returncode == 1 and "ModuleNotFoundError: No module named 'triton'" in done.stderr


@pytest.fixture(scope="module")
def vulkan_run():
    """The README's vulkan example with its default sampling (temperature 0.8, top-k 40), seeded."""
    return _minfer("run", "--device", "vulkan", "-n", "6", "--ignore-eos", "--seed", "3", PROMPT)


def test_vulkan_samples_a_continuation_without_triton(vulkan_run):
    done = vulkan_run
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert re.search(r"decode: 5 tokens .* \| generated: 6 \| stop: length", done.stderr), done.stderr[-2000:]
    assert len(done.stdout.strip()) > 0


def test_cpu_and_vulkan_sample_the_same_text_for_one_seed(vulkan_run):
    """The vulkan backend draws its sampled rows with the host sampler's chain and the same
    counter-based draws, so where their logits agree (this prompt, this seed) the text is the same."""
    cpu = _minfer("run", "--device", "cpu", "-n", "6", "--ignore-eos", "--seed", "3", PROMPT)
    assert cpu.returncode == 0, cpu.stderr[-3000:]
    assert vulkan_run.returncode == 0, vulkan_run.stderr[-3000:]
    assert vulkan_run.stdout == cpu.stdout


def test_cuda_without_triton_is_one_line_saying_what_to_install():
    done = _minfer("run", "--device", "cuda", "-n", "2", PROMPT)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "triton is not installed" in lines[0] and "pip install 'minfer[gpu]'" in lines[0]


def test_the_kernel_listing_shows_the_cuda_kernels_unbound_not_broken():
    done = _minfer("kernels", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert " unbound " in rows["attention_rows"] and " unbound " in rows["rope"]
    assert re.search(r" ok +minfer\.kernels\.", rows["vk_argmax"])  # vulkan and cpu kernels bind
    assert re.search(r" ok +minfer\.kernels\.", rows["cpu_linear_f32"])
    assert re.search(r" ok +minfer\.kernels\.", rows["sample_rows"])  # torch only: binds without Triton
    assert "needs triton, which is not installed (pip install 'minfer[gpu]')" in done.stdout
    assert re.search(r"\d+ sections, \d+ bound, 0 with errors, \d+ unbound", done.stdout)
