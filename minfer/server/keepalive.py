"""The server's idle clock: how long no request has been in flight, and an exit after a keep-alive.

`minfer run`'s resident process (commands/resident.py) is `minfer serve` with a keep-alive: it
exits once no request has been in flight for that long (Ollama's keep_alive). The app tells the
clock when its count of requests in flight changes (`create_app(clock=...)`); /health reports
`idle_s` for `minfer ps`; `watch` ends the server when the keep-alive has passed.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

WATCH_EVERY_S = 1.0  # the longest pause between two looks at the clock


class IdleClock:
    """Requests in flight, and since when the count was last zero (monotonic)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.since = time.monotonic()

    def set_in_flight(self, n: int) -> None:
        """The app's count of requests in flight changed to n."""
        if n == 0 or self.in_flight == 0:
            self.since = time.monotonic()
        self.in_flight = n

    def reset(self) -> None:
        """Idle from now (the server starts serving: its load was no idle time)."""
        self.since = time.monotonic()

    def idle_seconds(self) -> float:
        """Seconds since the last request ended (or since the start); 0 while one is in flight."""
        return 0.0 if self.in_flight else time.monotonic() - self.since

    def watch(self, keep_alive_s: float, on_idle: Callable[[], None]) -> threading.Thread | None:
        """Call `on_idle()` once, from a thread, when the server has been idle for keep_alive_s
        (math.inf: never; no thread)."""
        if math.isinf(keep_alive_s):
            return None

        def run() -> None:
            while True:
                left = keep_alive_s - self.idle_seconds()
                if left <= 0 and self.in_flight == 0:
                    on_idle()
                    return
                time.sleep(min(max(left, 0.05), WATCH_EVERY_S))

        t = threading.Thread(target=run, name="minfer-keep-alive", daemon=True)
        t.start()
        return t
