"""Progress bars only on a terminal: one helper (minfer/progress.py) makes every bar."""

from __future__ import annotations

import io
import os
import sys

import pytest

from minfer import progress


def test_bar_is_off_when_stderr_is_not_a_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with progress.bar(total=3, desc="x") as b:
        assert b.disable
        b.update(3)
    assert sys.stderr.getvalue() == ""


def test_bar_is_on_for_a_terminal_unless_told_not(monkeypatch):
    master, slave = os.openpty()
    try:
        with os.fdopen(slave, "w", closefd=True) as tty:
            monkeypatch.setattr(sys, "stderr", tty)
            assert progress.on_terminal()
            with progress.bar(total=3, desc="x") as b:
                assert not b.disable
            with progress.bar(total=3, desc="x", show=False) as b:
                assert b.disable
    finally:
        os.close(master)


@pytest.mark.parametrize("module", ["minfer.backends.plan", "minfer.gguf.synth", "minfer.commands.batch"])
def test_no_module_makes_its_own_tqdm(module):
    """Every bar goes through progress.bar (so none escapes the terminal check)."""
    import importlib
    import inspect

    src = inspect.getsource(importlib.import_module(module))
    assert "import tqdm" not in src and "from tqdm" not in src

