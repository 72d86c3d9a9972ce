"""The whole-load fuzzer (scripts/fuzz_load.py): 2,000 hostile files taken through the reader,
tokenizer, graph, cpu backend, chat template and two decode steps, in one capped subprocess; the
2026 GGUF CVE classes as fixed cases; and 150 on the vulkan backend (lavapipe), where a load-time
rejection must come before any dispatch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fuzz_load.py"


N_FIXED = 12  # the review's 3 + the CVE classes' 6 (fuzz_load.CVE_CASES) + the experts' 3 (MOE_CASES)


def _run(*args: str):
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=900)
    out = proc.stdout.strip().splitlines()
    line = out[-1] if out else ""
    assert line.startswith("fuzz_load:"), (proc.stdout[-2000:], proc.stderr[-3000:])
    print(line)
    return proc, out, line, {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", line)}


def test_cve_classes_are_fixed_cases():
    proc, out, line, got = _run("--cases", "0")
    fixed = [x for x in out if x.startswith("fixed ")]
    assert got["fixed_failed"] == 0 and len(fixed) == N_FIXED, "\n".join(fixed)
    cves = [x for x in fixed if "CVE-2026-" in x]
    assert sum("CVE-2026-27940" in x for x in cves) == 3 and sum("CVE-2026-7482" in x for x in cves) == 2
    assert all("rejected: GGUFError" in x for x in cves), cves


def test_fuzz_the_whole_load_path_on_vulkan():
    """150 mutants and the fixed cases on the vulkan backend: typed outcomes, and no load-time
    rejection after a dispatch (the counter is live: the cases that load dispatch)."""
    proc, out, line, got = _run("--cases", "150", "--seed", "1", "--device", "vulkan")
    assert got["cases"] == 150 + N_FIXED and got["untyped"] == 0 and got["over_2s"] == 0, proc.stderr[-3000:]
    assert got["fixed_failed"] == 0 and got["dispatched_then_rejected"] == 0, proc.stderr[-3000:]
    assert got["generated"] > 10 and got["dispatches"] > 100 and got["rejected"] > 50
    assert proc.returncode == 0


def test_fuzz_the_whole_load_path_2000_cases():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cases", "2000", "--seed", "0"], capture_output=True,
                          text=True, timeout=900)
    out = proc.stdout.strip().splitlines()
    line = out[-1] if out else ""
    assert line.startswith("fuzz_load:"), (proc.stdout[-2000:], proc.stderr[-3000:])
    print(line)
    got = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", line)}
    assert got["cases"] == 2000 + N_FIXED and got["untyped"] == 0 and got["over_2s"] == 0, proc.stderr[-3000:]
    assert got["fixed_failed"] == 0, "\n".join(x for x in out if x.startswith("fixed"))
    # the mutants reached every stage: typed rejections by the reader and past it, and full generations
    assert got["rejected"] > 500 and got["generated"] > 300
    stages = dict(re.findall(r"(\w+)=(\d+)", line.split("rejections[")[1]))
    assert {"GGUFError", "MetadataError", "ModelError", "TokenizerError"} <= set(stages)
    fixed = [x for x in out if x.startswith("fixed ")]
    assert len(fixed) == N_FIXED and "block_count=2591894889: rejected: MetadataError" in fixed[0]
    assert proc.returncode == 0
