"""Limits on the connections of every server boxwright starts (``serve_asgi``): read timeouts, a
connection cap per listener, a request cap per run token.

A sandboxed agent can reach the bridge listener, and an agent gone wrong may open connections and
never finish a request. uvicorn bounds the idle time between requests (``timeout_keep_alive``) but
not the time a client takes to send a request: a connection that sends nothing, or one header byte
a second, or a body that stalls, stays open forever, and nothing bounds how many there are. So:

- ``GuardedHttpToolsProtocol`` (uvicorn's httptools protocol, which ``boxwright`` requires, plus
  two timers): the request head must be complete ``header_timeout_s`` after the connection opens
  or the request's first byte arrives (else ``408`` and close), and the body ``body_timeout_s``
  after the head (else close: the app's ``receive()`` reports a disconnect); the head is at most
  ``max_header_bytes`` (else ``431``). A connection beyond ``max_connections`` of its listener is
  answered ``503`` and closed at once, before it sends anything.
- ``RunSlots``: at most ``max_requests_per_run`` requests of one run token in flight (read, run or
  answered) at a time; one more is a ``503`` at once, so one run's agent cannot take the whole
  listener from the others.

The timers cost two ``call_later`` handles per request and no work per byte: ``bench/bridge_rtt.py``
measures the ``tools/call`` round trip with them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = [
    "DEFAULT_MAX_REQUESTS_PER_RUN",
    "RUN_BUSY",
    "GuardedHttpToolsProtocol",
    "RunSlots",
    "ServerLimits",
    "guarded_protocol",
]

# A Claude Code run makes a handful of parallel tool calls at most; 32 leaves room and still lets
# eight runs share a listener's 256 connections.
DEFAULT_MAX_REQUESTS_PER_RUN = 32


@dataclass(frozen=True)
class ServerLimits:
    """How long a client may take and how many connections it may hold; durations in seconds.

    The defaults let any real client through (a request on loopback is sent in microseconds; a
    remote one in well under a second) and close a stalled one within seconds.
    """

    header_timeout_s: float = 5.0
    body_timeout_s: float = 10.0
    keep_alive_timeout_s: float = 5.0
    max_header_bytes: int = 64 * 1024
    max_connections: int = 256
    max_requests_per_run: int = DEFAULT_MAX_REQUESTS_PER_RUN
    # WebSocket messages (uvicorn closes 1009 above it); boxwright's tails receive only an offset.
    ws_max_message_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ServerLimits.{name} must be a positive number of seconds")
        for name in ("max_header_bytes", "max_connections", "max_requests_per_run", "ws_max_message_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerLimits.{name} must be at least 1")


def _fixed_response(status: int, reason: str, body: bytes) -> bytes:
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


_TIMEOUT = _fixed_response(408, "Request Timeout", b'{"error":"request not received in time"}')
_HEADERS_TOO_LARGE = _fixed_response(431, "Request Header Fields Too Large", b'{"error":"request head too large"}')
_BUSY = _fixed_response(503, "Service Unavailable", b'{"error":"too many connections"}')


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a request-head deadline, a body deadline, a head size cap
    and a connection cap; ``limits`` is set on the subclass ``guarded_protocol`` makes."""

    limits: ServerLimits = ServerLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._in_head = False
        self._head_bytes = 0

    # -- timers -----------------------------------------------------------------------------------

    def _arm(self, seconds: float, in_head: bool) -> None:
        self._disarm()
        self._in_head = in_head
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._in_head = False
        self._head_bytes = 0

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._in_head and (self.cycle is None or self.cycle.response_complete):
            # Nothing of this request reached the app yet: say why before closing.
            self.transport.write(_TIMEOUT)
        # A body that stalls: closing makes the app's receive() return http.disconnect.
        self.transport.close()

    # -- protocol hooks ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            transport.write(_BUSY)
            transport.close()
            return
        # A connection that never sends a request is closed like one that sends it too slowly.
        self._arm(self.limits.header_timeout_s, in_head=True)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_head:
            # Counted after parsing, so a body arriving in the head's packet is not counted as head.
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes and not self.transport.is_closing():
                self._disarm()
                self.transport.write(_HEADERS_TOO_LARGE)
                self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_head:
            self._arm(self.limits.header_timeout_s, in_head=True)

    def on_headers_complete(self) -> None:
        self._arm(self.limits.body_timeout_s, in_head=False)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _unsupported_upgrade_warning(self) -> None:
        # A listener serving no WebSocket answers an upgrade request as plain HTTP, as it should; uvicorn
        # would log two WARNINGs for each, which a client in the sandbox could send without end.
        if self._should_upgrade_to_ws():
            super()._unsupported_upgrade_warning()  # an upgrade to something else on a WebSocket listener

    def handle_websocket_upgrade(self) -> None:
        # The WebSocket protocol takes the transport over, with its own ping timeout.
        self._disarm()
        super().handle_websocket_upgrade()


def guarded_protocol(limits: ServerLimits) -> type[GuardedHttpToolsProtocol]:
    """A ``GuardedHttpToolsProtocol`` subclass bound to ``limits``, to pass as uvicorn's ``http=``."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})


RUN_BUSY = (
    503,
    b'{"error":"too many requests in flight for this run"}',
    [(b"retry-after", b"1")],
)


class RunSlots:
    """Counts an app's requests in flight per run token; ``acquire`` refuses the one over ``limit``.

    Keyed by the request's whole ``Authorization`` header, which is the run's bearer token: known
    before the path is routed or the body read, so a run's slow bodies take its own slots only. A
    request with a wrong token holds a slot for as long as its 401 takes. Keys stay in memory only.
    """

    __slots__ = ("_active", "limit")

    def __init__(self, limit: int = DEFAULT_MAX_REQUESTS_PER_RUN) -> None:
        if limit < 1:
            raise ValueError("max_requests_per_run must be at least 1")
        self.limit = limit
        self._active: dict[Hashable, int] = {}

    @staticmethod
    def key(scope: Any) -> bytes | None:
        """The ``Authorization`` header of an HTTP scope (the first), or None without one."""
        for name, value in scope["headers"]:
            if name == b"authorization":
                return bytes(value)
        return None

    def acquire(self, key: Hashable) -> bool:
        count = self._active.get(key, 0)
        if count >= self.limit:
            return False
        self._active[key] = count + 1
        return True

    def release(self, key: Hashable) -> None:
        count = self._active.get(key, 0) - 1
        if count > 0:
            self._active[key] = count
        else:
            self._active.pop(key, None)
