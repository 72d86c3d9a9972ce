"""The engine in its own process (server/process.py): a dead engine is an error to every client
it held and a 503 after, never a hang or a 500 for a new request; a dead server takes its engine
with it; Ctrl-C stops both."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from .conftest import HANG_GUARD, start_server, stop_server


def children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(p.name))
    return out


def engine_pid(server_pid: int) -> int:
    kids = [c for c in children(server_pid) if b"multiprocessing" in Path(f"/proc/{c}/cmdline").read_bytes()]
    assert len(kids) >= 1, f"no engine process under {server_pid}"
    spawn = [c for c in kids if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
    assert len(spawn) == 1, spawn
    return spawn[0]


def gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":  # exited, not yet reaped by its parent
            return True
        time.sleep(0.05)
    return False


def test_engine_death_fails_its_streams_then_503(tmp_path, smollm2_path):
    s = start_server(tmp_path, "-np", "2", model=smollm2_path)
    try:
        child = engine_pid(s.proc.pid)
        body = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "temperature": 0, "stream": True}
        events = []
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=HANG_GUARD) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[6:])
                if len(events) == 3:
                    os.kill(child, signal.SIGKILL)
        # the stream ended because the engine died (the error event says so), before the 400 tokens asked
        # (the pieces already on their way still arrive: how many depends on the machine, not checked)
        assert len(events) - 2 < 400, len(events)
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert "error" in last and "engine process exited" in last["error"]["message"], last
        assert gone(child, HANG_GUARD)
        h = httpx.get(s.url + "/health", timeout=HANG_GUARD)
        assert h.status_code == 503 and h.json() == {"status": "error"}
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=HANG_GUARD)
        assert r.status_code == 503 and r.json()["error"]["message"].startswith("the model is not available")
        assert s.proc.poll() is None  # the server itself is still up, saying what happened
    finally:
        stop_server(s)


def test_killed_server_takes_its_engine(tmp_path, smollm2_path):
    s = start_server(tmp_path, "-np", "1", model=smollm2_path)
    child = engine_pid(s.proc.pid)
    s.proc.kill()
    s.proc.wait(HANG_GUARD)
    assert gone(child, HANG_GUARD), "the engine process outlived its server"


def test_sigint_stops_server_and_engine(tmp_path, smollm2_path):
    s = start_server(tmp_path, "-np", "1", model=smollm2_path)
    child = engine_pid(s.proc.pid)
    s.proc.send_signal(signal.SIGINT)
    try:
        rc = s.proc.wait(HANG_GUARD)
    except Exception:
        s.proc.kill()
        pytest.fail("minfer serve did not stop on SIGINT:\n" + s.log.read_text())
    assert gone(child, HANG_GUARD)
    log = s.log.read_text()
    assert rc in (0, 130, -2), (rc, log)
    assert "Traceback" not in log and "exited" not in log, log
