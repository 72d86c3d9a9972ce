"""The one engine loop: a thread that owns the model and steps the batch.

The event loop never touches the engine. A request becomes a `Job` (token ids + SamplingParams,
validated by the handler) and enters the loop's inbox (a thread-safe queue); the loop thread
adds it to the scheduler's queue (first come, first served; beyond n_slots sequences wait
there), steps the engine while anything runs, and after every step hands each job its new text,
tokens and logprobs through `loop.call_soon_threadsafe` onto the job's asyncio queue. An
abort (the client went away) goes through the same inbox and frees the slot at the next step
boundary. Idle, the thread blocks on the inbox: no polling, no CPU.

Events a job receives, in order: ("delta", text, token_ids, logprobs)*, then exactly one of
("done", finish_reason, usage) or ("error", message). A step that raises fails the jobs then
running with an error event (their streams end with an error event and [DONE]) and the loop
goes on serving. A failure of the loop itself (a bug) tells every job it holds or has queued,
and sets `state` to "error": /health and new requests then answer 503.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
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
    seq: object = None  # the engine's Sequence, once the loop has added it
    sent: int = 0  # generated tokens already handed over
    done: bool = False  # set on the event loop when the final event was taken (or the job cancelled)

    def push(self, event: tuple) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed (shutdown): nobody is listening
            pass


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
        engine = self.model.engine
        jobs: list[Job] = []
        try:
            self._serve(engine, jobs)
        except BaseException as e:  # noqa: BLE001 (a bug in the loop itself: say so to every waiting client)
            log.error("engine loop failed:\n%s", traceback.format_exc())
            self.state = "error"
            for j in jobs:
                j.push(("error", f"the engine loop failed: {type(e).__name__}: {e}"))
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

    def _serve(self, engine, jobs: list[Job]) -> None:
        while True:
            busy = engine.scheduler.has_work()
            try:
                cmd, job = self.inbox.get(block=not busy)
            except queue.Empty:
                cmd = None
            while cmd is not None:
                if cmd == "stop":
                    for j in jobs:
                        engine.abort(j.seq)
                        j.push(("error", "the server is shutting down"))
                    self._fail_inbox("the server is shutting down")
                    return
                if cmd == "add":
                    self._add(engine, job, jobs)
                elif cmd == "abort" and job.seq is not None:
                    engine.abort(job.seq)
                    self._flush(job, jobs)
                try:
                    cmd, job = self.inbox.get_nowait()
                except queue.Empty:
                    cmd = None
            if engine.scheduler.has_work():
                try:
                    engine.step()
                except Exception as e:  # noqa: BLE001 (a backend failure: fail the running jobs, go on)
                    log.error("engine step failed:\n%s", traceback.format_exc())
                    for j in list(jobs):
                        engine.abort(j.seq)
                        jobs.remove(j)
                        self._end(j)
                        j.push(("error", f"the engine failed while generating: {type(e).__name__}: {e}"))
            for j in list(jobs):
                self._flush(j, jobs)
            self.metrics.active.set(len(engine.scheduler.running))
            self.metrics.queued.set(len(engine.scheduler.waiting))

    def _add(self, engine, job: Job, jobs: list[Job]) -> None:
        if job.done:  # cancelled before it reached the loop
            return
        try:
            seq = engine.add(job.ids, job.params, reuse_prefix=job.params.seed is None)
        except Exception as e:  # noqa: BLE001 (the handler validated the request; this is a late surprise)
            job.push(("error", str(e) if isinstance(e, MinferError) else f"{type(e).__name__}: {e}"))
            return
        seq.logprobs_n = job.logprobs_n
        job.seq = seq
        jobs.append(job)

    def _flush(self, job: Job, jobs: list[Job]) -> None:
        """Hand the job what its sequence produced since the last flush; the end, once."""
        seq = job.seq
        new = seq.generated[job.sent:]
        text = seq.take_text()
        if text or new:
            lps = seq.logprobs[job.sent:job.sent + len(new)] if seq.logprobs_n is not None else None
            job.sent += len(new)
            job.push(("delta", text, new, lps))
        if seq.finished and job in jobs:
            jobs.remove(job)
            self._end(job)
            st = seq.stats
            usage = {"prompt_tokens": seq.n_prompt, "completion_tokens": len(seq.generated),
                     "total_tokens": seq.n_prompt + len(seq.generated), "cached_tokens": st.cached_tokens}
            job.push(("done", seq.finish_reason, usage))

    def _end(self, job: Job) -> None:
        seq = job.seq
        st = seq.stats
        self.metrics.finished(job.arrival, seq.n_prompt, st.token_times, st.finished or time.perf_counter())
