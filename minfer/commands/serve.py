"""`minfer serve`: the OpenAI-compatible HTTP server (docs/SERVER.md).

    minfer serve [-m MODEL] [--host 127.0.0.1] [--port 8080] [-np/--parallel N] [-c/--ctx-size C]
                 [--device cpu|cuda] [--tp N] [--api-key KEY] [--max-body-mb 4] [--read-timeout 30]

It binds the socket first (so --port 0 picks a free port, printed on stderr), then loads the
model in the engine's own process (server/process.py; `--no-engine-process`: a thread of this
one) while /health says "loading". With --tp N the engine's process is rank 0: it starts the
other ranks and drives them (engine/tp.py); under torchrun the ranks other than 0 only follow.
"""

from __future__ import annotations

import argparse
import socket
import sys

from ..config import env
from ..errors import MinferError
from . import common

MAX_BODY_MB = 4
READ_TIMEOUT_S = 30.0


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (chat page at /)",
                       description="Serve /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics "
                                   "and a chat page at /, on the scheduler (every request is a sequence in "
                                   "the running batch).")
    common.add_model_args(p, slots=True)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 = a free port)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1/* and /metrics (default: $MINFER_API_KEY "
                        "if set, else no key)")
    p.add_argument("--alias", default=None, help="model id clients use (default: the file name without .gguf)")
    p.add_argument("--max-pending", type=int, default=1024,
                   help="requests admitted at once, running + waiting; beyond it a 503 (default 1024)")
    p.add_argument("--no-engine-process", dest="engine_process", action="store_false",
                   help="run the engine in a thread of the server's process instead of a child process of its "
                        "own (one interpreter lock for HTTP and engine: slower under load; for debugging)")
    p.add_argument("--max-body-mb", type=int, default=MAX_BODY_MB,
                   help=f"largest request body in MiB; beyond it a 413 (default {MAX_BODY_MB})")
    p.add_argument("--read-timeout", type=float, default=READ_TIMEOUT_S,
                   help=f"seconds a client has to send a request's headers, and again its body; beyond it a 408 "
                        f"and the connection is closed (default {READ_TIMEOUT_S:g})")
    p.set_defaults(func=serve)


def serve(a: argparse.Namespace) -> int:
    if not 0 <= a.port <= 65535:
        raise MinferError(f"--port must be in 0..65535, got {a.port}")
    if a.max_pending < 1 or a.max_body_mb < 1:
        raise MinferError("--max-pending and --max-body-mb must be >= 1")
    if not 0 < a.read_timeout <= 3600:
        raise MinferError(f"--read-timeout must be in (0, 3600] seconds, got {a.read_timeout}")
    config = common.engine_config(a)
    if common.follower(a, config):  # torchrun's ranks other than 0: rank 0 serves
        return 0
    from pathlib import Path

    from ..default_model import default_model_path

    path = Path(a.model) if a.model is not None else default_model_path()
    if not path.is_file():
        raise MinferError(f"-m/--model {path}: no such file")
    model_id = a.alias or path.name.removesuffix(".gguf")
    api_key = a.api_key if a.api_key is not None else env("MINFER_API_KEY", "") or None
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in a.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((a.host, a.port))
    except OSError as e:
        raise MinferError(f"cannot listen on {a.host}:{a.port}: {e.strerror or e}") from None

    import uvicorn

    from ..server.app import create_app
    from ..server.http import head_deadline_protocol
    from ..server.loop import EngineThread
    from ..server.metrics import Metrics
    from ..server.process import EngineProcess, LoadSpec

    a.model = path

    server: uvicorn.Server | None = None

    def load_failed(e: BaseException) -> None:
        if server is not None:
            server.should_exit = True

    metrics = Metrics()
    if a.engine_process:
        spec_args = argparse.Namespace(**{k: v for k, v in vars(a).items() if k != "func"})
        spec = LoadSpec(common.load_model, spec_args, config, path)
        engine = EngineProcess(spec, metrics, on_load_error=load_failed)
    else:
        engine = EngineThread(lambda: common.load_model(a, config), metrics, on_load_error=load_failed)
    app = create_app(engine, model_id=model_id, metrics=metrics, api_key=api_key,
                     max_body=a.max_body_mb << 20, max_pending=a.max_pending, read_timeout_s=a.read_timeout)
    server = uvicorn.Server(uvicorn.Config(app, http=head_deadline_protocol(a.read_timeout), log_level="warning",
                                           access_log=False, timeout_graceful_shutdown=2))
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"minfer: serving {model_id} on http://{shown}:{port} (loading the model; /health says when ready)",
          file=sys.stderr, flush=True)
    engine.start()
    try:
        server.run(sockets=[sock])
    finally:
        engine.stop()
        sock.close()
    if engine.load_error is not None:
        e = engine.load_error
        raise e if isinstance(e, MinferError) else MinferError(f"loading the model failed: {e}")
    return 0
