"""The llama.cpp oracle files in tests/fixtures are the ones llama.cpp wrote: byte for byte."""

from __future__ import annotations

import hashlib

import pytest

SHA256 = {
    "smollm2/cases.json": "d2d030fec406bc071882f7bf02c8de18c54acdc932c0eea16ef8c34aefbecb59",
    "smollm2/llamacpp.json": "42cb555cbcfd66d7dadef918391d49dae06c13742dea1b594ecb136aa902d93e",
    "text/gpl-3.txt": "3972dc9744f6499f0f9b2dbf76696f2ae7ad8af9b23dde66d6af86c9dfb36986",
}


@pytest.mark.parametrize("name", sorted(SHA256))
def test_oracle_file_is_unchanged(fixtures_dir, name):
    assert hashlib.sha256((fixtures_dir / name).read_bytes()).hexdigest() == SHA256[name]
