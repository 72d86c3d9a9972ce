"""A local-only HTTP server for the trace viewer: the static page in viz/ plus one trace file.

It binds 127.0.0.1 only and serves a fixed set of paths (the page's three files and /trace.json);
everything else is 404, so nothing else on disk is reachable. A request whose Host header is not
this server's own address (127.0.0.1 or localhost, with its port) is refused (403): a page from
another site that rebinds its DNS name to 127.0.0.1 cannot read the trace (prompts and outputs)
through the browser. The trace is re-read on each request,
so re-recording the same path and reloading the page shows the new run.
"""

from __future__ import annotations

import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import MinferError
from .format import load_trace

VIZ_DIR = Path(__file__).resolve().parent / "viz"
HOST = "127.0.0.1"
TRACE_ROUTE = "/trace.json"
_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}


def _handler(trace_path: Path) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "minfer-trace"

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self._serve(send_body=True)

        def do_HEAD(self) -> None:  # noqa: N802
            self._serve(send_body=False)

        def _serve(self, send_body: bool) -> None:
            host = (self.headers.get("Host") or "").strip().lower()
            port = self.server.server_address[1]
            if host not in {f"127.0.0.1:{port}", f"localhost:{port}"}:
                self.send_error(HTTPStatus.FORBIDDEN, "this server answers only to 127.0.0.1 and localhost")
                return
            route = urlsplit(self.path).path
            if route == TRACE_ROUTE:
                source, ctype = trace_path, "application/json"
            elif route in _STATIC:
                name, ctype = _STATIC[route]
                source = VIZ_DIR / name
            else:
                self.send_error(HTTPStatus.NOT_FOUND, "not found")
                return
            try:
                body = source.read_bytes()
            except OSError:
                self.send_error(HTTPStatus.NOT_FOUND, f"{source.name} is gone")
                return
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            if send_body:
                self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # quiet: the CLI prints the URL once
            pass

    return Handler


class TraceServer:
    """Serves the viewer and one trace on 127.0.0.1:`port` (0 picks a free port) from a thread."""

    def __init__(self, trace_path: str | Path, port: int = 0):
        self.trace_path = Path(trace_path)
        load_trace(self.trace_path)  # fail now, with the reason, rather than in the browser
        try:
            self.httpd = ThreadingHTTPServer((HOST, port), _handler(self.trace_path))
        except OSError as e:
            raise MinferError(f"cannot listen on {HOST}:{port}: {e.strerror or e} (try --port 0)") from None
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def url(self) -> str:
        """The page's address with the trace preloaded."""
        return f"http://{HOST}:{self.port}/?trace={TRACE_ROUTE.lstrip('/')}"

    def start(self) -> TraceServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="minfer-trace-view", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:  # shutdown() waits for serve_forever(), so only after start()
            self.httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.httpd.server_close()

    def __enter__(self) -> TraceServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
