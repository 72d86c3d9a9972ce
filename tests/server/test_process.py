"""The engine in its own process (server/process.py): a dead engine is an error to every client
it held, running or queued, a 503 while a new one starts, never a hang or a 500 for a new request;
an engine that keeps dying ends the server non-zero; a dead server takes its engine with it;
Ctrl-C stops both."""

from __future__ import annotations

import json
import os
import signal
import threading
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


def _stream_events(url: str, body: dict, out: list, started: threading.Event) -> None:
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        out.append(r.status_code)
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(line[6:])
                started.set()


def wait_health(url: str, status: str, seconds: float) -> float:
    """Seconds until /health says `status` (fails after `seconds`)."""
    t0 = time.monotonic()
    while True:
        try:
            if httpx.get(url + "/health", timeout=5).json().get("status") == status:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        assert time.monotonic() - t0 < seconds, f"/health never said {status!r}"
        time.sleep(0.05)


def test_engine_death_fails_running_and_queued_then_restarts(tmp_path, smollm2_path):
    """SIGKILL of the engine: the running request and the one queued behind it (one slot) both end
    with an error that says what happened; /health says "restarting" (new requests a 503 that
    says so), then "ok" with a new engine process that serves."""
    s = start_server(tmp_path, "-np", "1", model=smollm2_path)
    try:
        child = engine_pid(s.proc.pid)
        body = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "temperature": 0, "stream": True}
        running, queued = [], []
        started, queued_started = threading.Event(), threading.Event()
        t1 = threading.Thread(target=_stream_events, args=(s.url, body, running, started))
        t1.start()
        assert started.wait(30)
        t2 = threading.Thread(target=_stream_events, args=(s.url, body, queued, queued_started))
        t2.start()
        assert queued_started.wait(30)  # its first chunk (role) is sent before it gets a slot
        deadline = time.monotonic() + 30
        while s.metric("minfer_queued_sequences") != 1:
            assert time.monotonic() < deadline, "the second request never queued"
            time.sleep(0.1)
        os.kill(child, signal.SIGKILL)
        t0 = time.monotonic()
        t1.join(20), t2.join(20)
        assert time.monotonic() - t0 < 20 and not t1.is_alive() and not t2.is_alive()
        for events in (running, queued):
            assert events[0] == 200 and events[-1] == "[DONE]", events[-3:]
            err = json.loads(events[-2])["error"]
            assert "engine process exited (exit code -9); restarting it" in err["message"], err
        assert gone(child, 5)
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=10)
        if r.status_code == 503:  # (unless the new engine was already up)
            assert r.json()["error"]["code"] == "restarting", r.text
        wait_health(s.url, "ok", 90)
        assert engine_pid(s.proc.pid) != child
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "temperature": 0}, timeout=30)
        assert r.status_code == 200, r.text
        assert s.metric("minfer_engine_restarts_total") == 1
        assert s.proc.poll() is None
    finally:
        stop_server(s)


def test_repeated_engine_deaths_stop_the_server_non_zero(tmp_path, tiny_gguf):
    """Killed again each time it comes back: restarted 3 times, the 4th death ends the server with a
    non-zero exit code (a supervisor's cue), the reason in its log; its engine goes with it. A tiny
    model: what is tested is the supervision, and each of the four engines loads in a fraction of
    SmolLM2's time (the test took 33 s in the suite with SmolLM2, 2026-12-03)."""
    s = start_server(tmp_path, "-np", "1", model=tiny_gguf("tiny-llama", "q8_0"))
    try:
        for i in range(4):
            child = engine_pid(s.proc.pid)
            os.kill(child, signal.SIGKILL)
            assert gone(child, 10)
            if i < 3:  # the death noticed (/health may still say ok until it is), then the new engine ready
                deadline = time.monotonic() + 30
                while s.metric("minfer_engine_restarts_total") < i + 1:
                    assert time.monotonic() < deadline, f"death {i + 1} not noticed"
                    time.sleep(0.05)
                wait_health(s.url, "ok", 90)
        rc = s.proc.wait(30)
        log = s.log.read_text()
        assert rc not in (0, -15, -9), (rc, log)
        assert "failed 4 times" in log and "the server stops" in log, log
        assert not [c for c in children(s.proc.pid)]
    finally:
        if s.proc.poll() is None:
            stop_server(s)


def test_killed_server_takes_its_engine(tmp_path, tiny_gguf):
    s = start_server(tmp_path, "-np", "1", model=tiny_gguf("tiny-llama", "q8_0"))  # (supervision: any model)
    child = engine_pid(s.proc.pid)
    s.proc.kill()
    s.proc.wait(HANG_GUARD)
    assert gone(child, HANG_GUARD), "the engine process outlived its server"


def test_sigint_stops_server_and_engine(tmp_path, tiny_gguf):
    s = start_server(tmp_path, "-np", "1", model=tiny_gguf("tiny-llama", "q8_0"))  # (supervision: any model)
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
