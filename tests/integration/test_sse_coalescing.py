"""SSE writes coalesce the events a log reader has ready: one chunk (one socket send) for many, framing unchanged.

The SSE body is the same bytes as one message per event (``id: <offset>`` / ``data: <json>``, then the status),
only cut into fewer chunks: at most ``SSE_COALESCE_EVENTS`` messages or about ``SSE_COALESCE_BYTES`` each. A tail
waiting on a live log wakes for each append and sends what landed; a client that leaves while the reader waits
ends it at once. Real stores: SQLite (a file) and the in-memory backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from boxwright.events import CustomEvent, Event, TextMessageContentEvent, encode_event
from boxwright.middleware.delivery import SSE_COALESCE_BYTES, _sse_stream
from boxwright.runs import EventLog, RunStore
from boxwright.stores.memory import memory_run_backend
from boxwright.stores.sqlite import open_database, sqlite_run_backend

RUN, THREAD = "r-coalesce", "t-coalesce"


def _backends(tmp: Path) -> dict[str, Callable[[], tuple[RunStore, EventLog, Callable[[], Any]]]]:
    def sqlite() -> tuple[RunStore, EventLog, Callable[[], Any]]:
        db = open_database(tmp / "runs.db")
        runs, log = sqlite_run_backend(db)
        return runs, log, db.close

    def memory() -> tuple[RunStore, EventLog, Callable[[], Any]]:
        runs, log = memory_run_backend()

        async def nothing() -> None:
            return None

        return runs, log, nothing

    return {"sqlite": sqlite, "memory": memory}


def _delta(i: int, size: int = 8) -> Event:
    return TextMessageContentEvent(message_id="m", delta=f"{i:0{size}d}")


def _expected_body(offsets: list[str], events: list[Event], status: dict[str, Any]) -> bytes:
    """The body one message per event would make."""
    body = b"retry: 1000\n\n"
    for offset, event in zip(offsets, events, strict=True):
        body += b"id: " + offset.encode() + b"\ndata: " + encode_event(event) + b"\n\n"
    return body + b"event: status\ndata: " + json.dumps(status, separators=(",", ":")).encode() + b"\n\n"


async def _chunks(log: EventLog, runs: RunStore, after: str = "-1") -> list[bytes]:
    stream = _sse_stream(log, runs, RUN, after, 1000)
    async with contextlib.aclosing(stream):
        return [chunk async for chunk in stream]


def _event_count(chunk: bytes) -> int:
    return chunk.count(b"\nid: ") + chunk.startswith(b"id: ")


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
def test_a_stored_backlog_goes_out_in_chunks_of_64_with_the_same_bytes(tmp_path: Path, backend: str) -> None:
    async def main() -> None:
        runs, log, close = _backends(tmp_path)[backend]()
        try:
            await runs.create_or_resume(RUN, THREAD)
            events = [_delta(i) for i in range(200)]
            offsets: list[str] = []
            for start in range(0, 200, 25):  # eight appends: a page spans batches
                offsets += await log.append(RUN, events[start : start + 25])
            await log.close(RUN)
            chunks = await _chunks(log, runs)
            # retry, 64 + 64 + 64 + 8 events, status: one send per event would be 202 chunks.
            assert [_event_count(c) for c in chunks] == [0, 64, 64, 64, 8, 0], [len(c) for c in chunks]
            assert b"".join(chunks) == _expected_body(offsets, events, {"status": "running"})
            # Resumed from an offset: the same framing from there on.
            tail = await _chunks(log, runs, offsets[149])
            assert b"".join(tail) == _expected_body(offsets[150:], events[150:], {"status": "running"})
            assert [_event_count(c) for c in tail] == [0, 50, 0]
        finally:
            await close()

    asyncio.run(main())


def test_a_chunk_stays_near_its_byte_bound(tmp_path: Path) -> None:
    """Large events: a chunk closes once it reaches SSE_COALESCE_BYTES (one message may pass it), never splits one."""

    async def main() -> None:
        runs, log, close = _backends(tmp_path)["sqlite"]()
        try:
            await runs.create_or_resume(RUN, THREAD)
            events = [_delta(i, 100_000) for i in range(12)]
            offsets = await log.append(RUN, events)
            await log.close(RUN)
            chunks = await _chunks(log, runs)
            message = len(b"id: " + offsets[0].encode() + b"\ndata: " + encode_event(events[0]) + b"\n\n")
            counts = [_event_count(c) for c in chunks[1:-1]]
            assert sum(counts) == 12 and max(counts) > 1, counts
            assert all(len(c) < SSE_COALESCE_BYTES + message for c in chunks), [len(c) for c in chunks]
            assert b"".join(chunks) == _expected_body(offsets, events, {"status": "running"})
        finally:
            await close()

    asyncio.run(main())


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
def test_a_live_tail_sends_each_append_as_it_lands_and_ends_when_its_client_leaves(
    tmp_path: Path, backend: str
) -> None:
    """A tail waits on the live log (its reader's step pending), gets each batch as it lands, once each and in
    order; a client leaving while the reader waits ends the stream at once, and the log is read again after."""

    async def main() -> None:
        runs, log, close = _backends(tmp_path)[backend]()
        try:
            await runs.create_or_resume(RUN, THREAD)
            stream = _sse_stream(log, runs, RUN, "-1", 1000)
            assert await anext(stream) == b"retry: 1000\n\n"
            received: list[bytes] = []
            offsets: list[str] = []
            events: list[Event] = []
            for batch in range(5):
                new = [_delta(batch * 10 + i) for i in range(10)]
                # Landing while the tail waits for the next chunk.
                appended = asyncio.get_running_loop().create_task(log.append(RUN, new))
                async with asyncio.timeout(10):
                    while sum(_event_count(c) for c in received) < (batch + 1) * 10:
                        received.append(await anext(stream))
                offsets += await appended
                events += new
            status = {"status": "running"}
            assert (
                b"".join(received)
                == _expected_body(offsets, events, status)[len(b"retry: 1000\n\n") :].split(b"event: status")[0]
            )
            # The client leaves while the reader waits for an append that never comes.
            waiting = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
            began = time.monotonic()
            await stream.aclose()
            assert time.monotonic() - began < 2.0
            marker = CustomEvent(name="after", value=1)
            later = await log.append(RUN, [marker])
            await log.close(RUN)
            again = await _chunks(log, runs, offsets[-1])
            assert b"".join(again) == _expected_body(later, [marker], status)
        finally:
            await close()

    asyncio.run(main())


def test_the_ready_events_of_one_wake_go_in_one_chunk(tmp_path: Path) -> None:
    """A tail behind by several appends (its client was slow) gets them in one chunk when it reads again."""

    async def main() -> None:
        runs, log, close = _backends(tmp_path)["sqlite"]()
        try:
            await runs.create_or_resume(RUN, THREAD)
            first = await log.append(RUN, [_delta(0)])
            stream = _sse_stream(log, runs, RUN, "-1", 1000)
            assert await anext(stream) == b"retry: 1000\n\n"
            assert _event_count(await anext(stream)) == 1
            # Five appends land while nobody reads: the next read has them all ready.
            later: list[str] = []
            for i in range(1, 6):
                later += await log.append(RUN, [_delta(i)])
            await asyncio.sleep(0.5)  # its reader reads ahead meanwhile (bounded), as it does while a client is slow
            chunk = await asyncio.wait_for(anext(stream), 10)
            assert _event_count(chunk) == 5, chunk
            assert chunk.startswith(b"id: " + later[0].encode()) and first[0].encode() not in chunk
            # Closed from another task than the one its reader waits in (a generator finalizer does that): at once.
            began = time.monotonic()
            await asyncio.get_running_loop().create_task(stream.aclose())
            assert time.monotonic() - began < 2.0
        finally:
            await close()

    asyncio.run(main())
