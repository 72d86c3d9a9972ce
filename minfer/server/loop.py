"""The one serving loop: whoever owns the model steps the batch; the event loop never touches it.

`ServingLoop` is the engine side of serving, written once: it adds a request (token ids +
SamplingParams, validated by the handler) to the scheduler's queue (first come, first served;
beyond n_slots sequences wait there), steps the engine while anything runs, and after every step
hands each request its new text, tokens and logprobs. An abort (the client went away) frees the
slot at the next step boundary. `serve_model` is the engine side's whole life around it: load,
warm up, say ready, serve until told to stop, close. Two hosts run that same function:

- `EngineThread` (here) in a thread of the server's process, on an api.Model the caller loads:
  events reach each `Job`'s asyncio queue through `loop.call_soon_threadsafe`;
- `EngineProcess` (process.py, what `minfer serve` runs) in a child process that owns the model,
  so the engine's Python and the HTTP event loop never share one interpreter lock.

A host hands the loop its messages through `take(block)` and receives each round's events through
`publish(events, running, waiting)`; only these two differ (a queue or a pipe, a thread hop or a
pickled message). The messages:
  ("add", key, ids, params, logprobs_n, pooling, reuse) | ("abort", key) | ("stop",)
(`reuse`: the request may start from a slot's cached prefix of its prompt; a seeded one never does.)
Events a request receives, in order: ("delta", text, token_ids, logprobs)* (an embedding request:
one ("embedding", vector) instead), then exactly one of ("done", finish_reason, usage) or
("error", message). Before the last one the loop emits
("end", n_prompt, token_times, end_time, cached_tokens) for the metrics (not handed to the job). A step that
raises fails the requests then running with an error event (their streams end with an error event
and [DONE]) and the loop goes on serving. A failure of the loop itself (a bug) tells every request
it holds or has been sent, then ends the loop with the exception: the host reports it (the thread
sets `state` "error"; a dead engine process is restarted by its parent). Idle, the loop blocks on
its inbox: no polling, no CPU.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from ..engine.params import SamplingParams
from ..errors import MinferError
from .metrics import Metrics

log = logging.getLogger("minfer.server")

Take = Callable[[bool], list]  # take(block) -> the messages waiting (block: wait for the first one)
Publish = Callable[[list, int, int], None]  # publish([(key, event), ...], running, waiting)


@dataclass(eq=False)
class Job:
    ids: list[int]
    params: SamplingParams
    logprobs_n: int | None
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrival: float = field(default_factory=time.perf_counter)
    key: int = 0  # the engine side's name for it (EngineProcess numbers its jobs)
    done: bool = False  # set on the event loop when the final event was taken (or the job cancelled)
    index: int = 0  # its choice among a request's n (the n jobs share one `events` queue)
    pooling: str | None = None  # an embedding request: how its hidden states pool (engine/pooling.py)
    reuse: bool = True  # may start from a slot's cached prefix of its prompt (llama-server's cache_prompt)

    def put(self, event: tuple) -> None:
        """Hand an event to the job's stream, as (index, event) (on its event loop)."""
        self.events.put_nowait((self.index, event))

    def push(self, event: tuple) -> None:
        """Hand an event to the job's stream (any thread)."""
        try:
            self.loop.call_soon_threadsafe(self.put, event)
        except RuntimeError:  # the event loop is closed (shutdown): nobody is listening
            pass


