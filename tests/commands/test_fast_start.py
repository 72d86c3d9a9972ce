"""Fast starts (issue 23, item 6): the cpu backend keeps its prepared weights in a cache file
(backends/cpu/weight_cache.py) and maps it on the next load: the same numbers, no packing, and a
cache that cannot be trusted (another file, a damaged cache file) is not used. A `minfer run`
imports what the cpu path runs and nothing else (no Triton, server stack, Hub client, jinja2
without a template to render), and its start runs without the cyclic garbage collector
(commands/common.py start_without_gc). Wall-clock numbers are in bench/NOTES.md, not here: a
shared 2-core machine cannot time a start reliably."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import minfer
from minfer.api import load

IDS = [1, 5, 9, 200, 17, 3]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MINFER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "weights"


def _load(path, **kw):
    return load(path, n_ctx=64, n_slots=1, progress=False, **kw)


@pytest.mark.parametrize("quant", ["q4_1", "q4_k", "q8_0", "q6_k"])
def test_second_load_maps_the_cache_and_computes_the_same(tiny_gguf, cache_dir, quant):
    path = tiny_gguf("tiny-llama", quant)
    with _load(path, weight_cache=False) as m:  # (MINFER_WEIGHT_CACHE=0)
        want = m.logits(IDS)
        assert m.engine.backend._cache.path is None
    with _load(path) as m:
        first = m.logits(IDS)
        cache = m.engine.backend._cache
        assert cache.misses > 0 and cache.hits == 0
    files = list(cache_dir.glob("*.mwc"))
    assert len(files) == 1 and files[0].name.startswith(path.stem + "-")
    with _load(path) as m:
        again = m.logits(IDS)
        cache = m.engine.backend._cache
        assert cache.misses == 0 and cache.hits > 0  # every prepared matrix came from the file
    assert torch.equal(first, want) and torch.equal(again, want)  # bit for bit


def test_the_first_load_continues_from_the_file_it_writes(tiny_gguf, cache_dir, monkeypatch):
    """The first load writes each prepared matrix to the cache file as it goes and computes from a map
    of it (its packed copy freed), so it never holds every prepared weight in memory at once; the
    finished file is the one mapped. A load that fails midway leaves no file behind."""
    path = tiny_gguf("tiny-llama", "q4_1")
    with _load(path) as m:
        (f,) = cache_dir.glob("*.mwc")
        maps = Path("/proc/self/maps").read_text()
        assert str(f) in maps  # the prepared weights are pages of the cache file, not anonymous copies
        assert m.engine.backend._cache.misses > 0
    for old in cache_dir.glob("*.mwc"):
        old.unlink()
    from minfer.backends.cpu import weights

    real, calls = weights.cpu_vnni.Q4Vnni.from_state, []

    def fail_third(st):  # the load dies after a few matrices were written
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("planted")
        return real(st)

    monkeypatch.setattr(weights.cpu_vnni.Q4Vnni, "from_state", staticmethod(fail_third))
    with pytest.raises(RuntimeError, match="planted"):
        _load(path)
    assert not list(cache_dir.iterdir())  # no cache file, no temporary left


def test_another_file_gets_another_key(tiny_gguf, rewrite_gguf, tmp_path, cache_dir):
    a = tiny_gguf("tiny-llama", "q4_1")
    b = rewrite_gguf(a, tmp_path / a.name, meta={"general.name": "changed"})  # same name, other bytes
    with _load(a):
        pass
    with _load(b) as m:
        assert m.engine.backend._cache.hits == 0 and m.engine.backend._cache.misses > 0
    assert len(list(cache_dir.glob(f"{a.stem}-*.mwc"))) == 1  # the other key's file was replaced


def test_a_damaged_cache_file_is_ignored_and_rewritten(tiny_gguf, cache_dir, capfd):
    path = tiny_gguf("tiny-llama", "q4_1")
    with _load(path) as m:
        want = m.logits(IDS)
    (f,) = cache_dir.glob("*.mwc")
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
    assert rc1 == 0 and list(cache_dir.glob("*.mwc"))
    rc2, out2, _ = run_cli(argv)
    assert rc2 == 0 and out2 == out1


def test_the_flat_file_gives_back_what_was_written(tmp_path):
    from minfer.backends.cpu.weight_cache import CacheFileError, Writer, map_file
    g = torch.Generator().manual_seed(0)
    want = {
        "vnni:a": {"w": torch.randint(0, 255, (96, 40), dtype=torch.uint8, generator=g),
                   "s": torch.randn(3, 5, generator=g).half(), "n": 7, "k": 40},
        "int4:b": {"packed": torch.randn(4, 3, generator=g).bfloat16(), "slices": torch.empty(0, 2, dtype=torch.int64),
                   "pair": 0},
    }
    path = tmp_path / "x.mwc"
    w = Writer(path)
    written = {name: w.add(name, fields) for name, fields in want.items()}  # mapped back as they are written
    w.finish()
    for got in (written, map_file(path)):
        assert got.keys() == want.keys()
        for name, fields in want.items():
            assert got[name].keys() == fields.keys()
            for k, v in fields.items():
                if isinstance(v, torch.Tensor):
                    assert got[name][k].dtype == v.dtype and torch.equal(got[name][k], v), (name, k)
                    assert got[name][k].data_ptr() % 64 == 0 or v.numel() == 0  # aligned views of the map
                else:
                    assert got[name][k] == v and isinstance(got[name][k], int)
    torch.save(want, tmp_path / "old.pt")  # the first format (torch.save): not this one
    with pytest.raises(CacheFileError, match="MINFERWC"):
        map_file(tmp_path / "old.pt")
    cut = tmp_path / "cut.mwc"
    cut.write_bytes(path.read_bytes()[:-5])  # a file cut short (a load killed while it wrote the header)
    with pytest.raises(CacheFileError, match="no header"):
        map_file(cut)


def test_another_model_with_a_longer_name_keeps_its_cache(tiny_gguf, tmp_path, cache_dir):
    a = tiny_gguf("tiny-llama", "q4_1")
    longer = tmp_path / f"{a.stem}-instruct.gguf"
    longer.write_bytes(a.read_bytes())
    with _load(longer):
        pass
    with _load(a):
        pass
    names = sorted(f.name for f in cache_dir.glob("*.mwc"))
    assert len(names) == 2 and any(n.startswith(f"{a.stem}-instruct-") for n in names), names


def test_the_switch_and_the_directory_come_from_the_config(tiny_gguf, tmp_path, monkeypatch):
    """MINFER_WEIGHT_CACHE=0 reaches the backend through EngineConfig, and the cache lands in the
    config's cache directory (an explicit cache_dir over MINFER_CACHE)."""
    path = tiny_gguf("tiny-llama", "q4_1")
    monkeypatch.setenv("MINFER_CACHE", str(tmp_path / "from-env"))
    monkeypatch.setenv("MINFER_WEIGHT_CACHE", "0")
    with _load(path) as m:
        assert m.engine.config.weight_cache is False and m.engine.backend._cache.path is None
    monkeypatch.delenv("MINFER_WEIGHT_CACHE")
    with _load(path, cache_dir=str(tmp_path / "explicit")):
        pass
    assert list((tmp_path / "explicit" / "weights").glob("*.mwc"))
    assert not (tmp_path / "from-env" / "weights").exists()


