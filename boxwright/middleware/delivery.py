"""Tail a run's event log over HTTP: Server-Sent Events, long-poll JSON, WebSocket.

Every response only READS the log; the run is driven elsewhere (a background task, another
replica), so a client that goes away ends its own read and nothing else. Each reader resumes
from an offset the log issued: ``Last-Event-ID`` (what ``EventSource`` sends on its own when it
reconnects), else ``?offset=``, where ``-1`` (the default) is the start and ``now`` the tail.

Refusals come before any event and never as a 500: an unknown run is a 404, an offset that is
malformed, issued by another run's log, or past the tail is a 400 whose JSON names the problem
(a WebSocket, which has no status line once accepted, closes 4404 / 4400 with the reason).
A stream ends after the log is closed and every event was sent, with one last message carrying
the run record's status (SSE ``event: status``; WebSocket ``{"status", "closed": true}`` and
close 1000). The coordinator's WebSocket (``seq_frames``) speaks its spec's frames instead:
``{"seq", "chunk"}`` and ``{"type": "status", "record"}``, its refusals HTTP answers to the handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, Final

import msgspec
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response
from starlette.websockets import WebSocket, WebSocketDisconnect

from boxwright._json import JsonBoundsError, decode_json
from boxwright._ready import NotReady, ReadAhead
from boxwright.abort import AbortController, AbortSignal
from boxwright.errors import InvalidOffsetError, InvalidRunIdError
from boxwright.events import Event, encode_event
from boxwright.runs import (
    NOW_OFFSET,
    START_OFFSET,
    EventLog,
    RunRecord,
    RunStore,
    check_run_id,
    format_offset,
    offset_never_issued,
    parse_offset,
)

_logger = logging.getLogger("boxwright.middleware")

PING_INTERVAL_S: Final = 15
# One SSE write carries at most this many ready events, or about this many bytes (one message may pass it):
# a socket send per event was the cost of 1,000 tailers (about 600 us each), and a bound keeps a write small.
SSE_COALESCE_EVENTS: Final = 64
SSE_COALESCE_BYTES: Final = 256 * 1024
# How long EventSource waits before reconnecting; its own default (about 3 s) is a visible stall.
SSE_RETRY_MS: Final = 1000
DEFAULT_WAIT_MS: Final = 25_000
# Below common proxy idle timeouts (60 s), so a long-poll never dies waiting.
MAX_WAIT_MS: Final = 55_000
MAX_POLL_EVENTS: Final = 1000
WS_OFFSET_TIMEOUT_S: Final = 10.0
WS_REASON_BYTES: Final = 120
# The one message a client sends is an offset (a few dozen characters): anything longer is not one.
WS_MAX_MESSAGE_CHARS: Final = 4096

_json = msgspec.json.Encoder()


class DeliveryRefusal(Exception):
    """Why a tail cannot start: an HTTP status, a WebSocket close code and a message for the client."""

    def __init__(self, status: int, ws_code: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.ws_code = ws_code
        self.message = message
        self.code = code

    def response(self) -> Response:
        return json_response(self.status, {"error": self.message, "code": self.code})


def json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(_json.encode(payload), status_code=status, media_type="application/json", headers=headers)


def offset_for_last_seq(run_id: str, last_seq: str) -> str:
    """The offset after ``?lastSeq=`` (the coordinator's 0-based seq of the last event seen; ``-1``: none).

    Not an integer (or below -1) gives a string no offset check accepts: a 400 naming it, like a bad offset.
    """
    try:
        seq = int(last_seq)
    except ValueError:
        return f"lastSeq={last_seq}"
    # int() also takes outer whitespace, '+1', '1_0' and non-ASCII digits: only the canonical form is a seq.
    if seq < -1 or str(seq) != last_seq:
        return f"lastSeq={last_seq}"
    # Log seqs count from 1, the coordinator's from 0: event n of the log is lastSeq n-1.
    return START_OFFSET if seq == -1 else format_offset(run_id, seq + 1)


def seq_of_offset(run_id: str, offset: str) -> int:
    """The coordinator's 0-based seq of the event at ``offset`` (``-1`` for an empty log's tail)."""
    return (parse_offset(run_id, offset) or 0) - 1


def request_offset(request: Request) -> str:
    """The resume cursor of a request: ``Last-Event-ID``, else ``?offset=``, else ``?lastSeq=``, else ``-1``."""
    header = request.headers.get("last-event-id")
    if header:
        return header
    offset = request.query_params.get("offset")
    if offset is not None:
        return offset
    last_seq = request.query_params.get("lastSeq")
    run_id = request.path_params.get("run_id")
    if last_seq is not None and isinstance(run_id, str):
        return offset_for_last_seq(run_id, last_seq)
    return START_OFFSET


def refuse_bad_run_id(run_id: str) -> None:
    """``DeliveryRefusal`` 400 / close 4400 ``invalid_run_id`` naming the problem (``boxwright.ids``)."""
    try:
        check_run_id(run_id)
    except InvalidRunIdError as exc:
        raise DeliveryRefusal(400, 4400, str(exc), exc.code) from None


async def check_tail_request(log: EventLog, runs: RunStore, run_id: str, offset: str) -> RunRecord:
    """The run's record if ``run_id`` names a run and ``offset`` is one its log can resume from.

    Raises ``DeliveryRefusal``. A concrete offset past the log's tail is refused here rather
    than on the first read, so a stream never starts only to fail.
    """
    refuse_bad_run_id(run_id)
    try:
        record = await runs.get(run_id)
    except Exception as exc:
        _logger.error("run %r: could not read its record: %s", run_id, exc)
        raise DeliveryRefusal(503, 1011, "the run store could not be read", "store_unavailable") from None
    if record is None:
        raise DeliveryRefusal(404, 4404, "unknown run", "unknown_run")
    try:
        position = parse_offset(run_id, offset)
        if position:
            last = parse_offset(run_id, await log.tail(run_id)) or 0
            if position > last:
                raise offset_never_issued(run_id, offset, last)
    except InvalidOffsetError as exc:
        raise DeliveryRefusal(400, 4400, f"invalid offset: {exc.reason}", "invalid_offset") from None
    except Exception as exc:
        _logger.error("run %r: could not read its log's tail: %s", run_id, exc)
        raise DeliveryRefusal(503, 1011, "the run log could not be read", "log_unavailable") from None
    return record


async def final_status(runs: RunStore, run_id: str) -> dict[str, Any]:
    """``{status, error?}`` of the run as stored now (``status: null`` if the store cannot say)."""
    try:
        record = await runs.get(run_id)
    except Exception as exc:
        _logger.error("run %r: could not read its final status: %s", run_id, exc)
        record = None
    if record is None:
        return {"status": None}
    status: dict[str, Any] = {"status": record.status}
    if record.error is not None:
        status["error"] = record.error
    return status


@contextlib.asynccontextmanager
async def _reading(
    log: EventLog, run_id: str, offset: str, signal: AbortSignal, *, live: bool = True
) -> AsyncIterator[AsyncIterator[tuple[str, Event]]]:
    reader = log.read(run_id, offset, signal=signal, live=live)
    try:
        yield reader
    finally:
        # A reader left suspended would hold its log wake-up until garbage collection.
        aclose = getattr(reader, "aclose", None)
        if aclose is not None:
            await aclose()


# -- SSE ------------------------------------------------------------------------------------------


def _sse_message(offset: str, event: Event) -> bytes:
    # Offsets are [0-9a-f_] and encoded JSON holds no raw newline, so neither can break the framing.
    return b"id: " + offset.encode() + b"\ndata: " + encode_event(event) + b"\n\n"


async def _sse_stream(
    log: EventLog, runs: RunStore, run_id: str, offset: str, retry_ms: int
) -> AsyncGenerator[bytes, None]:
    controller = AbortController()
    try:
        yield f"retry: {retry_ms}\n\n".encode()
        async with _reading(log, run_id, offset, controller.signal) as reader:
            async with ReadAhead(reader, SSE_COALESCE_EVENTS, name=f"boxwright SSE read {run_id!r}") as ahead:
                try:
                    async with contextlib.aclosing(_coalesced(ahead)) as chunks:
                        async for chunk in chunks:
                            yield chunk
                finally:
                    controller.abort("the SSE client went away")
        yield b"event: status\ndata: " + _json.encode(await final_status(runs, run_id)) + b"\n\n"
    except Exception as exc:
        # Headers are gone: end the stream without a status, and EventSource resumes from its last id.
        _logger.error("run %r: SSE tail failed: %s", run_id, exc)
    finally:
        controller.abort("the SSE client went away")


async def _coalesced(ahead: ReadAhead[tuple[str, Event]]) -> AsyncGenerator[bytes, None]:
    """The SSE messages of ``ahead``'s events, those ready together in one chunk (one socket send for many).

    Waits for one event, then takes what the reader has read ahead meanwhile (it runs on while a
    chunk is sent), up to ``SSE_COALESCE_EVENTS`` messages or ``SSE_COALESCE_BYTES``. The bytes
    are the messages one after the other, exactly as if each were sent alone. A read that fails
    after some were taken sends those first, then raises.
    """
    while True:
        try:
            event_offset, event = await ahead.next()
        except StopAsyncIteration:
            return
        parts = [_sse_message(event_offset, event)]
        size = len(parts[0])
        ended = False
        failure: Exception | None = None
        while len(parts) < SSE_COALESCE_EVENTS and size < SSE_COALESCE_BYTES:
            try:
                item = ahead.ready()
            except StopAsyncIteration:
                ended = True
                break
            except Exception as exc:
                failure = exc
                break
            if isinstance(item, NotReady):
                break
            message = _sse_message(*item)
            parts.append(message)
            size += len(message)
        yield parts[0] if len(parts) == 1 else b"".join(parts)
        if failure is not None:
            raise failure
        if ended:
            return


async def sse_response(
    log: EventLog,
    runs: RunStore,
    run_id: str,
    request: Request,
    *,
    ping_s: float = PING_INTERVAL_S,
    retry_ms: int = SSE_RETRY_MS,
) -> Response:
    """Stream ``run_id``'s events as SSE from the request's offset, then its final status.

    Each message is ``id: <offset>`` + ``data: <event JSON>``; after the log is closed and
    drained, ``event: status`` + ``data: {status, error?}`` (no id) and the stream ends. A
    ``: ping`` comment goes out every ``ping_s`` seconds. Refusals: 404 unknown run, 400 bad
    offset (JSON ``{error, code}``).
    """
    offset = request_offset(request)
    try:
        await check_tail_request(log, runs, run_id, offset)
    except DeliveryRefusal as refusal:
        return refusal.response()
    return EventSourceResponse(
        _sse_stream(log, runs, run_id, offset, retry_ms),
        headers={"Cache-Control": "no-cache"},
        ping=ping_s,
        sep="\n",
    )


# -- long-poll ------------------------------------------------------------------------------------


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise DeliveryRefusal(400, 4400, f"?{name}= must be an integer", f"invalid_{name}") from None
    return max(low, min(value, high))


async def _watch_disconnect(request: Request, controller: AbortController) -> None:
    # A plain HTTP endpoint is not cancelled when its client leaves; this ends the wait instead.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            controller.abort("the long-poll client went away")
            return


async def _collect(
    log: EventLog, run_id: str, offset: str, limit: int, signal: AbortSignal, *, live: bool
) -> list[tuple[str, Event]]:
    page: list[tuple[str, Event]] = []
    async with _reading(log, run_id, offset, signal, live=live) as reader:
        async for item in reader:
            page.append(item)
            if live or len(page) >= limit:
                break
    return page


async def long_poll_response(log: EventLog, runs: RunStore, run_id: str, request: Request) -> Response:
    """JSON ``{events: [{offset, event}], nextOffset, status, error?, closed}`` after the request's offset.

    Waits up to ``?wait=`` ms (default 25 000, at most 55 000) for a first event when none is
    stored yet, then returns what is there (at most ``?limit=``, default and cap 1000).
    ``closed`` says no event will ever follow ``nextOffset``: poll again from ``nextOffset``
    until it is true. ``now`` resolves to the tail at the time of the call.
    """
    offset = request_offset(request)
    try:
        wait_ms = _int_param(request, "wait", DEFAULT_WAIT_MS, 0, MAX_WAIT_MS)
        limit = _int_param(request, "limit", MAX_POLL_EVENTS, 1, MAX_POLL_EVENTS)
        await check_tail_request(log, runs, run_id, offset)
    except DeliveryRefusal as refusal:
        return refusal.response()
    if offset == NOW_OFFSET:
        offset = await log.tail(run_id)  # concrete, so nothing landing from now on is missed by the next poll
    controller = AbortController()
    try:
        page = await _collect(log, run_id, offset, limit, controller.signal, live=False)
        if not page and wait_ms > 0 and not await log.is_closed(run_id):
            loop = asyncio.get_running_loop()
            timer = loop.call_later(wait_ms / 1000, controller.abort, "long-poll wait elapsed")
            watcher = loop.create_task(_watch_disconnect(request, controller))
            try:
                page = await _collect(log, run_id, offset, 1, controller.signal, live=True)
            finally:
                timer.cancel()
                watcher.cancel()
                await asyncio.wait({watcher})
            if page and len(page) < limit:
                page += await _collect(log, run_id, page[-1][0], limit - 1, AbortSignal(), live=False)
        closed = await log.is_closed(run_id)
        next_offset = page[-1][0] if page else offset
        if closed:
            # Closed was read first, so this tail is final.
            closed = parse_offset(run_id, await log.tail(run_id)) == parse_offset(run_id, next_offset)
    except Exception as exc:
        _logger.error("run %r: long-poll failed: %s", run_id, exc)
        return json_response(503, {"error": "the run log could not be read", "code": "log_unavailable"})
    finally:
        controller.abort("long-poll answered")
    status = await final_status(runs, run_id)
    body = {
        "events": [{"offset": event_offset, "event": msgspec.Raw(encode_event(event))} for event_offset, event in page],
        "nextOffset": next_offset,
        **status,
        "closed": closed,
    }
    return json_response(200, body, headers={"Cache-Control": "no-store"})


# -- WebSocket ------------------------------------------------------------------------------------


def _close_reason(text: str) -> str:
    # A close frame's reason is at most 123 bytes; cut on a character boundary.
    return text.encode()[:WS_REASON_BYTES].decode("utf-8", "ignore")


def _offset_from_message(message: Mapping[str, Any]) -> str | None:
    text: object = message.get("text")
    raw = message.get("bytes")
    if text is None and isinstance(raw, bytes):
        text = raw[: WS_MAX_MESSAGE_CHARS * 4 + 1].decode("utf-8", "replace")
    if not isinstance(text, str):
        return None
    if len(text) > WS_MAX_MESSAGE_CHARS:
        raise DeliveryRefusal(
            400, 1009, f"the first message is over {WS_MAX_MESSAGE_CHARS} characters; send an offset", "too_large"
        )
    if text.startswith("{"):
        try:
            value = decode_json(text).get("offset")
        except JsonBoundsError as exc:
            raise DeliveryRefusal(
                400, 1007, f"the first message is not JSON a tail accepts: {exc}", "invalid_json"
            ) from None
        except (msgspec.DecodeError, AttributeError):
            return text  # refused by the offset check, which names it
        return value if isinstance(value, str) else text
    return text


def _query_offset(websocket: WebSocket) -> str | None:
    """A WebSocket's cursor from its query: ``?offset=``, else ``?lastSeq=``; ``None`` when it has neither."""
    offset = websocket.query_params.get("offset")
    if offset is not None:
        return offset
    last_seq = websocket.query_params.get("lastSeq")
    run_id = websocket.path_params.get("run_id")
    if last_seq is not None and isinstance(run_id, str):
        return offset_for_last_seq(run_id, last_seq)
    return None


