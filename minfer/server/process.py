"""The engine loop in a child process: what `minfer serve` runs (vLLM's engine-core split).

The HTTP side (uvicorn's event loop: parsing, validation, tokenizing, JSON, SSE) and the
engine (the scheduler, the backend's launches, detokenizing) are both Python. In one process
they share one interpreter lock, and the engine waits for it behind the event loop: on the
H200 a 7B model served 1,542 tok/s through HTTP at 16 clients where the engine alone gives
2,432 (bench/NOTES.md). Here the child process owns the model and runs the serving loop
(loop.py's `serve_model`, the same function `EngineThread` runs in a thread); the parent keeps
only what needs no weights (`Frontend`: the tokenizer, the chat template, the sizes the child
reports when it is ready).

The wire is one `multiprocessing` pipe, pickled tuples both ways:
  parent -> child  the serving loop's messages: ("add", key, ids, params, logprobs_n, pooling, reuse) | ("abort", key)
                   | ("stop",)
  child -> parent  ("ready", facts) | ("load_error", message, is_minfer_error)
                   | ("events", [(key, event), ...], running, waiting)   one message per step
Each side writes from a sender thread of its own: the engine never waits for a parent slow to
read, and the event loop never blocks on a pipe the child has not drained (a long prompt).
The parent reads the pipe on its event loop (`attach`, at the app's startup: `loop.add_reader`
on the pipe), so events reach each job's queue with no thread and no lock in between: a thread
would trade the interpreter lock with the event loop for every step's message. Until attached
(or in a process without an event loop), a reader thread does it. The child ignores
SIGINT (the terminal's Ctrl-C reaches the whole process group: the parent decides when the
engine stops) and exits when the pipe closes, so a parent that dies takes its engine with it.
If the child dies, every job it held, running or queued, gets an error event that says so, and
a new child is started after a back-off (`state` "restarting": /health and new requests are a
503 until it is ready); after MAX_RESTARTS deaths within RESTART_WINDOW_S the server gives up and
exits non-zero (`on_load_error`), for its supervisor to restart.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..api import Prompting
from ..engine.engine import check_tokens
from ..errors import MinferError
from ..gguf.reader import GGUFReader
from ..tokenizer import Tokenizer
from ..tokenizer.render_worker import RenderWorker
from .loop import EngineHost, Job, deliver, serve_model
from .metrics import Metrics

log = logging.getLogger("minfer.server")

MAX_RESTARTS = 3  # engine deaths within RESTART_WINDOW_S that are restarted; one more and the server exits
RESTART_WINDOW_S = 600.0
BACKOFF_S = (1.0, 2.0, 4.0)  # wait before the 1st, 2nd, 3rd restart in the window
PIPE_BATCH = 4  # messages (engine steps' events) the event loop takes from the pipe per wake-up


@dataclass
class LoadSpec:
    """How the child loads the model: `load(args, config)` is called there (picklable: a
    module-level function and plain data)."""

    load: object
    args: object
    config: object
    path: Path
    chat_template: str | None = None


class Frontend(Prompting):
    """The model as the HTTP side sees it: tokenizer, chat template and sizes, no weights."""

    def __init__(self, path: Path, chat_template: str | None):
        self.reader = GGUFReader(path)
        self.tokenizer = Tokenizer.from_metadata(self.reader.metadata)
        if chat_template is not None:
            self.tokenizer.set_chat_template(chat_template)
        self.render_worker: RenderWorker | None = None
        if self.tokenizer.chat_template is not None:  # the file's (or the user's) template: rendered under limits
            self.render_worker = RenderWorker()
            self.render_worker.start()  # (~0.3 s, while the engine loads)
            self.tokenizer.isolate_templates(self.render_worker)
        self.n_ctx = self.n_slots = self.n_vocab = 0  # what the engine reports when it is ready
        self.eog_ids: frozenset[int] = frozenset()

    def close(self) -> None:
        if self.render_worker is not None:
            self.render_worker.close()

    def set_facts(self, facts: dict) -> None:
        self.n_ctx, self.n_slots, self.n_vocab = facts["n_ctx"], facts["n_slots"], facts["n_vocab"]
        self.eog_ids = frozenset(facts["eog_ids"])

    def check_tokens(self, ids: list[int]) -> None:
        check_tokens(ids, self.n_vocab, self.n_ctx)


class EngineProcess(EngineHost):
    """The serving loop in a child process (loop.py's EngineHost), restarted when it dies.

    States: loading (the first load) -> ok; ok -> restarting -> ok when the engine process dies
    (its jobs, running and queued, end with an error event that says so; new requests are a 503
    until the new engine is ready); error when the first load fails, or when the engine died more
    than `max_restarts` times within `window_s` (`on_load_error` is then called: `minfer serve`
    exits non-zero, so a supervisor restarts the whole server instead of it answering 503
    forever); stopped. Restarts wait `backoff_s[i]` first (the i-th death in the window)."""

    def __init__(self, spec: LoadSpec, metrics: Metrics, on_load_error=None, *, max_restarts: int = MAX_RESTARTS,
                 window_s: float = RESTART_WINDOW_S, backoff_s: tuple[float, ...] = BACKOFF_S):
        self.spec, self.metrics, self.on_load_error = spec, metrics, on_load_error
        self.max_restarts, self.window_s, self.backoff_s = max_restarts, window_s, backoff_s
        self.state = "loading"  # loading -> ok <-> restarting; error; stopped
        self.load_error: BaseException | None = None
        self.model: Frontend | None = None
        self.ready = threading.Event()
        self.jobs: dict[int, Job] = {}
        self.restarts = 0
        self._deaths: list[float] = []  # monotonic times of the engine's deaths within the window
        self._keys = itertools.count(1)
        self._front: list = []  # the Frontend (or what building it raised), built while the child loads
        self._front_thread = threading.Thread(target=self._build_front, name="minfer-frontend", daemon=True)
        self._stopping = False
        self._ever_ready = False
        self._child_error: str | None = None  # what the current child reported before it exited
        self._child_exc: BaseException | None = None
        self._timer: threading.Timer | None = None
        self._ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited CUDA or threads
        self.reader: threading.Thread | None = None
        self._loop = None  # the event loop reading the pipe, once attached
        self._new_child()

    def _new_child(self) -> None:
        """A child process, its pipe and its sender thread (one set per engine generation)."""
        self._conn, self._child_conn = self._ctx.Pipe()
        self.proc = self._ctx.Process(target=_child_main, args=(self._child_conn, self.spec), name="minfer-engine",
                                      daemon=True)
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()  # to the child, through the sender thread
        self._sender = threading.Thread(target=_send_all, args=(self._conn, self._outbox),
                                        name="minfer-engine-sender", daemon=True)
        self._child_error, self._child_exc = None, None

    def _start_child(self) -> None:
        self.proc.start()
        self._child_conn.close()  # the child holds its end; EOF reaches us when it exits
        self._sender.start()

    # ------------------------------------------------------------------ the event loop's side
    def start(self) -> None:
        self._start_child()
        self._front_thread.start()

    def attach(self, loop) -> None:
        """Read the pipe on `loop` (call from it, before serving)."""
        self._loop = loop
        watch_pipe(loop, self._conn, self._readable)

    def start_reader_thread(self) -> None:
        """Read the pipe in a thread of its own (no event loop to attach to)."""
        self.reader = threading.Thread(target=self._read, args=(self._conn,), name="minfer-engine-reader",
                                       daemon=True)
        self.reader.start()

    def submit(self, job: Job) -> None:
        job.key = next(self._keys)
        if self.state != "ok" or not self._send(("add", job.key, job.ids, job.params, job.logprobs_n, job.pooling,
                                                   job.reuse)):
            job.push(("error", f"the engine is not running ({self.state})"))
            return
        self.jobs[job.key] = job

    def cancel(self, job: Job) -> None:
        job.done = True
        self._send(("abort", job.key))

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        if self._timer is not None:
            self._timer.cancel()
        self._send(("stop",))
        self._outbox.put(None)
        if self.proc.pid is not None:
            self.proc.join(timeout)
            if self.proc.is_alive():
                log.error("the engine process did not stop in %.0f s; killing it", timeout)
                self.proc.kill()
                self.proc.join(5)
        if self.reader is not None:
            self.reader.join(timeout)
        elif self._loop is not None and not self._loop.is_closed():
            conn = self._conn
            self._loop.call_soon_threadsafe(self._readable, conn)  # the last events (and the EOF) on the loop
        if self.state in ("ok", "loading", "restarting"):
            self.state = "stopped"
        if self.model is not None:
            self.model.close()

    def _send(self, msg: tuple) -> bool:
        """Queue a message for the child. The event loop never writes the pipe itself: a long
        prompt can fill it while the child is inside a step, and the loop must keep reading the
        child's events meanwhile (or both ends would wait on each other)."""
        if self._conn.closed:
            return False
        self._outbox.put(msg)
        return True

    def _build_front(self) -> None:
        try:
            self._front.append(Frontend(self.spec.path, self.spec.chat_template))
        except BaseException as e:  # noqa: BLE001 (reported when the engine says it is ready)
            self._front.append(e)

    # ------------------------------------------------------------------ reading the pipe
    def _readable(self, conn) -> None:
        """The pipe has data (on the event loop): take up to PIPE_BATCH whole messages, then give
        the loop back (the reader fires again while data waits). Draining the pipe instead held
        the loop for as long as the child kept it fed: on a loaded machine a streamed answer's
        events all arrived here on time while none of its chunks reached the client before the
        end (the chat page showed the whole answer at once)."""
        if conn.closed:
            return
        try:
            for _ in range(PIPE_BATCH):
                if not conn.poll():
                    return
                if not self._handle(conn.recv(), local=True):
                    break
            else:
                return
        except (EOFError, OSError):
            pass
        self._loop.remove_reader(conn.fileno())
        self._closed(conn)

    def _read(self, conn) -> None:
        try:
            while self._handle(conn.recv(), local=False):
                pass
        except (EOFError, OSError):
            pass
        self._closed(conn)

    def _handle(self, msg: tuple, local: bool) -> bool:
        """One message from the child; False when nothing more will come."""
        if msg[0] == "events":
            _, events, running, waiting = msg
            for key, ev in events:
                job = self.jobs.get(key)
                if job is None:
                    continue
                if ev[0] in ("done", "error"):
                    del self.jobs[key]
                if local and ev[0] != "end":
                    job.put(ev)  # (on the job's own loop: no hop)
                else:
                    deliver(job, ev, self.metrics)
            self.metrics.active.set(running)
            self.metrics.queued.set(waiting)
        elif msg[0] == "ready":
            self._ready(msg[1])
        elif msg[0] == "load_error":
            _, message, typed = msg
            self._child_error = message if typed else f"the engine failed to load: {message}"
            self._child_exc = MinferError(message) if typed else RuntimeError(message)
            return False
        return True

    def _closed(self, conn) -> None:
        """A pipe closed: its child is on its way out (exited, killed, or its load failed)."""
        if conn.closed or conn is not self._conn:
            return
        conn.close()
        self._outbox.put(None)  # this generation's sender ends
        self.proc.join(5)
        code = self.proc.exitcode
        reason = self._child_error or f"the engine process exited (exit code {code})"
        if self._stopping:
            self.state = "stopped"
        elif self.state == "error":  # already failed (this side could not build its tokenizer)
            pass
        elif not self._ever_ready:  # the first load: a model that does not load is the server's end
            self._load_failed(self._child_exc or RuntimeError(f"the engine process exited while loading "
                                                              f"(exit code {code})"))
        elif self._died(reason):
            reason += "; restarting it"
        self.metrics.active.set(0)
        self.metrics.queued.set(0)
        for job in list(self.jobs.values()):
            job.push(("error", reason))
        self.jobs.clear()

    def _died(self, reason: str) -> bool:
        """The engine died after it had served: schedule a restart (True), or give up (False)."""
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < self.window_s] + [now]
        if len(self._deaths) > self.max_restarts:
            log.error("%s; it failed %d times in %.0f s: giving up", reason, len(self._deaths), self.window_s)
            self._load_failed(MinferError(f"the engine process failed {len(self._deaths)} times in "
                                          f"{self.window_s:.0f} s (last: {reason}); the server stops"))
            return False
        delay = self.backoff_s[min(len(self._deaths), len(self.backoff_s)) - 1]
        log.error("%s; restarting it in %.1f s (failure %d of at most %d in %.0f s)", reason, delay,
                  len(self._deaths), self.max_restarts, self.window_s)
        self.state = "restarting"
        self.restarts += 1
        self.metrics.engine_restarts.inc()
        self._timer = threading.Timer(delay, self._restart)
        self._timer.daemon = True
        self._timer.start()
        return True

    def _restart(self) -> None:
        """(A timer thread.) A new engine process, its pipe read like the first one's."""
        if self._stopping:
            return
        self._new_child()
        self._start_child()
        if self._loop is not None:
            conn = self._conn
            self._loop.call_soon_threadsafe(watch_pipe, self._loop, conn, self._readable)
        else:
            self.start_reader_thread()

    def _ready(self, facts: dict) -> None:
        self._front_thread.join()  # (done long before the engine: a tokenizer, not the weights)
        front = self._front[0]
        if isinstance(front, BaseException):  # the child loaded the file; this side could not
            self._send(("stop",))
            self._load_failed(front)
            return
        front.set_facts(facts)
        self.model = front
        self._ever_ready = True
        if not self._stopping:
            self.state = "ok"
        self.ready.set()


