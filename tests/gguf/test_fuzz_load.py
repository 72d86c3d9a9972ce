"""The whole-load fuzzer (scripts/fuzz_load.py): 2,000 hostile files taken through the reader,
tokenizer, graph, cpu backend, chat template and two decode steps, in one capped subprocess."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fuzz_load.py"


def test_fuzz_the_whole_load_path_2000_cases():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cases", "2000", "--seed", "0"], capture_output=True,
                          text=True, timeout=900)
    out = proc.stdout.strip().splitlines()
    line = out[-1] if out else ""
    assert line.startswith("fuzz_load:"), (proc.stdout[-2000:], proc.stderr[-3000:])
    print(line)
    got = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", line)}
    assert got["cases"] == 2003 and got["untyped"] == 0 and got["over_2s"] == 0, proc.stderr[-3000:]
    assert got["fixed_failed"] == 0, "\n".join(x for x in out if x.startswith("fixed"))
    # the mutants reached every stage: typed rejections by the reader and past it, and full generations
    assert got["rejected"] > 500 and got["generated"] > 300
    stages = dict(re.findall(r"(\w+)=(\d+)", line.split("rejections[")[1]))
    assert {"GGUFError", "MetadataError", "ModelError", "TokenizerError"} <= set(stages)
    fixed = [x for x in out if x.startswith("fixed ")]
    assert len(fixed) == 3 and "block_count=2591894889: rejected: MetadataError" in fixed[0]
    assert proc.returncode == 0
