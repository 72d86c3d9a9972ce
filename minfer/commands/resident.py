"""`minfer run` through a resident model process, as Ollama keeps a model loaded between runs.

The first `minfer run` of a model starts `minfer serve` detached (its own session: the terminal's
Ctrl-C does not reach it) on 127.0.0.1, a free port, a random API key, one slot, the engine in a
thread of that one process, and `--keep-alive`: it exits once no request has been in flight for
that long (server/keepalive.py; default 5m, MINFER_KEEP_ALIVE, config.keep_alive). The run's
request, and every later run's with the same settings, goes to it over HTTP: a later run imports
no torch, numpy or HTTP library beyond the standard one, and loads nothing.

The state file, `MINFER_CACHE/resident/KEY.json` (the directory 0700, the file 0600: it holds the
key), says what a process serves and where: KEY hashes every setting that changes the numbers
(the model file's path, size and mtime, the whole EngineConfig the run would load with: device,
context, threads, KV type, prefill chunk, every MINFER_* switch; the chat template's text). The
starting run writes it (status "loading", its pid, key and log file); the process adds its
address and "ready" when it answers, and removes it when it exits. A run with other settings
gets another KEY, so another process: several can be resident at once (each one's memory is
checked at its load, as any load's). A state file whose process is gone (no such pid, a zombie,
a pid now another program's) or refuses the connection is removed and a fresh process started;
a process that dies while loading is reported with the last line of its log
(`MINFER_CACHE/resident/KEY.log`). A lock per KEY makes concurrent first runs start one process.

A request is OpenAI's /v1/completions, streamed, with every sampling flag given and
`cache_prompt: false` (no reuse of an earlier request's prompt prefix: the whole prompt runs, as in
a fresh process), so a seed gives the tokens the in-process run gives; the stats line is printed
from the answer's usage and llama-server's `timings`. Ctrl-C closes the connection: the server
aborts the request (its disconnect path) and stays resident.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..config import EngineConfig, cache_dir, child_env
from ..engine.stats import GenerationStats
from ..errors import MinferError

STATE_FORMAT = 1  # bump when the state file's fields change meaning
CONNECT_TIMEOUT_S = 5.0
STOP_WAIT_S = 15.0  # `minfer stop`: how long a process has to exit after SIGTERM before SIGKILL
KILL_WAIT_S = 5.0  # and after SIGKILL, how long its exit may take before stop reports failure


def state_dir(create: bool = False) -> Path:
    """MINFER_CACHE/resident (created 0700 when asked)."""
    d = cache_dir() / "resident"
    if create:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(d, 0o700)
    return d


def format_duration(seconds: float) -> str:
    """5m, 1h30m, 45s, forever."""
    if math.isinf(seconds):
        return "forever"
    s = round(seconds)
    if s < 60 or seconds != s:
        return f"{seconds:g}s"
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (sec, "s")) if v)


# ---------------------------------------------------------------------- the state files
@dataclass
class State:
    """One state file: a resident process (loading or ready)."""

    file: Path
    data: dict
    proc: subprocess.Popen | None = None  # the process, when this run started it (polled: reaped if it dies)

    @property
    def pid(self) -> int:
        return int(self.data["pid"])

    @property
    def ready(self) -> bool:
        return self.data.get("status") == "ready"

    @property
    def url(self) -> str:
        return self.data.get("url", "")

    def alive(self) -> bool:
        """The process is running, and is the one that state file names (not a zombie, not a
        reused pid: its command line names this state file, where /proc can tell)."""
        return process_alive(self.pid, str(self.file))

    def remove(self) -> None:
        """Remove the file if it still names this process."""
        with contextlib.suppress(OSError, ValueError, KeyError):
            if json.loads(self.file.read_text())["pid"] == self.pid:
                self.file.unlink()


def process_alive(pid: int, marker: str | None = None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: not ours
        return False
    proc = Path(f"/proc/{pid}")
    if not proc.exists():
        return True  # (no /proc: the pid is all there is to go by)
    try:
        if proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
        return marker is None or marker.encode() in proc.joinpath("cmdline").read_bytes()
    except OSError:
        return False


def read_state(file: Path) -> State | None:
    try:
        data = json.loads(file.read_text())
        if data.get("format") != STATE_FORMAT or not isinstance(data.get("pid"), int):
            return None
    except (OSError, ValueError):
        return None
    return State(file, data)


def all_states() -> list[State]:
    """Every state file's process still running; the files of those gone are removed."""
    d = state_dir()
    out = []
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        st = read_state(f)
        if st is None:
            continue
        if st.alive():
            out.append(st)
        else:
            st.remove()
    return out


