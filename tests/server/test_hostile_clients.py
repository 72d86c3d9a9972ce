"""What a schema cannot express: clients that misbehave at the connection, on raw sockets against a
real `minfer serve` (the tiny model, 4 slots, a 5 s --read-timeout). Each case is bounded in time
and ends by checking that the server still answers (/health and a completion, quickly), that no
slot is held and that nothing was a 5xx:
- a body that is valid JSON but 50 MB: refused from its Content-Length before a byte is read, and,
  sent chunked with no length, as soon as the limit (4 MB) has arrived; the server's memory does not
  grow by the body;
- a slow client that sends one byte a second: its headers, or its body, cut off at the read timeout
  with a 408 (OpenAI's error JSON) while other clients are served;
- a stream left unread: the client asks for 400 tokens and reads nothing; others are served and
  the slot is freed when the generation ends;
- 1,000 connections opened and dropped (silent, mid-head, mid-body, mid-stream, reset).
"""

from __future__ import annotations

import json
import re
import select
import socket
import struct
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from .conftest import start_server, stop_server

READ_TIMEOUT_S = 5  # long enough for a 4-token answer to come back while the trickles are still held


@pytest.fixture(scope="module")
def srv(tmp_path_factory, tiny_gguf):
    s = start_server(tmp_path_factory.mktemp("hostile-serve"), "-np", "4", "-c", "2048", "-t", "1",
                     "--read-timeout", str(READ_TIMEOUT_S), model=tiny_gguf("tiny-llama", "q8_0"))
    yield s
    stop_server(s)
    assert s.proc.returncode in (0, -15), s.log.read_text()


# ---------------------------------------------------------------------- helpers
def connect(srv) -> socket.socket:
    u = urlparse(srv.url)
    return socket.create_connection((u.hostname, u.port), timeout=30)


def head(srv, path: str, *, length: int | None = None, chunked: bool = False) -> bytes:
    host = urlparse(srv.url).netloc
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_answer(s: socket.socket, timeout: float) -> tuple[int, dict]:
    """The status and JSON body of one response (Content-Length framed), within `timeout` seconds."""
    s.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        got = s.recv(65536)
        assert got, f"connection closed before an answer: {data!r}"
        data += got
    top, rest = data.split(b"\r\n\r\n", 1)
    status = int(top.split()[1])
    n = int(re.search(rb"(?im)^content-length:\s*(\d+)", top).group(1))
    while len(rest) < n:
        got = s.recv(65536)
        assert got, "connection closed inside the answer"
        rest += got
    return status, json.loads(rest[:n])


