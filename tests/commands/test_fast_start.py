"""Fast starts (issue 23, item 6): the cpu backend keeps its prepared weights in a cache file
(backends/weight_cache.py) and maps it on the next load: the same numbers, no packing, and a
cache that cannot be trusted (another file, a damaged cache file) is not used."""

from __future__ import annotations

import pytest
import torch

from minfer.api import load

IDS = [1, 5, 9, 200, 17, 3]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MINFER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "weights"


def _load(path, **kw):
    return load(path, n_ctx=64, n_slots=1, progress=False, **kw)


@pytest.mark.parametrize("quant", ["q4_1", "q4_k", "q8_0", "q6_k"])
def test_second_load_maps_the_cache_and_computes_the_same(tiny_gguf, cache_dir, quant, monkeypatch):
    path = tiny_gguf("tiny-llama", quant)
    monkeypatch.setenv("MINFER_WEIGHT_CACHE", "0")
    with _load(path) as m:
        want = m.logits(IDS)
        assert m.engine.backend._cache.path is None
    monkeypatch.delenv("MINFER_WEIGHT_CACHE")
    with _load(path) as m:
        first = m.logits(IDS)
        cache = m.engine.backend._cache
        assert cache.misses > 0 and cache.hits == 0
    files = list(cache_dir.glob("*.pt"))
    assert len(files) == 1 and files[0].name.startswith(path.stem + "-")
    with _load(path) as m:
        again = m.logits(IDS)
        cache = m.engine.backend._cache
        assert cache.misses == 0 and cache.hits > 0  # every prepared matrix came from the file
    assert torch.equal(first, want) and torch.equal(again, want)  # bit for bit


def test_another_file_gets_another_key(tiny_gguf, rewrite_gguf, tmp_path, cache_dir):
    a = tiny_gguf("tiny-llama", "q4_1")
    b = rewrite_gguf(a, tmp_path / a.name, meta={"general.name": "changed"})  # same name, other bytes
    with _load(a):
        pass
    with _load(b) as m:
        assert m.engine.backend._cache.hits == 0 and m.engine.backend._cache.misses > 0
    assert len(list(cache_dir.glob(f"{a.stem}-*.pt"))) == 1  # the other key's file was replaced


def test_a_damaged_cache_file_is_ignored_and_rewritten(tiny_gguf, cache_dir, capfd):
    path = tiny_gguf("tiny-llama", "q4_1")
    with _load(path) as m:
        want = m.logits(IDS)
    (f,) = cache_dir.glob("*.pt")
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])  # truncated
    with _load(path) as m:
        assert torch.equal(m.logits(IDS), want)
    assert "ignoring the weight cache" in capfd.readouterr().err
    with _load(path) as m:
        assert m.engine.backend._cache.misses == 0  # rewritten whole
        assert torch.equal(m.logits(IDS), want)


def test_run_twice_from_the_command_line(run_cli, tiny_gguf, cache_dir):
    argv = ["run", "-m", str(tiny_gguf("tiny-llama", "q4_k")), "-n", "4", "--temp", "0", "hello"]
    rc1, out1, _ = run_cli(argv)
    assert rc1 == 0 and list(cache_dir.glob("*.pt"))
    rc2, out2, _ = run_cli(argv)
    assert rc2 == 0 and out2 == out1
