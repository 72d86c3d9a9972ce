#!/usr/bin/env python3
"""Coverage-guided fuzzing of minfer's GGUF reader with atheris (libFuzzer). Run by hand, not in CI.

Each input is written to a file (the reader maps files) and opened; a MinferError is a clean
rejection, anything else is a finding. Accepted inputs get every tensor view touched.

    pip install atheris                     # a cp311 manylinux wheel exists
    python scripts/atheris_gguf.py --make-corpus fuzz_corpus
    python scripts/atheris_gguf.py fuzz_corpus -max_len=1048576 -timeout=5 -rss_limit_mb=2048 \
        -runs=200000

--make-corpus writes seeds: a tiny synth model (vocab 300) and the SmolLM2 header with its
vocabulary cut to 64 entries (tensor infos kept, data section left out, so most mutants fail
at the data-range check: the tiny seed covers the accepted path). Crashes are saved by libFuzzer
as crash-* files; replay one with `python scripts/atheris_gguf.py crash-<hash>`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from minfer.errors import MinferError
    from minfer.gguf.reader import GGUFReader

# one scratch file, on a RAM file system where there is one
_SHM = "/dev/shm" if os.path.isdir("/dev/shm") else None
_SCRATCH = Path(tempfile.mkdtemp(prefix="atheris_gguf_", dir=_SHM))
_PATH = _SCRATCH / "input.gguf"
atexit.register(shutil.rmtree, _SCRATCH, True)


def test_one_input(data: bytes) -> None:
    _PATH.write_bytes(data)
    try:
        reader = GGUFReader(_PATH)
    except MinferError:
        return
    with reader:
        for name, info in reader.tensors.items():
            view = reader.tensor_bytes(name)
            if view.size != info.nbytes or info.offset + info.nbytes > reader.file_size:
                raise AssertionError(f"tensor {name!r}: view out of the header's bounds")
            if view.size:
                _ = (view[0], view[-1])


def make_corpus(out: Path) -> None:
    from minfer.default_model import default_model_path
    from minfer.gguf.synth import synth
    from minfer.gguf.writer import reencode_header

    out.mkdir(parents=True, exist_ok=True)
    synth("tiny-llama", "q4_0", out / "tiny-llama-q4_0.gguf", vocab=300, progress=False)
    with GGUFReader(default_model_path()) as r:
        (out / "smollm2-header.gguf").write_bytes(reencode_header(r, max_array=64, map_fields=False).bytes())
    print(f"wrote seeds to {out}")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--make-corpus":
        make_corpus(Path(sys.argv[2]))
        return
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