def rss_mb(pid: int) -> float:
    return int(re.search(r"^VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M).group(1)) / 1024


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def assert_openai_error(status: int, body: dict, expected: int, words: str) -> None:
    assert status == expected, (status, body)
    assert set(body["error"]) == {"message", "type", "param", "code"} and words in body["error"]["message"], body


def assert_still_serves(srv) -> None:
    """/health and a 4-token completion answered (60 s each: a hang guard, not a speed bound)."""
    assert httpx.get(srv.url + "/health", timeout=60).status_code == 200
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 4, "temperature": 0},
                   timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text


def assert_no_5xx(srv) -> None:
    text = httpx.get(srv.url + "/metrics", timeout=10).text
    assert 'status="5' not in text, [ln for ln in text.splitlines() if 'status="5' in ln]


# ---------------------------------------------------------------------- cases
def test_50mb_valid_json_body(srv):
    body = b'{"prompt": "' + b"a" * (50 << 20) + b'", "max_tokens": 1}'
    json.loads(body)  # valid JSON indeed
    rss0 = rss_mb(srv.proc.pid)
    with connect(srv) as s:  # declared: refused on its Content-Length, before a byte of it is sent
        s.sendall(head(srv, "/v1/completions", length=len(body)))
        assert_openai_error(*read_answer(s, 30), 413, "over the limit")
    with connect(srv) as s:  # chunked, no length: refused once 4 MB have arrived, not 50
        s.sendall(head(srv, "/v1/completions", chunked=True))
        s.settimeout(30)
        sent, step = 0, 1 << 20
        while sent < len(body):
            piece = body[sent:sent + step]
            try:
                s.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
            except OSError:  # (the server answered and closed while we were still sending)
                break
            sent += len(piece)
            if select.select([s], [], [], 0)[0]:
                break
        assert sent < 25 << 20, f"the server took {sent >> 20} MB before answering"
        assert_openai_error(*read_answer(s, 30), 413, "over the limit")
    assert rss_mb(srv.proc.pid) - rss0 < 40, (rss0, rss_mb(srv.proc.pid))  # it never held the 50 MB
    assert_still_serves(srv)
    assert_no_5xx(srv)


def test_slow_client_one_byte_a_second(srv):
    """Two clients trickle one byte a second, one its headers, one its body after whole headers:
    a third client is served while both still hold their connections, and both are cut off with a
    408 at the read timeout (counted in the bytes they had sent: about one a second, not all)."""
    req = json.dumps({"prompt": "hello", "max_tokens": 2}).encode()
    results: dict[str, tuple] = {}
    trickling = {name: threading.Event() for name in ("head", "body")}

    def trickle(name: str, prefix: bytes, rest: bytes) -> None:
        with connect(srv) as s:
            t0 = time.monotonic()
            s.sendall(prefix)
            sent = 0
            for b in rest:
                try:
                    s.sendall(bytes([b]))
                except OSError:
                    break
                sent += 1
                trickling[name].set()
                if select.select([s], [], [], 1.0)[0]:  # an answer (or a close) came: stop sending
                    break
            try:
                results[name] = (*read_answer(s, 30), sent, len(rest), time.monotonic() - t0)
            except (AssertionError, OSError) as e:
                results[name] = (None, repr(e), sent, len(rest), time.monotonic() - t0)

    full = head(srv, "/v1/completions", length=len(req)) + req
    threads = [threading.Thread(target=trickle, args=("head", b"", full)),
               threading.Thread(target=trickle, args=("body", head(srv, "/v1/completions", length=len(req)), req))]
    for t in threads:
        t.start()
    for e in trickling.values():
        assert e.wait(30)
    assert_still_serves(srv)
    still_open = [t.is_alive() for t in threads]  # (both trickles were answered only after this one)
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    assert still_open == [True, True], (still_open, results)
    for name, words in (("head", "headers did not arrive"), ("body", "body did not arrive")):
        status, body, sent, total, took = results[name]
        assert_openai_error(status, body, 408, words)
        assert 2 <= sent < total, (name, sent, total)  # it trickled a while, and was cut before its end
        assert took >= READ_TIMEOUT_S - 0.5, (name, took)  # (a timer: it cannot fire early, on any machine)
    assert_still_serves(srv)
    assert_no_5xx(srv)


def test_stream_left_unread(srv):
    """A stream of 400 tokens that the client never reads: the others are served meanwhile, the
    slot is free once the generation ends, and dropping the connection leaves nothing behind."""
    req = json.dumps({"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True,
                      "temperature": 0.8}).encode()
    before = srv.metric("minfer_generation_tokens_total")
    s = connect(srv)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the server's writes back up
    s.sendall(head(srv, "/v1/completions", length=len(req)) + req)
    try:
        time.sleep(0.5)
        assert_still_serves(srv)
        deadline = time.monotonic() + 120
        while srv.metric("minfer_active_sequences") > 0:  # the unread request finishes in the engine
            assert time.monotonic() < deadline, "the unread stream still holds its slot after 120 s"
            time.sleep(0.2)
        assert srv.metric("minfer_generation_tokens_total") - before >= 400
        assert_still_serves(srv)
    finally:
        s.close()
    srv.wait_idle()
    assert_still_serves(srv)
    assert_no_5xx(srv)


def test_1000_connections_opened_and_dropped(srv):
    """1,000 connections in waves of 250, dropped five ways: at once, after part of a head, after a
    head and part of a body, in the middle of a stream they asked for, and with a reset (RST). The
    server's open files return to where they were, no slot is held, and it still answers."""
    req = json.dumps({"prompt": "hello there", "max_tokens": 64, "stream": True}).encode()
    whole = head(srv, "/v1/completions", length=len(req)) + req
    fds0 = open_fds(srv.proc.pid)
    for wave in range(4):
        socks = []
        for i in range(250):
            s = connect(srv)
            how = (wave * 250 + i) % 5
            if how == 1:
                s.sendall(whole[:20])
            elif how == 2:
                s.sendall(whole[:-5])
            elif how == 3:
                s.sendall(whole)
            elif how == 4:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() sends RST
            socks.append(s)
        time.sleep(0.5)  # some streams have started
        for s in socks:
            s.close()
    deadline = time.monotonic() + 60  # (a hang guard)
    while open_fds(srv.proc.pid) > fds0 + 5:  # every dropped connection's socket closed by the server
        assert time.monotonic() < deadline, (fds0, open_fds(srv.proc.pid))
        time.sleep(0.2)
    srv.wait_idle()  # the dropped streams' jobs cancelled, their slots free
    assert_still_serves(srv)
    assert_no_5xx(srv)