async def _ws_offset(websocket: WebSocket, timeout_s: float) -> str | None:
    if (offset := _query_offset(websocket)) is not None:
        return offset
    try:
        message = await asyncio.wait_for(websocket.receive(), timeout_s)
    except TimeoutError:
        raise DeliveryRefusal(
            400, 4400, "expected an offset: ?offset= or a first message ('-1', 'now', an offset)", "no_offset"
        ) from None
    if message["type"] == "websocket.disconnect":
        return None
    offset = _offset_from_message(message)
    if offset is None:
        raise DeliveryRefusal(400, 4400, "the first message must carry an offset", "no_offset")
    return offset


async def _drain_inbound(websocket: WebSocket, controller: AbortController) -> None:
    # Inbound frames are ignored; reading them is how a silent tail learns its client has gone.
    try:
        while (await websocket.receive())["type"] != "websocket.disconnect":
            pass
    except Exception:
        pass
    controller.abort("the WebSocket client went away")


async def record_view(runs: RunStore, log: EventLog, run_id: str) -> dict[str, Any] | None:
    """The record as a client reads it (``GET /runs/{id}``): its fields plus the log's ``lastSeq``; ``None``: unknown.

    Raises what the stores raise.
    """
    record = await runs.get(run_id)
    if record is None:
        return None
    view: dict[str, Any] = msgspec.to_builtins(record)
    view["lastSeq"] = seq_of_offset(run_id, await log.tail(run_id))
    return view


