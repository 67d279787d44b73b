"""The Durable Streams protocol as an ASGI app: any path is a stream (PUT, POST, GET, HEAD, DELETE).

``StreamsApp(store)`` answers every method on every path of its mount; the conformance suite
uses ``/v1/stream/<name>``. Bad input is a 4xx with a message naming the header or parameter,
never a 500 (spec §1.16). Live reads: ``live=long-poll`` waits up to ``long_poll_timeout``;
``live=sse`` streams data + control pairs and ends after ``sse_max_age`` so CDNs can collapse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from boxwright.errors import StoreUnavailableError
from boxwright.streams.protocol import (
    CORS_ALLOW_HEADERS,
    JSON_TYPE,
    NOW,
    OCTET_STREAM,
    SECURITY_HEADERS,
    START,
    BadRequest,
    Control,
    format_offset,
    is_true,
    json_body,
    json_messages,
    media_type,
    next_cursor,
    parse_expires_at,
    parse_offset,
    parse_uint,
    sse_control,
    sse_data,
    sse_is_text,
    valid_media_type,
)
from boxwright.streams.runlog import RunStreams
from boxwright.streams.store import UPSERT_PRODUCER, Producer, Stream, StreamStore

log = logging.getLogger("boxwright.streams")

DEFAULT_MAX_BODY = 16 * 1024 * 1024
DEFAULT_READ_CHUNK = 8 * 1024 * 1024
DEFAULT_LONG_POLL_S = 20.0
DEFAULT_SSE_MAX_AGE_S = 60.0
_RUN_STREAM = re.compile(r"/runs/([^/]+)/stream")


@dataclass(frozen=True)
class StreamsLimits:
    max_body: int = DEFAULT_MAX_BODY  # larger appends are 413
    read_chunk: int = DEFAULT_READ_CHUNK  # about this many bytes per catch-up response
    long_poll_timeout: float = DEFAULT_LONG_POLL_S
    sse_max_age: float = DEFAULT_SSE_MAX_AGE_S


class _TooLarge(Exception):
    pass


def _headers(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    headers = dict(SECURITY_HEADERS)
    if extra:
        headers.update(extra)
    return headers


def _respond(status: int, headers: Mapping[str, str] | None = None, body: bytes = b"") -> Response:
    # Content-Type goes through headers=, never media_type=: Starlette would add "; charset=utf-8" to text/*.
    return Response(body, status_code=status, headers=_headers(headers))


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    extra = {"content-type": "text/plain", **(headers or {})}
    return _respond(status, extra, message.encode())


def _etag(stream: Stream, start: int, end: int, closed: bool) -> str:
    return f'"{stream.id}:{start}:{end}{":c" if closed else ""}"'


class StreamsApp:
    def __init__(
        self,
        store: StreamStore,
        limits: StreamsLimits | None = None,
        *,
        run_streams: RunStreams | None = None,
        on_shutdown: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.limits = limits or StreamsLimits()
        # With a run backend, /runs/{id}/stream is that run's read-only log, not a stream of the store.
        self.run_streams = run_streams
        self._on_shutdown = on_shutdown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        try:
            response = await self.handle(request)
        except BadRequest as exc:
            response = _error(400, str(exc))
        except _TooLarge:
            response = _error(413, f"the body is over this server's cap of {self.limits.max_body} bytes")
        except StoreUnavailableError as exc:
            # The store (a Redis server) is down. This answer acknowledges nothing; the change may still have
            # landed if the connection dropped mid-commit, which a producer's retry (same seq) deduplicates.
            log.warning("streams: %s %s refused: %s", request.method, scope.get("path", ""), exc)
            response = _error(503, "the stream store is unavailable; retry later", {"retry-after": "1"})
        await response(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.store.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.store.close()
                if self._on_shutdown is not None:
                    await self._on_shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def stream_path(self, request: Request) -> str:
        path: str = request.scope["path"]
        root: str = request.scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        return path or "/"

    async def handle(self, request: Request) -> Response:
        method = request.method
        if method == "OPTIONS":
            asked = request.headers.get("access-control-request-headers")
            allow = f"{asked}, {CORS_ALLOW_HEADERS}" if asked else CORS_ALLOW_HEADERS
            return _respond(
                204,
                {
                    "access-control-allow-methods": "GET, HEAD, PUT, POST, DELETE, OPTIONS",
                    "access-control-allow-headers": allow,
                    "access-control-max-age": "600",
                },
            )
        path = self.stream_path(request)
        if "/__ds/" in path + "/" or path.startswith("__ds"):
            # The reserved subscription namespace (protocol §6-7): not implemented, and never a stream name.
            return _error(404, "the __ds namespace is reserved for subscription APIs, which this server does not offer")
        if self.run_streams is not None:
            run = _RUN_STREAM.fullmatch(path)
            if run is not None:
                return await self.run_streams.response(request, run[1])
        if method == "PUT":
            return await self.put(request, path)
        if method == "POST":
            return await self.post(request, path)
        if method in ("GET", "HEAD"):
            return await self.get(request, path)
        if method == "DELETE":
            return await self.delete(path)
        return _error(405, f"method {method} is not part of the protocol", {"allow": "GET, HEAD, PUT, POST, DELETE"})

    async def _body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limits.max_body:
            raise _TooLarge
        parts: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.limits.max_body:
                raise _TooLarge
            parts.append(chunk)
        return b"".join(parts)

    async def _live(self, path: str) -> Stream | Response:
        stream = await self.store.get(path)
        if stream is None:
            return _error(404, f"no stream at {path}")
        if stream.soft_deleted:
            return _error(410, f"the stream at {path} was deleted (its forks still share its data)")
        return stream

    # -- PUT ---------------------------------------------------------------------------------------

    async def put(self, request: Request, path: str) -> Response:
        headers = request.headers
        content_type = headers.get("content-type") or OCTET_STREAM
        if not valid_media_type(content_type):
            raise BadRequest(f"Content-Type {content_type[:80]!r} is not a media type (type/subtype)")
        ttl_header = headers.get("stream-ttl")
        expires_header = headers.get("stream-expires-at")
        if ttl_header is not None and expires_header is not None:
            raise BadRequest("send Stream-TTL or Stream-Expires-At, not both")
        ttl = parse_uint("Stream-TTL", ttl_header) if ttl_header is not None else None
        expires_at_s = parse_expires_at(expires_header) if expires_header is not None else None
        closed = is_true(headers.get("stream-closed"))
        source_path = headers.get("stream-forked-from")
        fork_offset = headers.get("stream-fork-offset")
        sub_header = headers.get("stream-fork-sub-offset")
        if source_path is None and (sub_header is not None or fork_offset is not None):
            raise BadRequest("Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From")
        sub = parse_uint("Stream-Fork-Sub-Offset", sub_header) if sub_header is not None else 0
        if sub > 0 and fork_offset is None:
            raise BadRequest("a non-zero Stream-Fork-Sub-Offset needs Stream-Fork-Offset")
        body = await self._body(request)

        # The source first: from the lookup of ``path`` to ``create`` nothing awaits, so two PUTs of one
        # new path cannot both create it.
        source = await self.store.get(source_path) if source_path is not None else None
        existing = await self.store.get(path)
        if existing is not None and existing.soft_deleted:
            return _error(409, f"the stream at {path} was deleted but its forks keep it; the path cannot be reused")

        if source_path is not None:
            if existing is None:
                if source is None:
                    return _error(404, f"the fork source {source_path} does not exist")
                if source.soft_deleted:
                    return _error(409, f"the fork source {source_path} was deleted")
        fork_config = f"{source_path}|{fork_offset or ''}|{sub}" if source_path is not None else None
        if source is not None and headers.get("content-type") is None:
            content_type = source.content_type

        if existing is not None:
            same = (
                media_type(existing.content_type) == media_type(content_type)
                and existing.ttl == ttl
                and existing.expires_at_s == expires_at_s
                and existing.closed == closed
                and (fork_config is None or existing.fork_config == fork_config)
            )
            if not same:
                return _error(409, f"a stream exists at {path} with a different configuration")
            return _respond(200, self._meta_headers(existing, request))

        is_json = media_type(content_type) == JSON_TYPE
        items = json_messages(body, allow_empty=True) if is_json and body else ([body] if body else [])
        stream = Stream(
            id=self.store.new_id(),
            path=path,
            content_type=content_type,
            json=is_json,
            ttl=ttl,
            expires_at=expires_header,
            expires_at_s=expires_at_s,
            closed=closed,
        )
        if source is not None:
            if media_type(source.content_type) != media_type(content_type):
                return _error(409, f"the fork's Content-Type {content_type!r} differs from the source's")
            point = source.tail if fork_offset is None else self._fork_point(fork_offset)
            if point > source.tail:
                raise BadRequest(f"Stream-Fork-Offset {fork_offset!r} is beyond the source's tail")
            if sub and source.tail == 0:
                raise BadRequest("a sub-offset into an empty source")
            point += sub
            if point > source.tail:
                raise BadRequest(f"Stream-Fork-Sub-Offset {sub} overshoots the source's tail")
            inherited, end = source.slice(0, 1 << 62) if point else ([], 0)
            inherited = self._cut(source, inherited, point) if point else []
            items = inherited + items
            stream.parent = source.path
            stream.fork_config = fork_config
            if ttl is None and expires_at_s is None:
                stream.ttl, stream.expires_at, stream.expires_at_s = source.ttl, source.expires_at, source.expires_at_s
            del end
        statements = self.store.create(stream, items)
        count = len(stream.items)
        await self.store.commit(statements, after=lambda: self._published(stream, count))
        headers_out = self._meta_headers(stream, request)
        return _respond(201, headers_out)

    @staticmethod
    def _fork_point(value: str) -> int:
        if value == START:
            return 0
        try:
            return parse_offset(value)
        except BadRequest:
            raise BadRequest(f"Stream-Fork-Offset {value[:80]!r} is malformed") from None

    @staticmethod
    def _cut(source: Stream, items: list[bytes], point: int) -> list[bytes]:
        """The source's items up to ``point``, the last one split when the point falls inside it."""
        out: list[bytes] = []
        position = 0
        for item in items:
            if position >= point:
                break
            size = 1 if source.json else len(item)
            if position + size > point:
                item = item[: point - position]
                size = len(item)
            out.append(item)
            position += size
        return out

    def _meta_headers(self, stream: Stream, request: Request) -> dict[str, str]:
        headers = {
            "content-type": stream.content_type,
            "stream-next-offset": format_offset(stream.tail),
            "location": str(request.url.replace(query="", fragment="")),
        }
        if stream.closed_visible:
            headers["stream-closed"] = "true"
        if stream.ttl is not None:
            headers["stream-ttl"] = str(stream.ttl)
        if stream.expires_at is not None:
            headers["stream-expires-at"] = stream.expires_at
        return headers

    @staticmethod
    def _published(stream: Stream, count: int, closed: bool | None = None) -> None:
        stream.visible = max(stream.visible, count)
        if closed or (closed is None and stream.closed):
            stream.closed_visible = True
        stream.wake()

    # -- POST --------------------------------------------------------------------------------------

    async def post(self, request: Request, path: str) -> Response:
        headers = request.headers
        close = is_true(headers.get("stream-closed"))
        pid, epoch_h, seq_h = headers.get("producer-id"), headers.get("producer-epoch"), headers.get("producer-seq")
        producer: tuple[str, int, int] | None = None
        if pid is not None or epoch_h is not None or seq_h is not None:
            if pid is None or epoch_h is None or seq_h is None:
                raise BadRequest("Producer-Id, Producer-Epoch and Producer-Seq come together or not at all")
            if not pid:
                raise BadRequest("Producer-Id must not be empty")
            producer = (pid, parse_uint("Producer-Epoch", epoch_h), parse_uint("Producer-Seq", seq_h))
        stream_seq = headers.get("stream-seq")
        body = await self._body(request)
        content_type = headers.get("content-type")
        if not body and not close:
            raise BadRequest("an append needs a body (or Stream-Closed: true to close)")
        if body and content_type is None:
            raise BadRequest("an append with a body needs a Content-Type")
        if body and content_type is not None and not valid_media_type(content_type):
            raise BadRequest(f"Content-Type {content_type[:80]!r} is not a media type (type/subtype)")

        found = await self._live(path)
        if isinstance(found, Response):
            return found
        stream = found
        stream.touch()

        state = stream.producers.get(producer[0]) if producer is not None else None
        if producer is not None and state is not None and producer[1] < state.epoch:
            return _error(
                403, "stale Producer-Epoch: a newer epoch fenced this producer", {"producer-epoch": str(state.epoch)}
            )
        if stream.closed:
            closed_headers = {"stream-closed": "true", "stream-next-offset": format_offset(stream.pending_tail)}
            if producer is not None and stream.closed_by == "/".join(map(str, producer)):
                await self._settled(stream)
                return _respond(
                    204, {**closed_headers, "producer-epoch": str(producer[1]), "producer-seq": str(producer[2])}
                )
            if not body and producer is None:
                await self._settled(stream)
                return _respond(204, closed_headers)
            return _error(409, "the stream is closed", closed_headers)
        if body and content_type is not None and media_type(content_type) != media_type(stream.content_type):
            return _error(409, f"Content-Type {content_type!r} does not match the stream's {stream.content_type!r}")
        items = (json_messages(body, allow_empty=False) if stream.json else [body]) if body else []

        if producer is not None:
            _, epoch, seq = producer
            if state is None or epoch > state.epoch:
                if seq != 0:
                    if state is None:
                        return _error(
                            409,
                            "a new producer starts at Producer-Seq 0",
                            {"producer-expected-seq": "0", "producer-received-seq": str(seq)},
                        )
                    raise BadRequest("a new Producer-Epoch starts at Producer-Seq 0")
            elif seq <= state.last_seq:
                await self._settled(stream)
                return _respond(
                    204,
                    {
                        "producer-epoch": str(state.epoch),
                        "producer-seq": str(state.last_seq),
                        "stream-next-offset": format_offset(max(state.last_offset, 0)),
                    },
                )
            elif seq > state.last_seq + 1:
                return _error(
                    409,
                    f"Producer-Seq gap: expected {state.last_seq + 1}",
                    {"producer-expected-seq": str(state.last_seq + 1), "producer-received-seq": str(seq)},
                )
        if stream_seq is not None:
            if stream.stream_seq is not None and stream_seq.encode() <= stream.stream_seq.encode():
                return _error(409, f"Stream-Seq {stream_seq[:80]!r} is not after the last one accepted")
            stream.stream_seq = stream_seq

        statements = stream.push(items)
        tail = stream.pending_tail
        if close:
            stream.closed = True
        response_headers = {"stream-next-offset": format_offset(tail)}
        if producer is not None:
            pid_, epoch, seq = producer
            stream.producers[pid_] = Producer(epoch, seq, tail)
            statements.append((UPSERT_PRODUCER, (stream.id, pid_, epoch, seq, tail)))
            if close:
                stream.closed_by = f"{pid_}/{epoch}/{seq}"
            response_headers["producer-epoch"] = str(epoch)
            response_headers["producer-seq"] = str(seq)
        if close or stream_seq is not None or stream.ttl is not None:
            statements.append(stream.state_statement())
        if close:
            response_headers["stream-closed"] = "true"
        count = len(stream.items)
        await self.store.commit_append(statements, after=lambda: self._published(stream, count, close))
        # 200 only for a producer's data: a close-only POST is 204 with or without producer headers.
        return _respond(200 if producer is not None and items else 204, response_headers)

    async def _settled(self, stream: Stream) -> None:
        """Wait until what this answer reports (a closed stream, a producer's last append) is committed."""
        if stream.visible < len(stream.items) or stream.closed != stream.closed_visible:
            await self.store.commit([])

    # -- DELETE ------------------------------------------------------------------------------------

    async def delete(self, path: str) -> Response:
        found = await self._live(path)
        if isinstance(found, Response):
            return found
        statements = self.store.remove(found)
        await self.store.commit(statements, after=lambda: self.store.forget_if_absent(path))
        return _respond(204)

    # -- GET / HEAD --------------------------------------------------------------------------------

    async def get(self, request: Request, path: str) -> Response:
        if request.method == "HEAD":
            found = await self._live(path)
            if isinstance(found, Response):
                return found
            headers = self._meta_headers(found, request)
            del headers["location"]
            headers["cache-control"] = "no-store"
            return _respond(200, headers)
        query = request.query_params
        live = query.get("live")
        offsets = query.getlist("offset")
        if len(offsets) > 1:
            raise BadRequest("send one offset parameter, not several")
        if offsets and offsets[0] == "":
            raise BadRequest("the offset parameter is empty")
        if live not in (None, "long-poll", "sse"):
            raise BadRequest(f"live must be 'long-poll' or 'sse', got {live[:40]!r}")
        if live is not None and not offsets:
            raise BadRequest(f"live={live} needs an offset (-1 for the start, now for the tail)")
        offset = offsets[0] if offsets else START
        position = None if offset == NOW else 0 if offset == START else parse_offset(offset)

        found = await self._live(path)
        if isinstance(found, Response):
            return found
        stream = found
        if position is not None and position > stream.tail:
            raise BadRequest(f"offset {offset!r} is past the stream's tail: this server never issued it")
        stream.touch()
        if live == "sse":
            return self._sse(stream, position, query.get("cursor"))
        if live == "long-poll":
            return await self._long_poll(stream, position, query.get("cursor"))
        if position is None:
            headers = {
                "content-type": stream.content_type,
                "stream-next-offset": format_offset(stream.tail),
                "stream-up-to-date": "true",
                "cache-control": "no-store",
            }
            if stream.closed_visible:
                headers["stream-closed"] = "true"
            return _respond(200, headers, b"[]" if stream.json else b"")
        return self._catch_up(stream, position, request.headers.get("if-none-match"))

    def _read(self, stream: Stream, position: int) -> tuple[bytes, int, dict[str, str]]:
        items, end = stream.slice(position, self.limits.read_chunk)
        body = json_body(items) if stream.json else b"".join(items)
        headers = {"content-type": stream.content_type, "stream-next-offset": format_offset(end)}
        if end >= stream.tail:
            headers["stream-up-to-date"] = "true"
            if stream.closed_visible:
                headers["stream-closed"] = "true"
        return body, end, headers

    def _catch_up(self, stream: Stream, position: int, if_none_match: str | None) -> Response:
        body, end, headers = self._read(stream, position)
        etag = _etag(stream, position, end, "stream-closed" in headers)
        headers["etag"] = etag
        headers["cache-control"] = "private, max-age=60, stale-while-revalidate=300"
        if if_none_match is not None and etag in [tag.strip() for tag in if_none_match.split(",")]:
            return _respond(304, {k: v for k, v in headers.items() if k != "content-type"})
        return _respond(200, headers, body)

    async def _long_poll(self, stream: Stream, position: int | None, client_cursor: str | None) -> Response:
        if position is None:
            position = stream.tail
        deadline = time.monotonic() + self.limits.long_poll_timeout
        while True:
            if stream.gone:
                return _error(404, f"the stream at {stream.path} was deleted")
            if position < stream.tail:
                body, end, headers = self._read(stream, position)
                headers["stream-cursor"] = next_cursor(client_cursor)
                headers["etag"] = _etag(stream, position, end, "stream-closed" in headers)
                headers["cache-control"] = "private, max-age=60, stale-while-revalidate=300"
                return _respond(200, headers, body)
            if stream.closed_visible:
                return _respond(
                    204,
                    {
                        "stream-next-offset": format_offset(stream.tail),
                        "stream-up-to-date": "true",
                        "stream-closed": "true",
                    },
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return _respond(
                    204,
                    {
                        "stream-next-offset": format_offset(stream.tail),
                        "stream-up-to-date": "true",
                        "stream-cursor": next_cursor(client_cursor),
                    },
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stream.changed.wait(), remaining)

    def _sse(self, stream: Stream, position: int | None, client_cursor: str | None) -> Response:
        headers = {
            "content-type": "text/event-stream",
            "cache-control": "no-cache",
            "x-accel-buffering": "no",
        }
        text = sse_is_text(stream.content_type)
        if not text:
            headers["stream-sse-data-encoding"] = "base64"
        return StreamingResponse(self._sse_frames(stream, position, client_cursor, text), headers=_headers(headers))

    async def _sse_frames(
        self, stream: Stream, position: int | None, client_cursor: str | None, text: bool
    ) -> AsyncIterator[bytes]:
        cursor = next_cursor(client_cursor)
        ends_at = time.monotonic() + self.limits.sse_max_age
        announce = True  # the first time the reader is at the tail it hears upToDate
        if position is None:
            position = stream.tail
        while not stream.gone:
            if position < stream.tail:
                items, end = stream.slice(position, self.limits.read_chunk)
                payload = json_body(items) if stream.json else b"".join(items)
                at_tail = end >= stream.tail
                final = at_tail and stream.closed_visible
                control = Control(
                    stream_next_offset=format_offset(end),
                    stream_cursor=None if final else cursor,
                    up_to_date=True if at_tail else None,
                    stream_closed=True if final else None,
                )
                yield sse_data(payload, text=text) + sse_control(control)
                position = end
                announce = not at_tail
                if final:
                    return
                continue
            if stream.closed_visible:
                yield sse_control(Control(format_offset(position), up_to_date=True, stream_closed=True))
                return
            if announce:
                yield sse_control(Control(format_offset(position), stream_cursor=cursor, up_to_date=True))
                announce = False
            remaining = ends_at - time.monotonic()
            if remaining <= 0:
                return
            changed = stream.changed
            try:
                await asyncio.wait_for(changed.wait(), min(remaining, self.limits.long_poll_timeout))
            except TimeoutError:
                # Keepalive: a comment, which every SSE parser (and TanStack) ignores.
                yield b": keepalive\n\n"