class ServingLoop:
    """The engine side of serving (no asyncio): messages in, one engine step at a time, every
    request's events out. Runs in the thread or process that owns the engine (`run`)."""

    def __init__(self, engine):
        self.engine = engine
        self.live: dict[Hashable, list] = {}  # key -> [Sequence, generated tokens already handed over]
        self.out: list[tuple[Hashable, tuple]] = []  # this round's events, published after it

    # ------------------------------------------------------------------ the loop
    def run(self, take: Take, publish: Publish, on_failure: Callable[[BaseException], None] | None = None) -> None:
        """Serve until a ("stop",) message. A failure of the loop itself is told to `on_failure`
        first (a host that must refuse new requests says so before anyone hears of it), then to
        every request held or sent; then it is raised."""
        try:
            while True:
                msgs = take(not self.busy())
                for i, msg in enumerate(msgs):
                    if msg[0] == "stop":
                        self._fail_everything("the server is shutting down", msgs[i + 1:] + take(False))
                        self._publish(publish)
                        return
                    if msg[0] == "add":
                        self.add(*msg[1:])
                    elif msg[0] == "abort":
                        self.abort(msg[1])
                if self.busy():
                    self.step()
                self._publish(publish)
        except BaseException as e:
            log.error("engine loop failed:\n%s", traceback.format_exc())
            if on_failure is not None:
                on_failure(e)
            message = f"the engine loop failed: {type(e).__name__}: {e}"
            for key in self.live:  # (the engine's state is unknown: its requests are told, it is left alone)
                self.out.append((key, ("error", message)))
            self.live.clear()
            try:
                self._fail_everything(message, take(False))
                self._publish(publish)
            except BaseException:  # noqa: BLE001 (the inbox or the outlet is what failed: nothing more to tell)
                pass
            raise

    def _publish(self, publish: Publish) -> None:
        running, waiting = self.counts()
        events, self.out = self.out, []
        publish(events, running, waiting)

    def _fail_everything(self, message: str, unread: list) -> None:
        """End every request now: those running or queued, and the adds not yet read."""
        self.fail_all(message)
        for msg in unread:
            if msg[0] == "add":
                self.out.append((msg[1], ("error", message)))

    # ------------------------------------------------------------------ requests
    def busy(self) -> bool:
        return self.engine.scheduler.has_work()

    def counts(self) -> tuple[int, int]:
        """(running, waiting) sequences."""
        s = self.engine.scheduler
        return len(s.running), len(s.waiting)

    def add(self, key: Hashable, ids: list[int], params: SamplingParams, logprobs_n: int | None,
            pooling: str | None = None, reuse: bool = True) -> None:
        try:
            seq = self.engine.add(ids, params, reuse_prefix=reuse and params.seed is None, pooling=pooling)
        except Exception as e:  # noqa: BLE001 (the handler validated the request; this is a late surprise)
            self.out.append((key, ("error", str(e) if isinstance(e, MinferError) else f"{type(e).__name__}: {e}")))
            return
        seq.logprobs_n = logprobs_n
        self.live[key] = [seq, 0]

    def abort(self, key: Hashable) -> None:
        if key in self.live:
            self.engine.abort(self.live[key][0])
            self._flush(key)

    def step(self) -> None:
        """One engine step, then every request's news. A backend failure fails the running
        requests (each gets an error event) and leaves the loop serving."""
        try:
            self.engine.step()
        except Exception as e:  # noqa: BLE001 (a backend failure: fail the running jobs, go on)
            log.error("engine step failed:\n%s", traceback.format_exc())
            for key in list(self.live):
                self.fail(key, f"the engine failed while generating: {type(e).__name__}: {e}")
        for key in list(self.live):
            self._flush(key)

    def fail(self, key: Hashable, message: str) -> None:
        """End a request now with an error event."""
        seq, _ = self.live.pop(key)
        self.engine.abort(seq)
        self._end(key, seq)
        self.out.append((key, ("error", message)))

    def fail_all(self, message: str) -> None:
        for key in list(self.live):
            self.fail(key, message)

    def _flush(self, key: Hashable) -> None:
        """Hand the request what its sequence produced since the last flush; the end, once."""
        rec = self.live[key]
        seq, sent = rec
        new = seq.generated[sent:]
        text = seq.take_text()
        if text or new:
            lps = seq.logprobs[sent:sent + len(new)] if seq.logprobs_n is not None else None
            rec[1] = sent + len(new)
            self.out.append((key, ("delta", text, new, lps)))
        if seq.finished:
            del self.live[key]
            if seq.pooling is not None and seq.finish_reason == "stop":
                self.out.append((key, ("embedding", seq.embedding())))
            self._end(key, seq)
            usage = {"prompt_tokens": seq.n_prompt, "completion_tokens": len(seq.generated),
                     "total_tokens": seq.n_prompt + len(seq.generated), "cached_tokens": seq.stats.cached_tokens,
                     "prefill_seconds": seq.stats.prefill_seconds, "decode_seconds": seq.stats.decode_seconds,
                     "draft_tokens": seq.stats.draft_tokens, "draft_accepted": seq.stats.draft_accepted}
            self.out.append((key, ("done", seq.finish_reason, usage)))

    def _end(self, key: Hashable, seq) -> None:
        st = seq.stats
        self.out.append((key, ("end", seq.n_prompt, list(st.token_times), st.finished or time.perf_counter(),
                               st.cached_tokens)))


def serve_model(load: Callable[[], object], take: Take, publish: Publish, on_ready: Callable[[object], None],
                on_load_error: Callable[[BaseException], None],
                on_failure: Callable[[BaseException], None] | None = None) -> None:
    """The engine side's whole life, the same in a thread and in a child process: load the model
    (`load()` -> api.Model), warm it up (graphs and kernel variants ready before /health says ok),
    `on_ready(model)`, serve until a stop message, close the model. A load that fails goes to
    `on_load_error`; a failure of the loop itself to `on_failure`, then to every request, and is
    raised."""
    try:
        model = load()
        model.engine.warmup()
    except BaseException as e:  # noqa: BLE001 (reported to the host, which ends the server with it)
        on_load_error(e)
        return
    on_ready(model)
    try:
        ServingLoop(model.engine).run(take, publish, on_failure)
    finally:
        model.close()