async def refuse_handshake(websocket: WebSocket, refusal: DeliveryRefusal) -> None:
    """Answer an unaccepted WebSocket's handshake with ``refusal``'s HTTP status and JSON body.

    An HTTP answer says 401/404/400 the way an HTTP client reads it (a close before accept is a bare
    403 whatever its code); a server without the ASGI denial-response extension can only accept and
    close with the code.
    """
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(refusal.response())
    else:
        await websocket.accept()
        await websocket.close(refusal.ws_code, _close_reason(refusal.message))


async def websocket_tail(
    websocket: WebSocket,
    log: EventLog,
    runs: RunStore,
    run_id: str,
    *,
    offset_timeout_s: float = WS_OFFSET_TIMEOUT_S,
    seq_frames: bool = False,
) -> None:
    """Tail ``run_id`` over an (unaccepted) Starlette WebSocket.

    Offset frames (the default, ``/ws``): the offset is ``?offset=`` (or ``?lastSeq=``), else the
    first client message (the bare offset, or ``{"offset": ...}``). Frames: ``{"offset", "event"}``
    per event, then ``{"status", "error"?, "closed": true}`` and close 1000. Unknown run: close
    4404; bad offset: close 4400 with the reason.

    Seq frames (``seq_frames=True``, the coordinator's ``/stream``): the cursor is ``?lastSeq=``
    (or ``?offset=``), default ``-1``, and refusals are HTTP answers to the handshake (404, 400).
    Frames: ``{"seq", "chunk"}`` per event (``seq`` 0-based), then ``{"type": "status", "record"}``
    (the record with its ``lastSeq``) and close 1000 ``run complete``.

    Either way, a failing read closes 1011 with a reason of at most 120 bytes (the error is logged).
    """
    controller = AbortController()
    watcher: asyncio.Task[None] | None = None
    if seq_frames:
        try:
            # Checked before the handshake is answered, so a refused client sees a status, not a close.
            refuse_bad_run_id(run_id)
            offset = _query_offset(websocket) or START_OFFSET
            await check_tail_request(log, runs, run_id, offset)
        except DeliveryRefusal as refusal:
            with contextlib.suppress(Exception):
                await refuse_handshake(websocket, refusal)
            return
    await websocket.accept()
    try:
        if not seq_frames:
            # Before the offset: a client that sends none must not wait out its timeout to hear the id is bad.
            refuse_bad_run_id(run_id)
            found = await _ws_offset(websocket, offset_timeout_s)
            if found is None:
                return
            offset = found
            await check_tail_request(log, runs, run_id, offset)
        watcher = asyncio.get_running_loop().create_task(_drain_inbound(websocket, controller))
        async with _reading(log, run_id, offset, controller.signal) as reader:
            async for event_offset, event in reader:
                if seq_frames:
                    head = b'{"seq":' + str(seq_of_offset(run_id, event_offset)).encode() + b',"chunk":'
                else:
                    head = b'{"offset":' + _json.encode(event_offset) + b',"event":'
                await websocket.send_text((head + encode_event(event) + b"}").decode())
        if controller.signal.aborted:
            return
        if seq_frames:
            last: dict[str, Any] = {"type": "status", "record": await record_view(runs, log, run_id)}
        else:
            last = {**await final_status(runs, run_id), "closed": True}
        await websocket.send_text(_json.encode(last).decode())
        await websocket.close(1000, "run complete")
    except DeliveryRefusal as refusal:
        with contextlib.suppress(Exception):
            await websocket.close(refusal.ws_code, _close_reason(refusal.message))
    except (WebSocketDisconnect, OSError):
        pass  # the client left mid-send: its read simply ends
    except Exception as exc:
        if controller.signal.aborted:
            return  # the client left first; whatever failed after that concerns nobody
        _logger.error("run %r: WebSocket tail failed: %s", run_id, exc, exc_info=True)
        with contextlib.suppress(Exception):
            await websocket.close(1011, _close_reason(f"tail failed: {type(exc).__name__}"))
    finally:
        controller.abort("the WebSocket tail ended")
        if watcher is not None:
            watcher.cancel()
            await asyncio.wait({watcher})


__all__ = [
    "DEFAULT_WAIT_MS",
    "MAX_POLL_EVENTS",
    "MAX_WAIT_MS",
    "PING_INTERVAL_S",
    "SSE_RETRY_MS",
    "DeliveryRefusal",
    "check_tail_request",
    "final_status",
    "json_response",
    "long_poll_response",
    "record_view",
    "refuse_handshake",
    "request_offset",
    "seq_of_offset",
    "sse_response",
    "websocket_tail",
]
