"""The terminal chat edits like a shell (issue 23, item 4), typed into a real terminal (tmux):
a line edited with Left and an inserted character reaches the model as edited, Up recalls it,
a line ending in a backslash goes on to the next, and the prompt is coloured on a terminal."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import minfer

ROOT = Path(minfer.__file__).resolve().parent.parent

SPY = """
import json, sys
import minfer.api
from minfer.cli import main

real = minfer.api.Model.generate
def spy(self, prompt, **kw):  # what the model is asked: the last user message
    with open(sys.argv[1], "a") as f:
        f.write(json.dumps(prompt[-1]["content"]) + "\\n")
    return real(self, prompt, **kw)

minfer.api.Model.generate = spy
sys.exit(main(["chat", "-m", sys.argv[2], "-n", "2", "--temp", "0"]))
"""


class Terminal:
    def __init__(self, name: str):
        self.name = name

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def type(self, text: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, "-l", text], check=True)

    def last_line(self) -> str:
        """The last line with something on it (tmux drops trailing spaces: the prompt is '>')."""
        lines = [x for x in self.screen().splitlines() if x.strip()]
        return lines[-1].rstrip() if lines else ""

    def screen(self, escapes: bool = False) -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", self.name, *(["-e"] if escapes else [])],
                              capture_output=True, text=True, check=True).stdout


def wait_for(what, seconds: float = 120.0, poll: float = 0.1):
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        got = what()
        if got:
            return got
        time.sleep(poll)
    return what()


@pytest.fixture
def terminal(tmp_path, tiny_gguf):
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed (scripts/test.sh installs it: apt-get install tmux)")
    log = tmp_path / "asked.jsonl"
    script = tmp_path / "spy.py"
    script.write_text(SPY)
    name = f"minfer-chat-{os.getpid()}"
    env = {"PYTHONPATH": str(ROOT), "MINFER_CACHE": str(tmp_path / "cache"), "TERM": "xterm-256color",
           "PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
    cmd = " ".join([*(f"{k}={v}" for k, v in env.items()), sys.executable, str(script), str(log),
                    str(tiny_gguf("tiny-llama", "q4_1"))])
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True)
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "160", "-y", "40", "env -i " + cmd], check=True)
    term = Terminal(name)
    yield term, log, tmp_path / "cache" / "chat_history"
    subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)


def asked(log: Path) -> list[str]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def test_the_chat_edits_like_a_shell(terminal):
    term, log, history = terminal
    assert wait_for(lambda: "minfer chat with" in term.screen() and term.last_line() == ">"), term.screen()
    term.type("hllo")                      # a typo
    term.keys("Left", "Left", "Left")       # back to just after the h
    term.type("e")                         # insert the missing letter
    term.keys("Enter")
    assert wait_for(lambda: len(asked(log)) == 1), term.screen()
    assert asked(log) == ["hello"]          # the model got the edited line
    assert wait_for(lambda: term.last_line() == ">"), term.screen()
    term.keys("Up")                        # history: the last message back on the line
    assert wait_for(lambda: term.last_line() == "> hello"), term.screen()
    term.type(" again")
    term.keys("Enter")
    assert wait_for(lambda: len(asked(log)) == 2), term.screen()
    assert asked(log)[1] == "hello again"
    assert wait_for(lambda: term.last_line() == ">"), term.screen()
    term.type("first line\\")             # a backslash at the end: the message goes on
    term.keys("Enter")
    term.type("second line")
    term.keys("Enter")
    assert wait_for(lambda: len(asked(log)) == 3), term.screen()
    assert asked(log)[2] == "first line\nsecond line"
    assert "\x1b[32m" in term.screen(escapes=True)  # the prompt is green: a terminal (tmux re-encodes the escapes)
    term.type("/exit")
    term.keys("Enter")
    assert wait_for(lambda: history.exists()), term.screen()
    assert "hello again" in history.read_text()  # the history outlives the session


def test_no_colour_escapes_off_a_terminal(run_cli, tiny_gguf):
    rc, out, err = run_cli(["chat", "-m", str(tiny_gguf()), "-n", "3", "--temp", "0"], stdin="hello\n")
    assert rc == 0 and out.endswith("\n") and "\x1b[" not in out + err
