"""The C build cache (kernels/cbuild.py) treated as a place others could write: created private to
the user, a library loaded only from the file named by the hash of its source and flags, and an
entry another user owns, others can write, or that is a link, rebuilt rather than loaded."""

from __future__ import annotations

import os
import stat
import subprocess
import warnings
from pathlib import Path

import pytest

from minfer.kernels import cbuild

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user owns needs root (CI is root)")
OTHER_UID = 1  # daemon: a user that is not us


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "deep" / "cache"
    monkeypatch.setattr(cbuild, "_CACHE", [d])  # what a backend's use_cache_dir(EngineConfig.cache_path) does
    monkeypatch.delenv("MINFER_SANITIZE", raising=False)
    return d


def _source(tmp_path: Path, value: int, name: str = "answer") -> Path:
    src = tmp_path / f"{name}.c"
    src.write_text(f"/* {tmp_path} */\nint answer(void) {{ return {value}; }}\n")
    return src


def _entry(cache: Path, tmp_path: Path, value: int, name: str) -> tuple[Path, Path]:
    """A source answering `value` and the cache entry its -O1 build would load (the cache made, empty)."""
    src = _source(tmp_path, value, name)
    cache.mkdir(parents=True, mode=0o700)
    return src, cbuild.library_path(src, ["-O1", "-shared", "-fPIC"], cbuild.compiler())


def _plant(path: Path, value: int, tmp_path: Path) -> None:
    """A library at `path` that answers `value` (what an attacker would leave there)."""
    evil = tmp_path / "evil.c"
    evil.write_text(f"int answer(void) {{ return {value}; }}\n")
    subprocess.run([cbuild.compiler(), "-shared", "-fPIC", str(evil), "-o", str(path)], check=True)


def test_cache_is_created_private_and_the_library_named_by_its_hash(cache, tmp_path):
    src = _source(tmp_path, 42)
    so = cbuild.build(src, ["-O1"], "nothing")
    assert so is not None and so.answer() == 42
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    (lib,) = cache.glob("*.so")
    assert stat.S_IMODE(lib.stat().st_mode) & 0o077 == 0
    assert lib == cbuild.library_path(src, ["-O1", "-shared", "-fPIC"], cbuild.compiler())
    # another flag or another source: another file; the first stays as it was
    assert cbuild.build(src, ["-O2"], "nothing").answer() == 42
    src.write_text(src.read_text().replace("42", "43"))
    assert cbuild.build(src, ["-O1"], "nothing").answer() == 43
    assert len(list(cache.glob("*.so"))) == 3 and lib.exists()


def test_a_group_writable_entry_is_rebuilt_not_loaded(cache, tmp_path):
    src, lib = _entry(cache, tmp_path, 7, "gw")
    _plant(lib, 666, tmp_path)
    lib.chmod(0o775)
    assert cbuild.build(src, ["-O1"], "nothing").answer() == 7
    assert stat.S_IMODE(lib.stat().st_mode) & 0o022 == 0


def test_a_symlinked_entry_is_rebuilt_not_loaded(cache, tmp_path):
    src, lib = _entry(cache, tmp_path, 8, "ln")
    target = tmp_path / "elsewhere.so"
    _plant(target, 666, tmp_path)
    target.chmod(0o700)
    lib.symlink_to(target)
    assert cbuild.build(src, ["-O1"], "nothing").answer() == 8
    assert not lib.is_symlink()


@root_only
def test_an_entry_another_user_owns_is_rebuilt_not_loaded(cache, tmp_path):
    src, lib = _entry(cache, tmp_path, 9, "own")
    _plant(lib, 666, tmp_path)
    lib.chmod(0o700)
    os.chown(lib, OTHER_UID, -1)
    assert cbuild.build(src, ["-O1"], "nothing").answer() == 9
    assert lib.stat().st_uid == os.geteuid()


def test_a_cache_others_can_write_is_not_used(cache, tmp_path):
    src = _source(tmp_path, 10, "dirw")
    cache.mkdir(parents=True)
    cache.chmod(0o777)
    with pytest.warns(UserWarning, match="writable by group or others"):
        assert cbuild.build(src, ["-O1"], "nothing") is None
    assert list(cache.iterdir()) == []


@root_only
def test_a_cache_another_user_owns_is_not_used(cache, tmp_path):
    src = _source(tmp_path, 11, "diro")
    cache.mkdir(parents=True, mode=0o700)
    lib = cbuild.library_path(src, ["-O1", "-shared", "-fPIC"], cbuild.compiler())
    _plant(lib, 666, tmp_path)
    os.chown(cache, OTHER_UID, -1)
    with pytest.warns(UserWarning, match="owned by uid 1"):
        assert cbuild.build(src, ["-O1"], "nothing") is None


def test_sanitize_without_libasan_is_a_clear_error(cache, tmp_path, monkeypatch):
    """A sanitized library cannot load into a process without libasan first: said, not crashed."""
    from minfer.errors import MinferError

    monkeypatch.setenv("MINFER_SANITIZE", "1")
    if "libasan" in Path("/proc/self/maps").read_text():
        pytest.skip("this process has libasan loaded (scripts/sanitize.sh)")
    with pytest.raises(MinferError, match="LD_PRELOAD"):
        cbuild.build(_source(tmp_path, 1, "san"), ["-O1"], "nothing")


def test_no_warning_for_a_private_cache(cache, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cbuild.build(_source(tmp_path, 12, "quiet"), ["-O1"], "nothing").answer() == 12
