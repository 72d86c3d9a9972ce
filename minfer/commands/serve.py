"""`minfer serve`: the OpenAI-compatible HTTP server (docs/SERVER.md).

    minfer serve [-m MODEL | -hf REPO[:QUANT]] [--host 127.0.0.1] [--port 8080] [-np/--parallel N]
                 [-c/--ctx-size C] [--device cpu|cuda] [--tp N] [--api-key KEY] [--alias NAME]
                 [sampling defaults: -n, --temp, --top-k, ...] [--chat-template NAME|FILE] [-v]
                 [--max-body-mb 4] [--read-timeout 30] [--pooling mean|cls|last]

`-c` is the total context, split over the `-np` slots, as llama-server's is.

It binds the socket first (so --port 0 picks a free port, printed on stderr), then loads the
model in the engine's own process (server/process.py; `--no-engine-process`: a thread of this
one) while /health says "loading". With --tp N the engine's process is rank 0: it starts the
other ranks and drives them (engine/tp.py); under torchrun the ranks other than 0 only follow.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..config import env, parse_duration
from ..errors import MinferError
from . import common

MAX_BODY_MB = 4
READ_TIMEOUT_S = 30.0
DEFAULT_SLOTS = 4  # -c without -np is split over this many (llama-server's default)


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (chat page at /)",
                       description="Serve /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models, /health, "
                                   "/metrics and a chat page at /, on the scheduler (every request is a sequence in "
                                   "the running batch).")
    common.add_model_args(p, slots=True, ctx_help="total context in tokens, split evenly over the -np slots as "
                          f"llama-server's -c is (without -np: over {DEFAULT_SLOTS}) (default: each slot gets "
                          "min(training context, 4096))")
    common.add_sampling_args(p, n_predict=-1, defaults_of="the server's defaults: what a request's absent fields "
                             "take (/props shows them)")
    common.add_chat_args(p, system=False)
    p.add_argument("--no-access-log", dest="access_log", action="store_false",
                   help="do not log each request (uvicorn's access log, on stderr)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 = a free port)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1/* and /metrics (default: $MINFER_API_KEY "
                        "if set, else no key)")
    p.add_argument("-a", "--alias", default=None,
                   help="the model's name in /v1/models and in answers (default: the file name without .gguf); "
                        "requests may name any model: one is served")
    p.add_argument("--pooling", choices=("mean", "cls", "last"), default=None,
                   help="how /v1/embeddings pools a text's hidden states (default: the file's pooling type, "
                        "else mean)")
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
    # a resident process of `minfer run` (commands/resident.py): exit after this long idle; its state file
    p.add_argument("--keep-alive", default=None, help=argparse.SUPPRESS)
    p.add_argument("--state-file", type=Path, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=serve)


def serve(a: argparse.Namespace) -> int:
    import logging  # (here: the other commands' start does not pay for them)
    import socket

    if not 0 <= a.port <= 65535:
        raise MinferError(f"--port must be in 0..65535, got {a.port}")
    if a.max_pending < 1 or a.max_body_mb < 1:
        raise MinferError("--max-pending and --max-body-mb must be >= 1")
    if not 0 < a.read_timeout <= 3600:
        raise MinferError(f"--read-timeout must be in (0, 3600] seconds, got {a.read_timeout}")
    if a.api_key is not None and not a.api_key.strip():  # `--api-key "$KEY"`, KEY unset: no key would be required
        raise MinferError("--api-key is empty: give the key requests must carry, or leave the flag out for none")
    keep_alive_s = None if a.keep_alive is None else parse_duration(a.keep_alive, "--keep-alive")
    defaults = common.sampling(a)
    total_ctx = a.ctx
    if total_ctx is not None:
        slots = a.parallel or DEFAULT_SLOTS
        if total_ctx < slots:
            raise MinferError(f"-c/--ctx-size {total_ctx} is the total context: it must give each of the {slots} "
                              "slots (-np) at least one token")
        a.ctx, a.parallel = total_ctx // slots, slots
    config = common.engine_config(a)
    template = common.read_template(a.chat_template)
    if common.follower(a, config):  # torchrun's ranks other than 0: rank 0 serves
        return 0
    path = common.model_path(a)
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
    from ..server.keepalive import IdleClock
    from ..server.loop import EngineThread
    from ..server.metrics import Metrics
    from ..server.process import EngineProcess, LoadSpec
    from . import resident

    server: uvicorn.Server | None = None

    def load_failed(e: BaseException) -> None:
        if server is not None:
            server.should_exit = True

    metrics = Metrics()
    clock = IdleClock() if keep_alive_s is not None else None
    if a.engine_process:
        spec_args = argparse.Namespace(**{k: v for k, v in vars(a).items() if k != "func"})
        spec = LoadSpec(common.load_model, spec_args, config, path, chat_template=template)
        engine = EngineProcess(spec, metrics, on_load_error=load_failed)
    else:
        engine = EngineThread(lambda: common.load_model(a, config, chat_template=template), metrics,
                              on_load_error=load_failed)
    app = create_app(engine, model_id=model_id, metrics=metrics, api_key=api_key,
                     max_body=a.max_body_mb << 20, max_pending=a.max_pending, read_timeout_s=a.read_timeout,
                     defaults=defaults, model_path=str(path), pooling=a.pooling, clock=clock)
    if a.verbose:  # one line a request (its prompt tokens and sampling settings), uvicorn's debug lines
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:    %(message)s"))
        log = logging.getLogger("minfer.server")
        log.addHandler(handler)
        log.setLevel(logging.DEBUG)
    server = uvicorn.Server(uvicorn.Config(app, http=head_deadline_protocol(a.read_timeout),
                                           log_level="debug" if a.verbose else "info", access_log=a.access_log,
                                           timeout_graceful_shutdown=2))
    host, port = sock.getsockname()[:2]
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    print(f"minfer: serving {model_id} on {url} (loading the model; /health says when ready)",
          file=sys.stderr, flush=True)
    engine.start()
    announce_ready(engine, url)
    if clock is not None or a.state_file is not None:
        when_serving(engine, server, url, clock, keep_alive_s, a.state_file)
    try:
        server.run(sockets=[sock])
    finally:
        engine.stop()
        sock.close()
        if a.state_file is not None:
            resident.remove_state(a.state_file)
    if engine.load_error is not None:
        e = engine.load_error
        raise e if isinstance(e, MinferError) else MinferError(f"loading the model failed: {e}")
    return 0


def when_serving(engine, server, url: str, clock, keep_alive_s: float | None, state_file: Path | None) -> None:
    """A resident process of `minfer run` (commands/resident.py), once the model is loaded and
    uvicorn accepts connections: its address into its state file, and the keep-alive's clock
    started (it exits after keep_alive_s without a request in flight, its state file removed
    first: no new run finds a process on its way out)."""
    import threading
    import time

    from . import resident

    def idle() -> None:
        print(f"minfer: idle for {resident.format_duration(keep_alive_s)}: exiting", file=sys.stderr, flush=True)
        if state_file is not None:
            resident.remove_state(state_file)
        server.should_exit = True

    def wait() -> None:
        engine.ready.wait()
        while not server.started and not server.should_exit:
            time.sleep(0.01)
        if engine.state != "ok" or not server.started:
            return
        if clock is not None:
            clock.reset()
            clock.watch(keep_alive_s, idle)
        if state_file is not None:
            resident.mark_ready(state_file, url)

    threading.Thread(target=wait, name="minfer-serving", daemon=True).start()


def announce_ready(engine, url: str) -> None:
    """Print one line when the model is loaded and the server answers: the URL to open."""
    import threading

    def wait() -> None:
        engine.ready.wait()
        if engine.state == "ok":
            m = engine.model
            print(f"minfer: ready: {url} (chat page at /, OpenAI API at {url}/v1; {m.n_slots} slots of "
                  f"{m.n_ctx} tokens)", file=sys.stderr, flush=True)

    threading.Thread(target=wait, name="minfer-ready", daemon=True).start()
