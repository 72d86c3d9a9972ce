"""A real `minfer serve` process on 127.0.0.1 (a free port), started by the tests, and clients.

The default model (SmolLM2-135M-Instruct) with 8 slots and a 512-token context: one process
for the whole session (loading takes a few seconds), plus a second one with --api-key.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import minfer

ROOT = Path(minfer.__file__).resolve().parent.parent
N_SLOTS = 8
N_CTX = 512
# Waits in these tests end on an event (a count reached, a state seen); this many seconds only turn a hang
# into a failure, far beyond what any of them takes on a slow, shared machine.
HANG_GUARD = 600.0


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log: Path

    def metric(self, name: str, headers: dict | None = None) -> float:
        text = httpx.get(self.url + "/metrics", headers=headers or {}, timeout=10).text
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        assert m, f"{name} not in /metrics"
        return float(m.group(1))

    def requests(self, endpoint: str, status: int) -> float:
        """minfer_requests_total of one endpoint and status (0 before the first one): a 499 counts a
        request whose sequence was cancelled because its client went away."""
        m = re.search(rf'^minfer_requests_total\{{endpoint="{re.escape(endpoint)}",status="{status}"\}} (\S+)$',
                      httpx.get(self.url + "/metrics", timeout=10).text, re.M)
        return float(m.group(1)) if m else 0.0

    def wait_idle(self, hang_guard: float = HANG_GUARD) -> None:
        """Until /metrics shows 0 active and 0 queued sequences. What a test claims about how fast that
        happens it states in events (tokens generated meanwhile, requests answered), not in seconds:
        `hang_guard` only stops a test that would otherwise wait forever."""
        t0 = time.monotonic()
        while self.metric("minfer_active_sequences") != 0 or self.metric("minfer_queued_sequences") != 0:
            assert time.monotonic() - t0 < hang_guard, f"sequences still active after {hang_guard} s"
            time.sleep(0.02)


def start_server(tmp: Path, *extra: str, model: Path | None = None) -> Server:
    log = tmp / "serve.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("MINFER_API_KEY", None)
    argv = [sys.executable, "-m", "minfer.cli", "serve", "--port", "0", "-np", str(N_SLOTS), "-c", str(N_CTX * N_SLOTS),
            "-t", "2", *extra]
    if model is not None:
        argv += ["-m", str(model)]
    f = log.open("w")
    proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=tmp)
    deadline = time.monotonic() + HANG_GUARD
    url = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"minfer serve exited with {proc.returncode}:\n{log.read_text()}")
        m = re.search(r"on (http://127\.0\.0\.1:\d+)", log.read_text())
        if m:
            url = m.group(1)
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    return Server(url, proc, log)
            except httpx.HTTPError:
                pass
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"minfer serve did not become ready (url {url}):\n{log.read_text()}")


def stop_server(s: Server) -> None:
    s.proc.terminate()
    try:
        s.proc.wait(15)
    except subprocess.TimeoutExpired:
        s.proc.kill()
        s.proc.wait(5)


@pytest.fixture(scope="session")
def server(tmp_path_factory, smollm2_path):
    s = start_server(tmp_path_factory.mktemp("serve"), model=smollm2_path)
    yield s
    stop_server(s)
    assert s.proc.returncode in (0, -15), s.log.read_text()  # uvicorn re-raises SIGTERM after a clean shutdown


@pytest.fixture(scope="session")
def keyed_server(tmp_path_factory, smollm2_path):
    s = start_server(tmp_path_factory.mktemp("serve-key"), "--api-key", "sekrit-key", "-np", "1", model=smollm2_path)
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def model_id(server) -> str:
    return httpx.get(server.url + "/v1/models").json()["data"][0]["id"]


@pytest.fixture
def client(server):
    from openai import OpenAI

    with OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=HANG_GUARD) as c:
        yield c
