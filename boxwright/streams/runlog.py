"""A run's event log as a read-only Durable Streams JSON stream: ``GET <prefix>/runs/{id}/stream``.

Each stored event is one JSON message; offsets are the run log's own (the ones the SSE tail
and ``Last-Event-ID`` use), so a client can switch between the two. The stream is closed when
the run's log is. Only the run's driver writes, under its epoch fence: PUT, POST and DELETE
from clients are 405.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from boxwright.abort import AbortController
from boxwright.errors import InvalidOffsetError, InvalidRunIdError
from boxwright.events import Event, encode_event
from boxwright.runs import NOW_OFFSET, START_OFFSET, EventLog, RunStore, check_run_id, format_offset, run_offset_tag
from boxwright.streams.protocol import (
    JSON_TYPE,
    SECURITY_HEADERS,
    Control,
    json_body,
    next_cursor,
    sse_control,
    sse_data,
)

PAGE = 4096  # events per catch-up response or SSE data event
LONG_POLL_S = 20.0
SSE_MAX_AGE_S = 60.0


def _respond(status: int, headers: dict[str, str] | None = None, body: bytes = b"") -> Response:
    return Response(body, status_code=status, headers={**SECURITY_HEADERS, **(headers or {})})


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return _respond(status, {"content-type": "text/plain", **(headers or {})}, message.encode())


@contextlib.asynccontextmanager
async def _closing(reader: AsyncIterator[tuple[str, Event]]) -> AsyncIterator[AsyncIterator[tuple[str, Event]]]:
    """``aclosing`` for ``EventLog.read``, typed as a plain iterator by the protocol (stores return generators)."""
    try:
        yield reader
    finally:
        aclose = getattr(reader, "aclose", None)
        if aclose is not None:
            await aclose()


async def _page(log: EventLog, run_id: str, after: str) -> tuple[list[bytes], str, bool]:
    """Up to ``PAGE`` events after ``after``: their JSON, the next offset, whether that is the tail."""
    messages: list[bytes] = []
    offset = after
    async with _closing(log.read(run_id, after, live=False)) as events:
        async for offset, event in events:
            messages.append(encode_event(event))
            if len(messages) == PAGE:
                return messages, offset, False
    if offset == START_OFFSET:
        offset = format_offset(run_id, 0)
    return messages, offset, True


async def _wait_for_append(log: EventLog, run_id: str, after: str, timeout: float) -> bool:
    """Whether an event after ``after`` landed (or the log closed) within ``timeout`` seconds."""
    controller = AbortController()
    reader = log.read(run_id, after, live=True, signal=controller.signal)
    try:
        async with _closing(reader):
            await asyncio.wait_for(anext(reader), timeout)
        return True
    except StopAsyncIteration:
        return True  # the log closed
    except TimeoutError:
        return False
    finally:
        controller.abort("long-poll over")


class RunStreams:
    """The read side of the protocol over one run store and event log."""

    def __init__(
        self,
        runs: RunStore,
        log: EventLog,
        *,
        long_poll_timeout: float = LONG_POLL_S,
        sse_max_age: float = SSE_MAX_AGE_S,
    ) -> None:
        self.runs = runs
        self.log = log
        self.long_poll_timeout = long_poll_timeout
        self.sse_max_age = sse_max_age

    async def response(self, request: Request, run_id: str) -> Response:
        if request.method not in ("GET", "HEAD"):
            return _error(405, "a run's stream is written by its driver only; clients read it", {"allow": "GET, HEAD"})
        try:
            check_run_id(run_id)
        except InvalidRunIdError as exc:
            return _error(400, str(exc))
        if await self.runs.get(run_id) is None:
            return _error(404, f"unknown run {run_id!r}")
        try:
            return await self._read(request, run_id)
        except InvalidOffsetError as exc:
            return _error(400, str(exc))

    async def _read(self, request: Request, run_id: str) -> Response:
        if request.method == "HEAD":
            headers = {"content-type": JSON_TYPE, "stream-next-offset": await self.log.tail(run_id)}
            headers["cache-control"] = "no-store"
            if await self.log.is_closed(run_id):
                headers["stream-closed"] = "true"
            return _respond(200, headers)
        query = request.query_params
        offsets = query.getlist("offset")
        live = query.get("live")
        if len(offsets) > 1 or (offsets and offsets[0] == ""):
            return _error(400, "send one non-empty offset parameter")
        if live not in (None, "long-poll", "sse"):
            return _error(400, "live must be 'long-poll' or 'sse'")
        if live is not None and not offsets:
            return _error(400, f"live={live} needs an offset (-1 for the start, now for the tail)")
        offset = offsets[0] if offsets else START_OFFSET
        if offset == NOW_OFFSET:
            offset = await self.log.tail(run_id)
            if live is None:
                headers = {"content-type": JSON_TYPE, "stream-next-offset": offset, "stream-up-to-date": "true"}
                headers["cache-control"] = "no-store"
                if await self.log.is_closed(run_id):
                    headers["stream-closed"] = "true"
                return _respond(200, headers, b"[]")
        closed = await self.log.is_closed(run_id)  # before the read: a closed log takes no more events
        messages, end, at_tail = await _page(self.log, run_id, offset)  # also checks the offset (400)
        if live == "sse":
            return StreamingResponse(
                self._sse(run_id, offset, query.get("cursor")),
                headers={**SECURITY_HEADERS, "content-type": "text/event-stream", "cache-control": "no-cache"},
            )
        if live == "long-poll" and not messages:
            if closed:
                headers = {"stream-next-offset": end, "stream-up-to-date": "true", "stream-closed": "true"}
                return _respond(204, headers)
            if await _wait_for_append(self.log, run_id, offset, self.long_poll_timeout):
                closed = await self.log.is_closed(run_id)
                messages, end, at_tail = await _page(self.log, run_id, offset)
            if not messages:
                headers = {"stream-next-offset": end, "stream-up-to-date": "true"}
                if closed:
                    headers["stream-closed"] = "true"
                else:
                    headers["stream-cursor"] = next_cursor(query.get("cursor"))
                return _respond(204, headers)
        headers = {"content-type": JSON_TYPE, "stream-next-offset": end, "cache-control": "private, no-cache"}
        final = at_tail and closed
        if at_tail:
            headers["stream-up-to-date"] = "true"
        if final:
            headers["stream-closed"] = "true"
        if live == "long-poll":
            headers["stream-cursor"] = next_cursor(query.get("cursor"))
        etag = f'"{run_offset_tag(run_id)}:{offset}:{end}{":c" if final else ""}"'
        headers["etag"] = etag
        if request.headers.get("if-none-match") == etag:
            return _respond(304, {k: v for k, v in headers.items() if k != "content-type"})
        return _respond(200, headers, json_body(messages))

    async def _sse(self, run_id: str, offset: str, client_cursor: str | None) -> AsyncIterator[bytes]:
        cursor = next_cursor(client_cursor)
        ends_at = time.monotonic() + self.sse_max_age
        announce = True
        while True:
            closed = await self.log.is_closed(run_id)
            messages, end, at_tail = await _page(self.log, run_id, offset)
            final = at_tail and closed
            if messages:
                control = Control(
                    stream_next_offset=end,
                    stream_cursor=None if final else cursor,
                    up_to_date=True if at_tail else None,
                    stream_closed=True if final else None,
                )
                yield sse_data(json_body(messages), text=True) + sse_control(control)
                offset = end
                announce = False
                if final:
                    return
                if not at_tail:
                    continue
            elif final:
                yield sse_control(Control(end, up_to_date=True, stream_closed=True))
                return
            elif announce:
                yield sse_control(Control(end, stream_cursor=cursor, up_to_date=True))
                announce = False
            remaining = ends_at - time.monotonic()
            if remaining <= 0:
                return
            if not await _wait_for_append(self.log, run_id, offset, min(remaining, self.long_poll_timeout)):
                yield b": keepalive\n\n"
