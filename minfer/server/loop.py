"""The one engine loop: whoever owns the model steps the batch; the event loop never touches it.

`Driver` is that loop's work, shared by the two ways to run it: it adds a request (token ids +
SamplingParams, validated by the handler) to the scheduler's queue (first come, first served;
beyond n_slots sequences wait there), steps the engine while anything runs, and after every step
hands each request its new text, tokens and logprobs through `emit(key, event)`. An abort (the
client went away) frees the slot at the next step boundary.

- `EngineLoop` (here) runs the Driver in a thread of the server's process, on an api.Model the
  caller loaded: events reach each `Job`'s asyncio queue through `loop.call_soon_threadsafe`.
- `EngineProcess` (process.py, what `minfer serve` runs) runs it in a child process that owns
  the model, so the engine's Python and the HTTP event loop never share one interpreter lock.

Events a job receives, in order: ("delta", text, token_ids, logprobs)*, then exactly one of
("done", finish_reason, usage) or ("error", message). Before the last one the Driver emits
("end", n_prompt, token_times, end_time) for the metrics (not handed to the job). A step that
raises fails the jobs then running with an error event (their streams end with an error event
and [DONE]) and the loop goes on serving. A failure of the loop itself (a bug) tells every job it
holds or has queued, and sets `state` to "error": /health and new requests then answer 503.
Idle, the loop blocks on its inbox: no polling, no CPU.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from ..engine.params import SamplingParams
from ..errors import MinferError
from .metrics import Metrics

log = logging.getLogger("minfer.server")


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

    def push(self, event: tuple) -> None:
        """Hand an event to the job's stream (any thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed (shutdown): nobody is listening
            pass


class Driver:
    """The engine side of serving (no asyncio): requests in, one engine step at a time, events out
    through `emit(key, event)`. Runs in the thread or process that owns the engine."""

    def __init__(self, engine, emit: Callable[[Hashable, tuple], None]):
        self.engine, self.emit = engine, emit
        self.live: dict[Hashable, list] = {}  # key -> [Sequence, generated tokens already handed over]

    def busy(self) -> bool:
        return self.engine.scheduler.has_work()

    def counts(self) -> tuple[int, int]:
        """(running, waiting) sequences."""
        s = self.engine.scheduler
        return len(s.running), len(s.waiting)

    def add(self, key: Hashable, ids: list[int], params: SamplingParams, logprobs_n: int | None) -> None:
        try:
            seq = self.engine.add(ids, params, reuse_prefix=params.seed is None)
        except Exception as e:  # noqa: BLE001 (the handler validated the request; this is a late surprise)
            self.emit(key, ("error", str(e) if isinstance(e, MinferError) else f"{type(e).__name__}: {e}"))
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
        self.emit(key, ("error", message))

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
            self.emit(key, ("delta", text, new, lps))
        if seq.finished:
            del self.live[key]
            self._end(key, seq)
            usage = {"prompt_tokens": seq.n_prompt, "completion_tokens": len(seq.generated),
                     "total_tokens": seq.n_prompt + len(seq.generated), "cached_tokens": seq.stats.cached_tokens}
            self.emit(key, ("done", seq.finish_reason, usage))

    def _end(self, key: Hashable, seq) -> None:
        st = seq.stats
        self.emit(key, ("end", seq.n_prompt, list(st.token_times), st.finished or time.perf_counter()))


def deliver(job: Job, event: tuple, metrics: Metrics) -> None:
    """An event from the Driver to its job (an "end" goes to the metrics)."""
    if event[0] == "end":
        metrics.finished(job.arrival, event[1], event[2], event[3])
    else:
        job.push(event)


class EngineLoop:
    """Loads the model (`load()` -> api.Model) in its thread, then serves jobs until `stop()`."""

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

    # ------------------------------------------------------------------ the event loop's side
    def start(self) -> None:
        self.thread.start()

    def submit(self, job: Job) -> None:
        self.inbox.put(("add", job))

    def cancel(self, job: Job) -> None:
        job.done = True
        self.inbox.put(("abort", job))

    def stop(self, timeout: float = 10.0) -> None:
        self.inbox.put(("stop", None))
        if self.thread.is_alive():
            self.thread.join(timeout)

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            self.model = self._load()
            engine = getattr(self.model, "engine", None)
            if engine is not None and hasattr(engine, "warmup"):
                engine.warmup()  # graphs and kernel variants ready before /health says ok
        except BaseException as e:  # noqa: BLE001 (reported to the command, which exits with it)
            self.state, self.load_error = "error", e
            self.ready.set()
            if self.on_load_error is not None:
                self.on_load_error(e)
            return
        self.state = "ok"
        self.ready.set()
        driver = Driver(self.model.engine, lambda job, ev: deliver(job, ev, self.metrics))
        try:
            self._serve(driver)
        except BaseException as e:  # noqa: BLE001 (a bug in the loop itself: say so to every waiting client)
            log.error("engine loop failed:\n%s", traceback.format_exc())
            self.state = "error"
            for job in driver.live:
                job.push(("error", f"the engine loop failed: {type(e).__name__}: {e}"))
            self._fail_inbox(f"the engine loop failed: {type(e).__name__}")
        finally:
            if self.state != "error":
                self.state = "stopped"
            self.model.close()

    def _fail_inbox(self, message: str) -> None:
        while True:
            try:
                cmd, job = self.inbox.get_nowait()
            except queue.Empty:
                return
            if cmd == "add":
                job.push(("error", message))

    def _serve(self, driver: Driver) -> None:
        while True:
            try:
                cmd, job = self.inbox.get(block=not driver.busy())
            except queue.Empty:
                cmd = None
            while cmd is not None:
                if cmd == "stop":
                    driver.fail_all("the server is shutting down")
                    self._fail_inbox("the server is shutting down")
                    return
                if cmd == "add" and not job.done:  # (a job cancelled before it reached the loop is dropped)
                    driver.add(job, job.ids, job.params, job.logprobs_n)
                elif cmd == "abort":
                    driver.abort(job)
                try:
                    cmd, job = self.inbox.get_nowait()
                except queue.Empty:
                    cmd = None
            if driver.busy():
                driver.step()
            active, queued = driver.counts()
            self.metrics.active.set(active)
            self.metrics.queued.set(queued)
