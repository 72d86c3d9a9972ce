"""`minfer trace view` server (127.0.0.1 only, fixed routes) and the `trace` CLI subcommands."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from minfer.commands.trace import add_parser as add_trace_parser
from minfer.errors import MinferError
from minfer.trace.format import load_trace
from minfer.trace.server import VIZ_DIR, TraceServer


def _get(url, method="GET", host=None):
    req = urllib.request.Request(url, method=method, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("Content-Type"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), b""


def test_serves_page_and_trace_only(demo_trace):
    path = demo_trace[0]
    with TraceServer(path) as srv:
        base = f"http://127.0.0.1:{srv.port}"
        assert srv.httpd.server_address[0] == "127.0.0.1"
        assert srv.url == f"{base}/?trace=trace.json"
        status, ctype, body = _get(srv.url)
        assert status == 200 and ctype.startswith("text/html") and b'src="app.js"' in body
        assert _get(base + "/app.js")[2] == (VIZ_DIR / "app.js").read_bytes()
        assert _get(base + "/style.css")[1].startswith("text/css")
        status, ctype, body = _get(base + "/trace.json")
        assert (status, ctype, body) == (200, "application/json", path.read_bytes())
        assert _get(base + "/trace.json", "HEAD")[:2] == (200, "application/json")
        for bad in ("/../../etc/passwd", "/viz/app.js", "/favicon.ico", "/%2e%2e/pyproject.toml", "/trace.json/x"):
            assert _get(base + bad)[0] == 404, bad


def test_only_its_own_host_names_are_answered(demo_trace):
    """DNS rebinding: a page on evil.example whose name now points at 127.0.0.1 sends Host:
    evil.example; the server answers 403 to that and to a wrong port, 200 to its own names."""
    with TraceServer(demo_trace[0]) as srv:
        url = f"http://127.0.0.1:{srv.port}/trace.json"
        assert _get(url)[0] == 200
        assert _get(url, host=f"localhost:{srv.port}")[0] == 200
        for host in ("evil.example", f"evil.example:{srv.port}", f"127.0.0.1:{srv.port + 1}", "127.0.0.1",
                     f"127.0.0.1.evil.example:{srv.port}"):
            assert _get(url, host=host)[0] == 403, host
            assert _get(url.replace("/trace.json", "/"), host=host)[0] == 403, host


def test_the_view_command_picks_a_free_port_by_default():
    parser = argparse.ArgumentParser()
    add_trace_parser(parser.add_subparsers())
    assert parser.parse_args(["trace", "view", "t.json"]).port == 0


def test_rejects_bad_trace_and_busy_port(tmp_path, demo_trace):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(MinferError, match="not a minfer trace"):
        TraceServer(bad)
    with pytest.raises(MinferError, match="cannot read"):
        TraceServer(tmp_path / "missing.json")
    with TraceServer(demo_trace[0]) as srv:
        with pytest.raises(MinferError, match="cannot listen"):
            TraceServer(demo_trace[0], port=srv.port)


_CLI = "import sys; from minfer.cli import main; sys.exit(main(sys.argv[1:]))"


def test_trace_view_command_serves_until_stopped(demo_trace):
    argv = [sys.executable, "-c", _CLI, "trace", "view", str(demo_trace[0]), "--port", "0"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        line = proc.stdout.readline()
        try:
            assert "http://127.0.0.1:" in line, f"no URL printed: {line!r}"
            url = line.split()[3]
            status, _, body = _get(url.replace("/?trace=trace.json", "/trace.json"))
            assert status == 200 and json.loads(body)["format"] == "minfer-trace"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def test_trace_demo_command_and_arg_checks(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_trace_parser(parser.add_subparsers())
    out = tmp_path / "d.json"
    args = parser.parse_args(["trace", "demo", str(out), "--preset", "tiny-qwen2", "--quant", "q8_0", "--tokens", "3"])
    assert args.func(args) == 0
    doc = load_trace(out)
    assert [s["kind"] for s in doc["steps"]] == ["prefill", "decode", "decode"]
    assert doc["model"]["arch"] == "qwen2" and any(n["name"] == "blk.0.attn_q+k+v" for n in doc["graph"])
    assert "minfer trace view" in capsys.readouterr().out
    for argv in (["trace", "view", "x.json", "--port", "70000"], ["trace", "demo", "x.json", "--tokens", "0"],
                 ["trace"]):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
