"""The command line as a user runs it: `run_cli(argv, stdin=None) -> (exit code, stdout, stderr)`."""

from __future__ import annotations

import io

import pytest

from minfer.cli import main


@pytest.fixture
def run_cli(capsys, monkeypatch):
    def run(argv: list[str], stdin: str | None = None) -> tuple[int, str, str]:
        if stdin is not None:
            monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        rc = main(argv)
        out, err = capsys.readouterr()
        return rc, out, err

    return run
