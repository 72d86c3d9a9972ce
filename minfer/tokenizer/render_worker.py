"""The backstop under the chat-template sandbox: renders in a persistent child process whose
memory and CPU are capped by the kernel (RLIMIT_AS, RLIMIT_CPU).

chat.py bounds every size-producing operation before it allocates and checks a deadline at every
hook; this holds whatever Python does inside anyway (a C-level loop no hook sees, a guard that
misses a case). The server renders a model file's template here (server/process.py's Frontend):

- the child imports the renderer, then caps its address space at its size + `AS_HEADROOM`
  (a render that allocates past it gets a MemoryError, answered as a TemplateError; the child is
  then replaced so no fragmented heap carries over);
- before each render it sets its CPU soft limit to the CPU time used + `CPU_SECONDS` (past it the
  kernel ends the child with SIGXCPU);
- the parent waits for the answer at most the render deadline + `GRACE_S`, then kills the child;
- a child that ended (killed, capped, crashed) is started again on the next render.
Every such failure is a TemplateError for that request; the server goes on.

The wire is the child's stdin/stdout: a 4-byte little-endian length, then a JSON object (no
pickle: nothing the child sends is executed). Requests hold the template source and JSON values
only (messages, tools: what an HTTP request carries). One render at a time per worker (a lock);
the cost per render is two pipe writes and JSON (bench/NOTES.md: ~0.1 ms against ~0.05 ms for
SmolLM2's template in-process) and the child starts in ~0.3 s, once, while the model loads.
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..errors import TemplateError
from .chat import RENDER_SECONDS

AS_HEADROOM = 256 << 20  # address space a render may add to the child's size after its imports
CPU_SECONDS = 3  # CPU seconds one render may use (the child's RLIMIT_CPU soft limit moves per render)
GRACE_S = 1.0  # the parent's wait past the render deadline before it kills the child
MAX_MESSAGE = 64 << 20  # bytes of one request or reply on the wire
_ROOT = str(Path(__file__).resolve().parents[2])  # the directory that holds the minfer package


class RenderWorker:
    """Renders chat templates in a child process under kernel limits; thread-safe, restartable."""

    def __init__(self, time_limit: float = RENDER_SECONDS, child: str = "minfer.tokenizer.render_worker:main",
                 path: str = _ROOT):
        """`child` ("module:function") is what the child process runs, with `path` first on its
        sys.path: `main` here; the tests give it an unguarded renderer to show the limits hold."""
        self.time_limit = time_limit
        self._child, self._path = child, path
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self.starts = 0  # child processes started (the first, and one per failure)

    def start(self) -> None:
        """Start the child now (it is also started on the first render)."""
        with self._lock:
            self._ensure()

    def close(self) -> None:
        with self._lock:
            self._stop()

    def __enter__(self) -> RenderWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def render(self, template: str | None, messages: list[dict], add_generation_prompt: bool = True,
               bos_token: str = "", eos_token: str = "", **extra: Any) -> str:
        """render_chat's result, computed in the child (TemplateError for whatever went wrong)."""
        try:
            payload = json.dumps({"template": template, "messages": messages, "add_generation_prompt":
                                  add_generation_prompt, "bos_token": bos_token, "eos_token": eos_token,
                                  "extra": extra}, ensure_ascii=False, allow_nan=False).encode()
        except (TypeError, ValueError) as e:
            raise TemplateError(f"chat template arguments must be JSON values: {e}") from None
        if len(payload) > MAX_MESSAGE:
            raise TemplateError(f"chat template arguments are over {MAX_MESSAGE >> 20} MiB")
        with self._lock:
            proc = self._ensure()
            try:
                proc.stdin.write(struct.pack("<I", len(payload)) + payload)
                proc.stdin.flush()
                reply = self._read_reply(proc, time.monotonic() + self.time_limit + GRACE_S)
            except TemplateError:
                self._stop()
                raise
            except (OSError, ValueError):
                raise TemplateError(self._ended(proc)) from None
            if reply.get("restart"):
                self._stop()
        if "error" in reply:
            raise TemplateError(reply["error"])
        return reply["ok"]

    # ------------------------------------------------------------------ the parent's side
    def _ensure(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._stop()
        module, fn = self._child.split(":")
        code = f"import sys; sys.path.insert(0, {self._path!r}); from {module} import {fn}; {fn}()"
        self._proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, close_fds=True)
        self.starts += 1
        return self._proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for f in (proc.stdin, proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    def _ended(self, proc: subprocess.Popen) -> str:
        """The message for a child that ended mid-render (and forget it)."""
        try:
            code = proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None
        self._stop()
        if code is not None and code < 0:
            sig = signal.Signals(-code).name
            why = {"SIGXCPU": "its CPU limit", "SIGKILL": "its memory or CPU limit",
                   "SIGSEGV": "its memory limit"}.get(sig, sig)
            return f"chat template render process was stopped by {why} ({sig})"
        return f"chat template render process ended (exit code {code})"

    def _read_reply(self, proc: subprocess.Popen, deadline: float) -> dict:
        fd = proc.stdout.fileno()
        buf = bytearray()
        need = 4
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while len(buf) < need:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise TemplateError(f"chat template render did not finish in {self.time_limit + GRACE_S:.1f} s "
                                        "(its process was stopped)")
                chunk = os.read(fd, need - len(buf))
                if not chunk:
                    raise TemplateError(self._ended(proc))
                buf += chunk
                if need == 4 and len(buf) == 4:
                    need = 4 + struct.unpack("<I", buf)[0]
                    if need > MAX_MESSAGE:
                        raise TemplateError("chat template render process sent an oversized reply")
        return json.loads(bytes(buf[4:]))


# ---------------------------------------------------------------------- the child
def _cpu_used() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _address_space() -> int:
    return int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()


def main() -> None:
    """The child process: chat.py's guarded renderer under the limits."""
    from .chat import render_chat  # (imported before the limits: the imports are not a render's)

    serve(render_chat)


def serve(render_chat) -> None:
    """The child's loop around `render_chat`: requests on stdin, replies on a private copy of
    stdout (fd 1 itself goes to stderr, so nothing a library prints can corrupt the wire)."""
    wire = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = sys.stdin.buffer
    _, hard_as = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space() + AS_HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard_as == resource.RLIM_INFINITY else min(cap, hard_as), hard_as))
    _, hard_cpu = resource.getrlimit(resource.RLIMIT_CPU)
    while True:
        head = inp.read(4)
        if len(head) < 4:
            return
        req = json.loads(inp.read(struct.unpack("<I", head)[0]))
        soft = int(_cpu_used()) + CPU_SECONDS + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft if hard_cpu == resource.RLIM_INFINITY
                                                 else min(soft, hard_cpu), hard_cpu))
        reply: dict[str, Any]
        try:
            reply = {"ok": render_chat(req["template"], req["messages"], req["add_generation_prompt"],
                                       req["bos_token"], req["eos_token"], **req["extra"])}
        except TemplateError as e:
            reply = {"error": str(e), "restart": "out of memory" in str(e)}
        except MemoryError:
            reply = {"error": "chat template ran out of memory", "restart": True}
        except Exception as e:  # noqa: BLE001 (a renderer's bug is this request's error, not the child's end)
            reply = {"error": f"chat template failed: {type(e).__name__}: {e}", "restart": True}
        data = json.dumps(reply, ensure_ascii=False).encode()
        wire.write(struct.pack("<I", len(data)) + data)
        wire.flush()