def watch_pipe(loop, conn, callback) -> None:
    """`callback(conn)` on `loop` whenever `conn` has data, with the pipe left blocking. uvloop's
    `add_reader` (libuv's uv_poll_init) makes the descriptor non-blocking; then a `recv` of a
    message not yet whole raises BlockingIOError, which reads as the child's death (an H200 soak
    restarted a healthy engine three times so), and the sender thread's `send` into a full pipe
    fails the same way. Blocking, a `recv` that starts a message waits for its rest: the child
    writes each message whole, from a thread that does nothing else."""
    loop.add_reader(conn.fileno(), callback, conn)
    os.set_blocking(conn.fileno(), True)


# ---------------------------------------------------------------------- the child
def _child_main(conn, spec: LoadSpec) -> None:
    """The engine process: loop.py's serve_model with the pipe as its inbox and outlet."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    outbox: queue.SimpleQueue = queue.SimpleQueue()  # every message to the parent, sent by a thread of its own
    sender = threading.Thread(target=_send_all, args=(conn, outbox), name="minfer-engine-sender", daemon=True)
    sender.start()
    sent_counts: list = [None]

    def take(block: bool) -> list:
        try:
            if block:
                conn.poll(None)  # idle: block until the parent says something
            msgs = []
            while conn.poll():
                msgs.append(conn.recv())
            return msgs
        except (EOFError, OSError):  # the parent is gone: stop serving
            return [("stop",)]

    def publish(events: list, running: int, waiting: int) -> None:
        if events or (running, waiting) != sent_counts[0]:  # (nothing new: nothing sent)
            outbox.put(("events", events, running, waiting))
            sent_counts[0] = (running, waiting)

    def ready(model) -> None:
        outbox.put(("ready", {"n_ctx": model.n_ctx, "n_slots": model.n_slots, "n_vocab": model.n_vocab,
                              "eog_ids": sorted(model.eog_ids)}))

    def load_failed(e: BaseException) -> None:  # reported to the parent, which exits with it
        outbox.put(("load_error", str(e) if isinstance(e, MinferError) else f"{type(e).__name__}: {e}",
                    isinstance(e, MinferError)))

    failed = False
    try:
        serve_model(lambda: spec.load(spec.args, spec.config), take, publish, ready, load_failed)
    except BaseException:  # noqa: BLE001 (the loop failed: logged, its requests told; the parent restarts it)
        failed = True
    finally:
        outbox.put(None)
        sender.join(10)  # the last events reach the parent before this process ends
    if failed:
        sys.exit(1)


def _send_all(conn, outbox: queue.SimpleQueue) -> None:
    """Write one side's messages to the other from a thread: the engine never waits for a parent
    that is slow to read (a busy event loop), nor the event loop for a child inside a step; each
    only queues. Ends at None, or when the other side is gone (its end reaches the reader)."""
    while (msg := outbox.get()) is not None:
        try:
            conn.send(msg)
        except (OSError, ValueError):  # the other side is gone: its loop sees EOF on its next poll
            return
