"""The command line as a user runs it: `run_cli(argv, stdin=None) -> (exit code, stdout, stderr)`."""

from __future__ import annotations

import io
import json
import urllib.parse

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


@pytest.fixture
def rendered_prompts(monkeypatch) -> list[str]:
    """Every chat prompt the model is asked, as its chat template rendered it (Model.chat_tokens spied)."""
    import minfer.api

    seen: list[str] = []
    real = minfer.api.Model.chat_tokens

    def spy(self, messages, add_generation_prompt=True):
        seen.append(self.tokenizer.apply_chat_template(messages, add_generation_prompt))
        return real(self, messages, add_generation_prompt)

    monkeypatch.setattr(minfer.api.Model, "chat_tokens", spy)
    return seen


def chat_reference(path, turns: list[str], n: int, **sampling) -> list[str]:
    """What Model.generate replies, greedy, to each user turn of a conversation (the earlier
    replies kept in it): the reference a chat command's output is compared with."""
    from minfer.api import load

    replies, msgs = [], []
    with load(path, progress=False) as m:
        for text in turns:
            msgs.append({"role": "user", "content": text})
            replies.append(m.generate(msgs, max_tokens=n, temperature=0, **sampling))
            msgs.append({"role": "assistant", "content": replies[-1]})
    return replies


class StandInHub:
    """A stand-in for the Hugging Face Hub on 127.0.0.1 (HF_ENDPOINT points huggingface_hub at
    it): the endpoints huggingface_hub calls to list a repository and download a file, with the
    Hub's headers and habits — the file list (/api/models/R/tree/REV), resolve answering HEAD and
    GET with a redirect to a content host of its own (127.0.0.2, as the Hub's CDN: X-Repo-Commit,
    X-Linked-Etag, X-Linked-Size on the redirect), ranges (206), and X-Error-Code on a 404;
    /files/NAME serves a file at a plain URL. `cut_next` makes the next content GET stop halfway
    (the connection drops), to test resumed downloads. Every request is logged in `requests`."""

    def __init__(self, repos: dict[str, dict[str, bytes]]):
        import hashlib
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.repos = repos
        self.requests: list[tuple[str, str, str | None]] = []
        self.cut_next = False
        blobs = {hashlib.sha256(b).hexdigest(): b for files in repos.values() for b in files.values()}
        commit = {r: hashlib.sha1(r.encode()).hexdigest() for r in repos}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, code, body=b"", headers=()):
                self.send_response(code)
                for k, v in headers:
                    self.send_header(k, v)
                if not any(k == "Content-Length" for k, _ in headers):
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _json(self, obj):
                self._send(200, json.dumps(obj).encode(), [("Content-Type", "application/json")])

            def _missing(self, code):
                self._send(404, b'{"error": "not found"}',
                           [("Content-Type", "application/json"), ("X-Error-Code", code)])

            def do_HEAD(self):
                self.do_GET()

            def do_GET(self):
                path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
                hub.requests.append((self.command, path, self.headers.get("Range")))
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "models"] and len(parts) >= 4:
                    repo = "/".join(parts[2:4])
                    if repo not in hub.repos:
                        return self._missing("RepoNotFound")
                    files = hub.repos[repo]
                    if len(parts) >= 5 and parts[4] == "tree":
                        return self._json([{"type": "file", "oid": hashlib.sha1(b).hexdigest(), "size": len(b),
                                            "path": f} for f, b in sorted(files.items())])
                    return self._json({"id": repo, "modelId": repo, "sha": commit[repo], "private": False,
                                       "siblings": [{"rfilename": f} for f in sorted(files)]})
                if len(parts) >= 5 and parts[2] == "resolve":
                    repo, name = "/".join(parts[:2]), "/".join(parts[4:])
                    if repo not in hub.repos:
                        return self._missing("RepoNotFound")
                    if name not in hub.repos[repo]:
                        return self._missing("EntryNotFound")
                    body = hub.repos[repo][name]
                    sha = hashlib.sha256(body).hexdigest()
                    return self._send(302, headers=[
                        ("Location", f"{hub.cdn_url}/cdn/{sha}"), ("X-Repo-Commit", commit[repo]),
                        ("X-Linked-Etag", f'"{sha}"'), ("X-Linked-Size", str(len(body))), ("ETag", '"redirect"'),
                        ("Content-Length", "0")])
                if parts[0] == "cdn" and len(parts) == 2 and parts[1] in blobs:
                    return self._content(blobs[parts[1]], parts[1])
                named = {f: b for files in hub.repos.values() for f, b in files.items()}
                if parts[0] == "files" and len(parts) == 2 and parts[1] in named:  # a plain URL of a file
                    body = named[parts[1]]
                    return self._content(body, hashlib.sha256(body).hexdigest())
                self._send(404, b"no such route")

            def _content(self, body: bytes, sha: str):
                start = 0
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    start = int(rng[6:].split("-")[0] or 0)
                part = body[start:]
                headers = [("Accept-Ranges", "bytes"), ("ETag", f'"{sha}"'), ("Content-Length", str(len(part))),
                           ("Content-Type", "application/octet-stream")]
                if start:
                    headers.append(("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}"))
                if self.command == "GET" and hub.cut_next:
                    hub.cut_next = False
                    self.send_response(206 if start else 200)
                    for k, v in headers:
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(part[: len(part) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self._send(206 if start else 200, part, headers)

        self.servers = [ThreadingHTTPServer((host, 0), Handler) for host in ("127.0.0.1", "127.0.0.2")]
        self.url, self.cdn_url = (f"http://{s.server_address[0]}:{s.server_address[1]}" for s in self.servers)
        for s in self.servers:
            threading.Thread(target=s.serve_forever, daemon=True).start()

    def stop(self) -> None:
        for s in self.servers:
            s.shutdown()
            s.server_close()


@pytest.fixture
def stand_in_hub(request):
    """stand_in_hub(repos) -> a running StandInHub serving {repo: {file: bytes}}; stopped after the test."""
    hubs = []

    def start(repos):
        hubs.append(StandInHub(repos))
        return hubs[-1]

    yield start
    for h in hubs:
        try:
            h.stop()
        except OSError:
            pass
