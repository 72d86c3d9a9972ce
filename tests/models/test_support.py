"""The architecture x backend table (models/support.py) says what the code does: every registered
architecture has a row, and a GPU backend marked "pending" for an architecture refuses its graph
at load (backends/calls.require_base_features), one marked "yes" accepts it."""

from __future__ import annotations

import pytest

from minfer.backends.calls import require_base_features
from minfer.cli import main
from minfer.errors import UnsupportedError
from minfer.gguf.reader import GGUFReader
from minfer.gguf.synth import PRESETS, synth
from minfer.models import registry
from minfer.models.support import BACKENDS, SUPPORT


def test_every_architecture_has_a_row():
    assert set(SUPPORT) == set(registry.ARCHITECTURES)


@pytest.mark.parametrize("preset", [p for p in PRESETS if p.startswith("tiny-")])
def test_pending_backends_refuse_the_graph(preset, tmp_path):
    path = synth(preset, "f32", tmp_path / "m.gguf", header_only=True)
    with GGUFReader(path) as r:
        _, graph = registry.build(r)
    for backend, state in zip(BACKENDS[1:], SUPPORT[PRESETS[preset].arch][1:], strict=True):
        if state == "yes":
            require_base_features(graph, backend)
        else:
            with pytest.raises(UnsupportedError, match=f"{backend} backend: {PRESETS[preset].arch} needs"):
                require_base_features(graph, backend)


def test_inspect_prints_the_table_and_a_files_row(tiny_gguf, capsys):
    assert main(["inspect", "--architectures"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["architecture", *BACKENDS]
    assert {line.split()[0] for line in out[1:]} == set(SUPPORT)
    assert main(["inspect", str(tiny_gguf("tiny-gemma3"))]) == 0
    assert "backends       cpu yes · cuda pending · vulkan pending" in capsys.readouterr().out


# llama3-70b's 40 GB header-only file cannot be memory-mapped on an 8-24 GB machine (tests/parallel
# checks its graph per rank)
@pytest.mark.parametrize("preset", [p for p in PRESETS if not p.startswith("tiny-") and p != "llama3-70b"])
@pytest.mark.parametrize("quant", ["q4_0", "q4_k_m"])
def test_every_real_shape_preset_builds_its_graph(preset, quant, tmp_path):
    """The header of each `minfer synth` preset passes its architecture's checks and every tensor
    the graph reads is there in the right shape (registry.build; no weight is read)."""
    path = synth(preset, quant, tmp_path / "m.gguf", header_only=True)
    with GGUFReader(path) as r:
        args, graph = registry.build(r)
    assert args.n_layer == PRESETS[preset].n_layers and graph.meta["n_vocab"] == PRESETS[preset].vocab


def test_vulkan_backend_refuses_a_gemma_file_at_load(tiny_gguf):
    """End to end on lavapipe (CI installs it): a typed error naming what is missing, no kernel run."""
    from minfer.api import load

    with pytest.raises(UnsupportedError, match=r"vulkan backend: gemma3 needs Attention\.window, GeGLU"):
        load(tiny_gguf("tiny-gemma3"), device="vulkan", progress=False)