def write_state(file: Path, data: dict) -> None:
    """Write a state file whole (a temporary file renamed over it), readable by its owner only."""
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, file)


def mark_ready(file: Path, url: str) -> None:
    """(The resident process, once it answers.) Its address into its state file."""
    st = read_state(file)
    if st is None or st.pid != os.getpid():
        return  # (the file names another process: it is not this one's to write)
    write_state(file, {**st.data, "status": "ready", "url": url, "ready_at": time.time()})


def remove_state(file: Path) -> None:
    """(The resident process, as it exits.) Its state file, if it still names this process."""
    st = read_state(file)
    if st is not None and st.pid == os.getpid():
        with contextlib.suppress(OSError):
            file.unlink()


def settings_key(path: Path, config: EngineConfig, template: str | None) -> tuple[str, dict]:
    """KEY of the settings a resident process must have loaded with: everything that changes the
    numbers (module docstring), and those settings as data (for `minfer ps`)."""
    st = path.stat()
    options = {"model": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
               "config": config.as_dict(),
               "chat_template": None if template is None else hashlib.sha256(template.encode()).hexdigest()}
    key = hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return f"{path.stem[:40]}-{key}", options


@contextlib.contextmanager
def key_lock(key: str):
    """One starter per KEY at a time (concurrent first runs start one process)."""
    import fcntl

    fd = os.open(state_dir(create=True) / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- HTTP
class Stale(Exception):
    """The process a state file names does not answer: start a fresh one."""


class Client:
    """http.client to one resident process, with its key."""

    def __init__(self, url: str, token: str):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.host, self.port, self.token = host, int(port), token

    def open(self, method: str, path: str, body: dict | None = None) -> tuple[http.client.HTTPConnection,
                                                                              http.client.HTTPResponse]:
        """Send a request; (connection, response). Stale when the process cannot be reached."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=CONNECT_TIMEOUT_S)
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.token}"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=data, headers=headers)
            conn.sock.settimeout(None)  # (a request may wait behind another run's; the server bounds its own work)
            return conn, conn.getresponse()
        except (ConnectionError, OSError, http.client.HTTPException) as e:
            conn.close()
            raise Stale(str(e)) from None

    def json(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        conn, resp = self.open(method, path, body)
        try:
            raw = resp.read()
        except (ConnectionError, OSError, http.client.HTTPException) as e:
            raise Stale(str(e)) from None
        finally:
            conn.close()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, {}


def error_message(body: dict, status: int) -> str:
    err = body.get("error") if isinstance(body, dict) else None
    return err.get("message", f"HTTP {status}") if isinstance(err, dict) else f"HTTP {status}"


# ---------------------------------------------------------------------- starting one
def serve_argv(a, path: Path, keep_alive_s: float, file: Path) -> list[str]:
    """`minfer serve` with the run's load settings (one slot, its context per slot)."""
    argv = [sys.executable, "-m", "minfer", "serve", "-m", str(path), "-np", "1", "--device", a.device,
            "--kv-cache", a.kv_cache, "--prefill-chunk", str(a.prefill_chunk), "--host", "127.0.0.1",
            "--port", "0", "--no-access-log", "--no-engine-process",
            "--keep-alive", "-1" if math.isinf(keep_alive_s) else repr(keep_alive_s), "--state-file", str(file)]
    if a.ctx is not None:
        argv += ["-c", str(a.ctx)]
    if a.threads is not None:
        argv += ["-t", str(a.threads)]
    if a.chat_template is not None:
        spec = a.chat_template
        argv += ["--chat-template", str(Path(spec).resolve()) if Path(spec).is_file() else spec]
    if getattr(a, "spec", "") or getattr(a, "model_draft", None):  # speculative decoding (engine/draft.py)
        argv += ["--spec", a.spec or "model", "--draft-max", str(a.draft_max), "--draft-ngram-max",
                 str(a.draft_ngram_max), "--draft-ngram-min", str(a.draft_ngram_min)]
        if a.model_draft:
            argv += ["-md", str(Path(a.model_draft).resolve())]
    return argv


def start(a, path: Path, key: str, options: dict, keep_alive_s: float) -> State:
    """Spawn the resident process for KEY (the caller holds key_lock) and write its "loading" state."""
    d = state_dir(create=True)
    file, log = d / f"{key}.json", d / f"{key}.log"
    token = secrets.token_urlsafe(32)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        proc = subprocess.Popen(serve_argv(a, path, keep_alive_s, file), stdin=subprocess.DEVNULL, stdout=fd,
                                stderr=fd, env=child_env(MINFER_API_KEY=token), start_new_session=True,
                                close_fds=True)
    finally:
        os.close(fd)
    data = {"format": STATE_FORMAT, "status": "loading", "pid": proc.pid, "token": token, "key": key,
            "model": options["model"], "options": options, "keep_alive_s": None if math.isinf(keep_alive_s)
            else keep_alive_s, "log": str(log), "started": time.time()}
    write_state(file, data)
    return State(file, data, proc)


def wait_ready(st: State) -> State:
    """Wait while the process loads; its "ready" state, or a MinferError with its log's last line."""
    proc = st.proc
    while True:
        now = read_state(st.file)
        if now is not None and now.pid == st.pid and now.ready:
            return now
        exited = proc.poll() is not None if proc is not None else not st.alive()
        if exited or now is None or now.pid != st.pid:
            st.remove()
            raise MinferError(f"the resident process for {Path(st.data['model']).name} ended while loading: "
                              f"{last_error(Path(st.data['log']))} (log: {st.data['log']})")
        time.sleep(0.02)


def last_error(log: Path) -> str:
    """The log's error line (`minfer: error: ...`), else its last line."""
    try:
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "no log"
    errors = [x for x in lines if x.startswith("minfer: error:")]
    line = (errors or lines or ["(empty log)"])[-1]
    return line.removeprefix("minfer: error: ")


def acquire(a, path: Path, config: EngineConfig, template: str | None, keep_alive_s: float) -> State:
    """A ready resident process for these settings: the running one, else a fresh one (said once
    on stderr, when it has loaded: a model it cannot load is the load's error alone). A state file
    whose process is gone is removed first."""
    key, options = settings_key(path, config, template)
    file = state_dir() / f"{key}.json"
    with key_lock(key):
        st = read_state(file)
        if st is not None and not st.alive():
            st.remove()
            st = None
        started = st is None
        if started:
            st = start(a, path, key, options, keep_alive_s)
    st = wait_ready(st)
    if started:
        how = "until `minfer stop`" if math.isinf(keep_alive_s) else f"for {format_duration(keep_alive_s)}"
        print(f"minfer: model kept loaded {how}; `minfer stop` to unload", file=sys.stderr, flush=True)
    return st


def drop(st: State) -> None:
    """A process that does not answer: end it (if it is still the one named) and remove its file."""
    if st.alive():
        with contextlib.suppress(OSError):
            os.kill(st.pid, signal.SIGTERM)
    st.remove()


def stop(st: State, wait_s: float = STOP_WAIT_S) -> bool:
    """SIGTERM the process (uvicorn's shutdown: the engine stops, the state file goes), SIGKILL
    after wait_s; True when it is gone. A pid whose command line does not name the state file is
    not signalled (a stale file; the pid may be someone else's now). Once the process is known to
    be ours, "gone" means the pid itself is gone or a zombie: an exiting process's command line
    reads empty before it has finished exiting, so the marker alone would call it gone early."""
    if not st.alive():
        st.remove()
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(st.pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while process_alive(st.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if process_alive(st.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(st.pid, signal.SIGKILL)
        deadline = time.monotonic() + KILL_WAIT_S
        while process_alive(st.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    st.remove()
    return not process_alive(st.pid)


# ---------------------------------------------------------------------- the run
def completion_body(prompt: str, params, max_tokens: int | None) -> dict:
    """The run's flags as a /v1/completions request (every sampling field given)."""
    body = {"prompt": prompt, "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
            "min_p": params.min_p, "repeat_penalty": params.repeat_penalty, "repeat_last_n": params.repeat_last_n,
            "frequency_penalty": params.frequency_penalty, "presence_penalty": params.presence_penalty,
            "ignore_eos": params.ignore_eos, "stream": True, "stream_options": {"include_usage": True},
            "cache_prompt": False}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    return body


def generate(client: Client, prompt: str, params) -> GenerationStats:
    """Stream one completion to stdout as the in-process run prints it; its stats. Stale when the
    process cannot be reached before anything is printed."""
    from .common import context_warning

    body = completion_body(prompt, params, params.max_tokens)
    conn, resp = client.open("POST", "/v1/completions", body)
    try:
        if resp.status == 400 and params.max_tokens is not None:
            err = json.loads(resp.read() or b"{}").get("error") or {}
            if err.get("code") != "context_length_exceeded" or err.get("param") != "max_tokens":
                raise MinferError(err.get("message", "HTTP 400"))
            conn.close()
            conn, resp = retry_within_context(client, prompt, params, body, context_warning)
        if resp.status != 200:
            raise MinferError(error_message(json.loads(resp.read() or b"{}"), resp.status))
        return read_stream(resp)
    finally:
        conn.close()


def retry_within_context(client: Client, prompt: str, params, body: dict, warn):
    """-n asks for more than the context leaves: say so as the in-process run does, and ask for
    what is left (the in-process run stops at the context's end: the same tokens)."""
    _, tok = client.json("POST", "/tokenize", {"content": prompt, "add_special": True, "parse_special": True})
    _, props = client.json("GET", "/props")
    n_prompt, n_ctx = len(tok.get("tokens", [])), props["default_generation_settings"]["n_ctx"]
    warn(params.max_tokens, n_ctx, n_prompt)
    body = dict(body)
    if n_ctx - n_prompt > 0:
        body["max_tokens"] = n_ctx - n_prompt
    else:
        body.pop("max_tokens")
    return client.open("POST", "/v1/completions", body)


def read_stream(resp: http.client.HTTPResponse) -> GenerationStats:
    """Write each chunk's text to stdout as it comes; the stats from the last chunks. A failure
    to write stdout (a closed pipe: `minfer run ... | head`) is raised as it is, as the
    in-process run raises it, not blamed on the resident process."""
    finish = usage = timings = None
    stdout_error = None
    try:
        for line in resp:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            obj = json.loads(data)
            if "error" in obj:
                raise MinferError(error_message(obj, 500))
            for choice in obj.get("choices") or ():
                if choice.get("text"):
                    try:
                        sys.stdout.write(choice["text"])
                        sys.stdout.flush()
                    except OSError as e:  # stdout's, not the connection's
                        stdout_error = e
                        break
                finish = choice.get("finish_reason") or finish
            if stdout_error is not None:
                break
            if obj.get("usage"):
                usage, timings = obj["usage"], obj.get("timings")
    except (ConnectionError, OSError, http.client.HTTPException) as e:
        raise MinferError(f"the resident process ended the request: {e}") from None
    if stdout_error is not None:
        raise stdout_error
    if usage is None or timings is None:
        raise MinferError("the resident process ended the request before its end (see `minfer ps`)")
    return GenerationStats.of_timings(usage, timings, finish)


def run(a, config: EngineConfig, params, prompt: str, template: str | None, keep_alive_s: float) -> bool:
    """`minfer run PROMPT` through a resident process; False when it cannot take the run (no
    such model file: the in-process path reports it as it always has; a --temp past what an HTTP
    request may ask, OpenAI's range: the in-process run takes any)."""
    from ..engine.params import MAX_REQUEST_TEMPERATURE
    from .common import model_path, print_stats

    path = model_path(a)
    if not path.is_file() or params.temperature > MAX_REQUEST_TEMPERATURE:
        return False
    for attempt in range(2):  # (a second try only after a process that did not answer)
        st = acquire(a, path, config, template, keep_alive_s)
        if a.verbose:
            print(f"minfer: resident process {st.pid} at {st.url} serves {path}", file=sys.stderr)
        try:
            stats = generate(Client(st.url, st.data["token"]), prompt, params)
        except Stale:
            drop(st)  # refused or reset before anything was printed: start a fresh one, once
            if attempt:
                raise MinferError(f"the resident process for {path.name} does not answer (log: {st.data['log']})")\
                    from None
            continue
        break
    sys.stdout.write("\n")
    print_stats(stats)
    return True