def deliver(job: Job, event: tuple, metrics: Metrics) -> None:
    """An event from the serving loop to its job (an "end" goes to the metrics)."""
    if event[0] == "end":
        metrics.finished(job.arrival, event[1], event[2], event[3], cached=event[4])
    else:
        job.push(event)


class EngineHost(ABC):
    """Where the serving loop runs, as the app sees it. `state`: loading -> ok; restarting (an
    engine process being replaced); error (the model did not load, or the loop failed: `load_error`
    says why when it is the load); stopped. `model` is what the handlers tokenize with (an
    api.Model, or the child process's Frontend); `ready` is set once the first load ended."""

    state: str
    model: object
    ready: threading.Event
    load_error: BaseException | None
    metrics: Metrics
    on_load_error: Callable[[BaseException], None] | None  # the server's end: `minfer serve` exits with it

    def _load_failed(self, e: BaseException) -> None:
        """The model did not load (or can no longer be served): state "error", and the server told."""
        self.state, self.load_error = "error", e
        self.ready.set()
        if self.on_load_error is not None:
            self.on_load_error(e)

    @abstractmethod
    def start(self) -> None:
        """Begin loading the model (returns at once)."""

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:  # noqa: B027 (most hosts have nothing to do)
        """The app's event loop, at its startup (a host that reads a pipe reads it there)."""

    @abstractmethod
    def submit(self, job: Job) -> None:
        """Queue a request; its events arrive on `job.events`."""

    @abstractmethod
    def cancel(self, job: Job) -> None:
        """The client went away: free the request's slot at the next step boundary."""

    @abstractmethod
    def stop(self, timeout: float = 10.0) -> None:
        """End the serving loop (requests still held get an error event) and release the model."""


class EngineThread(EngineHost):
    """The serving loop in a thread of the server's process: loads the model (`load()` ->
    api.Model) there, then serves jobs until `stop()`. What a Python program embedding the app on
    its own model uses, and `minfer serve --no-engine-process`."""

    def __init__(self, load: Callable[[], object], metrics: Metrics, on_load_error: Callable[[BaseException], None]
                 | None = None):
        self._load = load
        self.metrics = metrics
        self.on_load_error = on_load_error
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.state = "loading"  # loading -> ok | error; stopped
        self.load_error: BaseException | None = None
        self.model = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name="minfer-engine", daemon=True)
        self._open = True  # the loop still reads its inbox (under _lock: a request is served or told, never lost)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ the event loop's side
    def start(self) -> None:
        self.thread.start()

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._open:
                self.inbox.put(("add", job, job.ids, job.params, job.logprobs_n, job.pooling, job.reuse))
                return
        job.push(("error", f"the engine is not running ({self.state})"))

    def cancel(self, job: Job) -> None:
        job.done = True
        self.inbox.put(("abort", job))

    def stop(self, timeout: float = 10.0) -> None:
        self.inbox.put(("stop",))
        if self.thread.is_alive():
            self.thread.join(timeout)

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            serve_model(self._load, self._take, self._publish, self._ready, self._load_failed, self._failed)
        except BaseException:  # noqa: BLE001 (a bug in the loop: its requests were told; new ones get a 503)
            self.state = "error"
        else:
            if self.state != "error":
                self.state = "stopped"
        finally:
            with self._lock:  # what was sent after the loop's last read is told, and nothing more is sent
                self._open = False
                late = self._take(False)
            for msg in late:
                if msg[0] == "add":
                    msg[1].push(("error", f"the engine is not running ({self.state})"))

    def _failed(self, e: BaseException) -> None:
        self.state = "error"  # (before the requests hear of it: a client that retries gets a 503)

    def _ready(self, model) -> None:
        self.model, self.state = model, "ok"
        self.ready.set()

    def _take(self, block: bool) -> list:
        msgs = []
        try:
            msgs.append(self.inbox.get(block=block))
            while True:
                msgs.append(self.inbox.get_nowait())
        except queue.Empty:
            return msgs

    def _publish(self, events: list, running: int, waiting: int) -> None:
        for job, ev in events:  # (this host's keys are the jobs themselves)
            deliver(job, ev, self.metrics)
        self.metrics.active.set(running)
        self.metrics.queued.set(waiting)
