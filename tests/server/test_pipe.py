"""The engine pipe as the server's event loop reads it (server/process.py `watch_pipe`): under
uvloop, whose `add_reader` makes a descriptor non-blocking, messages larger than the socket's
buffer still arrive whole, in order, and the sending side's writes into a full pipe still block
instead of failing. (The H200 soak saw the alternative: a BlockingIOError mid-message, read as the
engine's death, restarted a healthy engine three times in ten minutes.)"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading

import pytest

from minfer.server.process import PIPE_BATCH, EngineProcess, watch_pipe

uvloop = pytest.importorskip("uvloop", reason="uvloop comes with the server extra (uvicorn's loop)")

# A few messages are enough: each is ~15x the socket buffer (~200 KiB), so each arrives in many pieces and
# a non-blocking recv would raise mid-message on the first one (once 40 messages; the bug needs no more).
N_MESSAGES = 4
SIZE = 3 << 20  # 3 MiB each: many times the socket buffer, so every message arrives in pieces


def test_big_messages_arrive_whole_under_uvloop():
    ours, theirs = multiprocessing.Pipe()
    got: list[bytes] = []
    failed: list[BaseException] = []

    def writer() -> None:  # the child's sender: whole messages, back to back
        for i in range(N_MESSAGES):
            theirs.send(bytes([i]) * SIZE)

    def send_ours() -> None:  # the parent's sender: nobody reads the other end until the loop is done
        try:
            ours.send(b"x" * SIZE)
        except BaseException as e:  # noqa: BLE001 (a non-blocking pipe: BlockingIOError mid-message)
            failed.append(e)

    sender: threading.Thread | None = None

    async def main() -> None:
        nonlocal sender
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def readable(conn) -> None:  # as EngineProcess._readable: every whole message waiting
            try:
                while conn.poll():
                    got.append(conn.recv())
                    if len(got) == N_MESSAGES and not done.done():
                        done.set_result(None)
            except BaseException as e:  # noqa: BLE001 (what the server would read as a dead engine)
                failed.append(e)
                loop.remove_reader(conn.fileno())
                done.set_result(None)

        watch_pipe(loop, ours, readable)
        assert os.get_blocking(ours.fileno())
        # the parent's own sender thread writes the same socket: it must block on a full pipe, not fail
        sender = threading.Thread(target=send_ours)
        threading.Thread(target=writer, daemon=True).start()
        sender.start()
        await asyncio.wait_for(done, 120)
        loop.remove_reader(ours.fileno())

    # in a thread of its own: a test before this one (the chat page's browser) may leave a loop running in this one
    runner = threading.Thread(target=lambda: uvloop.run(main()))
    runner.start()
    runner.join(300)
    assert not runner.is_alive()
    assert not failed, failed
    assert [m[0] for m in got] == list(range(N_MESSAGES))
    assert all(len(m) == SIZE and m.count(m[:1]) == SIZE for m in got)
    # the parent's message, written into a full pipe while nobody read it, arrives whole once read; its
    # sender then finishes (it waited on the full pipe rather than failing: joined only now, no sleep)
    assert theirs.poll(60)
    assert theirs.recv() == b"x" * SIZE
    sender.join(60)
    assert not sender.is_alive()
    assert not failed, failed


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_the_loop_runs_between_batches_of_pipe_messages(loop_kind):
    """A pipe the child keeps full does not hold the event loop: EngineProcess._readable takes at most
    PIPE_BATCH messages per wake-up and returns, so what the loop has queued meanwhile (the streams'
    writes to their clients) runs between them. Draining the pipe instead delivered a whole streamed
    answer to the chat page at once on a loaded machine, though every event reached the parent on time."""
    ours, theirs = multiprocessing.Pipe()
    n = 10 * PIPE_BATCH
    for i in range(n):  # all waiting before the loop looks (small: they fit the socket's buffer)
        theirs.send(("events", i))
    handled: list[int] = []
    seen_by_loop: list[int] = []

    class Stub:  # what _readable touches of an EngineProcess
        _loop = None

        def _handle(self, msg, local):
            handled.append(msg[1])
            if len(handled) == 1:  # a stream's write, queued by the first event
                self._loop.call_soon(lambda: seen_by_loop.append(len(handled)))
            return True

        def _closed(self, conn):
            raise AssertionError("the pipe did not close")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stub = Stub()
        stub._loop = loop
        watch_pipe(loop, ours, lambda conn: EngineProcess._readable(stub, conn))
        for _ in range(1000):
            if len(handled) == n:
                break
            await asyncio.sleep(0)
        loop.remove_reader(ours.fileno())

    runner = threading.Thread(target=lambda: (uvloop.run if loop_kind == "uvloop" else asyncio.run)(main()))
    runner.start()
    runner.join(60)
    assert not runner.is_alive()
    assert handled == list(range(n))  # every message, in order
    assert seen_by_loop and seen_by_loop[0] <= PIPE_BATCH  # the queued write ran before the next batch
