"""The architecture x backend table (models/support.py) says what the code does: every registered
architecture has a row; `minfer inspect` prints it; every real-shape preset builds its graph.
(Each family running on cuda and vulkan: tests/backends/test_families_gpu.py.)"""

from __future__ import annotations

import pytest

from minfer.api import load
from minfer.cli import main
from minfer.errors import UnsupportedError
from minfer.gguf.reader import GGUFReader
from minfer.gguf.synth import PRESETS, synth
from minfer.models import registry, support
from minfer.models.support import BACKENDS, SUPPORT


def test_every_architecture_has_a_row():
    assert set(SUPPORT) == set(registry.ARCHITECTURES)


def test_inspect_prints_the_table_and_a_files_row(tiny_gguf, capsys):
    assert main(["inspect", "--architectures"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["architecture", *BACKENDS]
    assert {line.split()[0] for line in out[1:]} == set(SUPPORT)
    assert main(["inspect", str(tiny_gguf("tiny-gemma3"))]) == 0
    assert "backends       cpu yes · cuda yes · vulkan yes" in capsys.readouterr().out


def test_a_backend_marked_no_is_refused_up_front(tiny_gguf, monkeypatch):
    """A row's "no" (a backend lacking an op the family needs) is a typed error naming the backends
    that run it, at load (before any weight is read); the same file loads on a "yes" backend."""
    monkeypatch.setitem(support.SUPPORT, "gpt-oss", ("yes", "no", "no"))
    with pytest.raises(UnsupportedError, match="'gpt-oss' does not run on the vulkan backend.*: cpu$"):
        load(tiny_gguf("tiny-gpt-oss"), device="vulkan", progress=False)
    load(tiny_gguf("tiny-gpt-oss"), progress=False).close()


# llama3-70b's 40 GB header-only file cannot be memory-mapped on an 8-24 GB machine (tests/parallel
# checks its graph per rank), nor can the mixtures of experts' 17-26 GB (tests/models/test_moe.py
# checks their shapes on 2 of their layers)
BIG = ("llama3-70b", "qwen3-30b-a3b", "mixtral-8x7b")


@pytest.mark.parametrize("preset", [p for p in PRESETS if not p.startswith("tiny-") and p not in BIG])
@pytest.mark.parametrize("quant", ["q4_0", "q4_k_m"])
def test_every_real_shape_preset_builds_its_graph(preset, quant, tmp_path):
    """The header of each `minfer synth` preset passes its architecture's checks and every tensor
    the graph reads is there in the right shape (registry.build; no weight is read)."""
    path = synth(preset, quant, tmp_path / "m.gguf", header_only=True)
    with GGUFReader(path) as r:
        args, graph = registry.build(r)
    assert args.n_layer == PRESETS[preset].n_layers and graph.meta["n_vocab"] == PRESETS[preset].vocab
