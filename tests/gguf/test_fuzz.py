"""The mutation fuzzer (scripts/fuzz_gguf.py): 2,000 hostile files, one subprocess.

One process, so its RSS is measured alone and a hard crash (a segfault in the mmap path)
fails this test instead of killing pytest. The script checks every case in-process: typed
rejection or a clean accept whose tensor views stay inside the file.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fuzz_gguf.py"


def test_fuzz_2000_cases_no_crash_no_hang_bounded_rss(smollm2_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cases", "2000", "--seed", "0", "--smollm2",
                           str(smollm2_path)], capture_output=True, text=True, timeout=600)
    line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert line.startswith("fuzz_gguf:"), (proc.stdout, proc.stderr[-3000:])
    print(line)  # shown with pytest -s: the fuzzer's result line
    got = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", line)}
    assert got["files"] == 2000 and got["rejected"] + got["accepted"] + got["crashes"] == 2000
    assert got["crashes"] == 0 and got["over_1s"] == 0, proc.stderr[-3000:]
    assert got["rss_growth_mb"] < got["rss_limit_mb"]
    # the fuzz reached both outcomes, loaded accepted mutants fully, and ran every mutation
    assert got["rejected"] > 1000 and got["accepted"] > 50 and got["full_loads"] > 20
    ops = dict(re.findall(r"(\w+)=(\d+)", line.split("ops[")[1]))
    assert set(ops) == {"truncate", "bitflip", "special", "randbytes", "copy", "shift", "stack"}
    assert proc.returncode == 0
