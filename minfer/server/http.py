"""The HTTP connection's deadline for a request's head, below the app.

uvicorn waits for a request's headers without limit: a client that sends one byte a second (or
opens a connection and sends nothing) holds the connection, and its memory, forever. The
protocol class here is uvicorn's own (httptools' parser when installed, else h11's) with one
timer: from the moment a connection opens, or a new request's first byte arrives on a kept-alive
connection, the request's headers must be complete within `read_timeout_s`, or the server answers
408 (OpenAI's error JSON) and closes the connection. The body has its own deadline of the same
length in the app (app.read_json), where the framework reads it.

uvicorn's protocols name the request being answered `cycle` (a new one each time a request's
headers are complete, `response_complete` once answered): the only internal this relies on.
"""

from __future__ import annotations

import json

from .errors import error_body


def head_deadline_protocol(read_timeout_s: float) -> type:
    """uvicorn's HTTP/1.1 protocol class with the head deadline (`uvicorn.Config(http=...)`)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    body = json.dumps(error_body(408, f"the request's headers did not arrive within {read_timeout_s:g} s",
                                 code="request_timeout")).encode()
    answer = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
              b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)

    class HeadDeadlineProtocol(AutoHTTPProtocol):
        _head_timer = None
        _head_bytes = False  # a byte of the awaited head has arrived (a silent connection is closed without a word)

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            waiting = self._between_requests()
            if waiting and self._head_timer is None:
                self._arm()  # the first byte of a next request on a kept-alive connection
            self._head_bytes = self._head_bytes or (waiting and bool(data))
            before = self.cycle
            super().data_received(data)
            if self.cycle is not before:  # the head is complete: the app's own deadline takes the body
                self._disarm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._head_bytes = False
            self._head_timer = self.loop.call_later(read_timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _expired(self) -> None:
            self._head_timer = None
            if not self._between_requests() or self.transport.is_closing():
                return
            if self._head_bytes:
                self.transport.write(answer)
            self.transport.close()

    return HeadDeadlineProtocol
