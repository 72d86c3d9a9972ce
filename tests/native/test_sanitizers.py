"""The sanitizer job (scripts/sanitize.sh) in the suite: minfer's C code built with
-fsanitize=address,undefined and driven over random and boundary shapes reports nothing, and a
planted out-of-bounds read is caught (so a green run means the sanitizers were live)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _sanitize(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable, MINFER_SANITIZE_CACHE=str(tmp_path / "cache"))
    return subprocess.run(["bash", str(ROOT / "scripts" / "sanitize.sh"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def test_c_code_is_clean_under_asan_and_ubsan(tmp_path):
    done = _sanitize(tmp_path)
    out = done.stdout + done.stderr
    print(out[-3000:])
    assert done.returncode == 0, out[-6000:]
    assert "passed" in out and "AddressSanitizer" not in out and "runtime error" not in out
    built = sorted(p.name for p in (tmp_path / "cache").glob("*.so"))
    assert any(n.startswith("replay-") for n in built), built
    for so in (tmp_path / "cache").glob("*.so"):  # the libraries it loaded were the sanitized builds
        assert b"__asan_" in so.read_bytes() and b"__ubsan_" in so.read_bytes(), so.name


def test_a_planted_overflow_is_caught(tmp_path):
    done = _sanitize(tmp_path, "tests/native/canary_overflow.py")
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in out and "replay.c" in out, out[-4000:]