def test_a_cpu_load_binds_the_cpu_contracts_alone(tiny_gguf, tmp_path):
    """The cpu backend's picker reads the CPU contract files only: no GPU kernel module (nor
    Triton, ~1 s of import) is imported by a cpu load."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import minfer

    code = ("import sys; from minfer.api import load; m = load(sys.argv[1], n_ctx=64, progress=False); "
            "print(sorted(k for k in sys.modules if k == 'triton' or k.startswith(('minfer.kernels.triton', "
            "'minfer.kernels.wgsl', 'minfer.kernels.wgpu'))))")
    env = dict(os.environ, PYTHONPATH=str(Path(minfer.__file__).resolve().parent.parent),
               MINFER_CACHE=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", code, str(tiny_gguf("tiny-llama", "q4_k"))], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def _python(code: str, *args: str, cache: Path) -> str:
    """Run `code` in a fresh interpreter on this tree's minfer; its stdout (an error's stderr fails)."""
    env = dict(os.environ, PYTHONPATH=str(Path(minfer.__file__).resolve().parent.parent), MINFER_CACHE=str(cache))
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


# what a cpu `minfer run PROMPT` of a local file never needs: GPU kernels, the server, the Hub
# client, transformers, jinja2 (no template is rendered), torch's compiler stack, the GGUF writer
NOT_ON_THE_RUN_PATH = ("triton", "wgpu", "fastapi", "uvicorn", "starlette", "huggingface_hub", "transformers",
                       "jinja2", "sympy", "torch._dynamo", "torch._inductor", "minfer.server",
                       "minfer.kernels.triton", "minfer.kernels.wgsl", "minfer.kernels.wgpu", "minfer.tokenizer.chat",
                       "minfer.gguf.synth", "minfer.gguf.writer", "minfer.trace")
LISTED = ("print('MODULES', sorted(m for m in sys.modules if any(m == n or m.startswith(n + '.') "
          "for n in sys.argv[1].split(','))))")


def _modules(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("MODULES"))


def test_the_parser_imports_no_torch_numpy_or_templates(tmp_path):
    """`minfer --help` and every command's flag checks run before anything heavy is imported: the
    parser lists the built-in template names and the synth presets from plain-data modules."""
    heavy = ("torch", "numpy", "jinja2", "yaml", "urllib.request", "minfer.gguf.synth", "minfer.tokenizer.tokenizer",
             "minfer.api")
    out = _python("import sys; import minfer.cli as c; c.build_parser(); " + LISTED, ",".join(heavy), cache=tmp_path)
    assert _modules(out) == "MODULES []"


def test_a_run_imports_the_cpu_path_alone(tiny_gguf, tmp_path):
    """A whole `minfer run` (parse, load, generate, close) in a fresh process: none of
    NOT_ON_THE_RUN_PATH is imported, and the collector runs again after the start."""
    path = tiny_gguf("tiny-llama", "q4_k")
    code = ("import sys, gc; from minfer.cli import main; "
            "rc = main(['run', '-m', sys.argv[2], '-n', '3', '--temp', '0', 'hello']); "
            "print(); print('RC', rc, 'GC', gc.isenabled()); " + LISTED)
    out = _python(code, ",".join(NOT_ON_THE_RUN_PATH), str(path), cache=tmp_path)
    assert "RC 0 GC True" in out
    assert _modules(out) == "MODULES []"
    # the check can fail: a chat template (compiled when given) brings jinja2
    out = _python(code.replace("'hello'", "'--chat-template', 'chatml', 'hello'"), "jinja2", str(path), cache=tmp_path)
    assert "jinja2" in _modules(out)


def test_the_second_run_maps_the_cache_and_prepares_nothing(run_cli, tiny_gguf, cache_dir, monkeypatch):
    """The second `minfer run` of a model takes every prepared matrix from the cache file and
    writes nothing (the file is untouched)."""
    from minfer.backends.cpu.weight_cache import WeightCache

    counts: list[tuple[int, int]] = []
    save = WeightCache.save

    def spy(self):
        counts.append((self.hits, self.misses))
        return save(self)

    monkeypatch.setattr(WeightCache, "save", spy)
    argv = ["run", "-m", str(tiny_gguf("tiny-llama", "q4_1")), "-n", "2", "--temp", "0", "hello"]
    assert run_cli(argv)[0] == 0
    (f,) = cache_dir.glob("*.mwc")
    before = f.stat()
    assert run_cli(argv)[0] == 0
    after = f.stat()
    assert counts[0][1] > 0 and counts[1][1] == 0 and counts[1][0] == counts[0][1]  # hits = the first run's misses
    assert (after.st_mtime_ns, after.st_size, after.st_ino) == (before.st_mtime_ns, before.st_size, before.st_ino)


def test_the_start_runs_without_the_collector_and_freezes_what_it_built():
    from minfer.commands.common import start_without_gc

    assert gc.isenabled() and gc.get_freeze_count() == 0
    try:
        with start_without_gc():
            assert not gc.isenabled()
            built = [[i] for i in range(1000)]
        assert gc.isenabled() and gc.get_freeze_count() >= len(built)
    finally:
        gc.unfreeze()
    with pytest.raises(ValueError), start_without_gc():  # a failed start: collector back, nothing frozen
        raise ValueError("load failed")
    assert gc.isenabled() and gc.get_freeze_count() == 0
