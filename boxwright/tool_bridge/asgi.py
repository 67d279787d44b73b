"""The host transport of the tool bridge: MCP streamable HTTP (stateless, JSON answers) as a plain ASGI app.

One listener serves many runs. Each run is registered under its own path,
``/runs/<run_id>/mcp``, with its own bearer token. Routing is by path, not by looking the token
up: the token is then compared in constant time against exactly one run's value, an unknown run
(404) stays distinguishable from a wrong token (401), and access logs carry run ids, never tokens.

Order of checks per request: a run segment that is no run id (400 ``{"error", "code":
"invalid_run_id"}``, ``boxwright.ids``), route (404), bearer (401 + ``WWW-Authenticate: Bearer``), method
(405 unless POST), declared and then actual body size (413, read incrementally), JSON (400 with
JSON-RPC -32700), then the dispatcher: 202 for notifications, 400 for a message that is not a
valid JSON-RPC request (-32600, batches included), 200 with the JSON-RPC reply otherwise. Anything
else is a 500 ``{"error":"bridge error"}``: no traceback, no token. A call for a run not registered
here is held before the route check when the app was told that run is coming (``hold_unregistered``:
a replica taking the run over, with the run's derived token; ``boxwright.secrets.run_bridge_token``).

Where the listener binds and which URL the sandbox is given (never a request's ``Host`` header):

=====================  ===================================  =====================================
provider               bind address                         URL host the sandbox dials
=====================  ===================================  =====================================
local-process,         127.0.0.1                            127.0.0.1
bubblewrap
docker, sbx            the docker0 gateway IP if that       host.docker.internal (which Docker
                       interface exists, else 127.0.0.1     maps to that gateway on Linux with
                       (Docker Desktop forwards             ``--add-host host.docker.internal:
                       host.docker.internal to the host's   host-gateway``)
                       loopback)
anything else          127.0.0.1 (a tunnel or proxy         the configured ``public_url``;
(remote VMs)           forwards to it)                      refused when none is configured
=====================  ===================================  =====================================

``0.0.0.0`` is never chosen for you: it would expose the bridge on every interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import socket
import sys
from collections.abc import Awaitable, Callable, Generator, Iterable, MutableMapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import quote, unquote_to_bytes

import msgspec
import uvicorn

from .._json import decode_json
from ..abort import AbortController, AbortSignal
from ..errors import InvalidRunIdError, ToolBridgeConfigError
from ..ids import check_run_id, check_thread_id, id_problem
from ..secrets import mint_token
from .core import INVALID_REQUEST, SERVER_NAME, ToolBridgeCore, handle_json_rpc, parse_error_reply
from .guard import DEFAULT_MAX_REQUESTS_PER_RUN, RUN_BUSY, RunSlots, ServerLimits, guarded_protocol
from .tools import EmitCustomEvent, Tool

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "AsgiServer",
    "BridgeRegistration",
    "HostToolBridge",
    "ToolBridgeApp",
    "bind_address_for",
    "host_for_sandbox",
    "serve_asgi",
    "start_host_tool_bridge",
]

log = logging.getLogger("boxwright.tool_bridge")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

DEFAULT_MAX_BODY_BYTES = 1 << 20
LOOPBACK = "127.0.0.1"
DOCKER_HOST = "host.docker.internal"
LOOPBACK_PROVIDERS = frozenset({"local-process", "bubblewrap"})
DOCKER_PROVIDERS = frozenset({"docker", "sbx"})
_MIN_TOKEN_CHARS = 32

_JSON = b"application/json"
# A call for a run being taken over waits this long at most (the co-located runner holds one as long).
DEFAULT_HOLD_S = 120.0
_HOLD_POLL_S = 0.05
_BRIDGE_ERROR = b'{"error":"bridge error"}'


# (run id, the call's Authorization header) -> None: not this run's agent; else still_coming().
ExpectRun = Callable[[str, bytes], Awaitable[Callable[[], bool] | None]]


# -- HTTP plumbing shared with the tool-exec endpoint ---------------------------------------------


class _BodyTooLarge(Exception):
    pass


class _BadRequest(Exception):
    pass


class _Disconnected(Exception):
    pass


class _RequestHeaders:
    """The few request headers the bridge reads, collected in one pass over the raw list."""

    __slots__ = ("accept", "authorization", "content_length")

    def __init__(self, scope: Scope) -> None:
        self.authorization: list[bytes] = []
        self.content_length: bytes | None = None
        self.accept = b""
        for key, value in scope["headers"]:
            if key == b"authorization":
                self.authorization.append(value)
            elif key == b"content-length":
                self.content_length = value
            elif key == b"accept":
                self.accept = value.lower()


def _path_segments(scope: Scope) -> list[str]:
    """The percent-decoded segments of the path below ``root_path`` (non-UTF-8 bytes as lone surrogates)."""
    raw: bytes | None = scope.get("raw_path")
    if raw is None:
        raw = quote(scope["path"]).encode()
    root = scope.get("root_path", "")
    if root:
        encoded_root = quote(root).encode()
        if raw.startswith(encoded_root):
            raw = raw[len(encoded_root) :]
    # surrogateescape: bytes that are not UTF-8 become lone surrogates, which the id check refuses by name.
    return [unquote_to_bytes(part).decode("utf-8", "surrogateescape") for part in raw.split(b"/")[1:]]


def _bearer_matches(values: list[bytes], expected: bytes) -> bool:
    # The whole header against "Bearer <token>": another scheme, a bare token or a second header all fail.
    return len(values) == 1 and hmac.compare_digest(values[0], expected)


async def _read_body(receive: Receive, headers: _RequestHeaders, limit: int) -> bytes:
    """The request body, refused (``_BodyTooLarge``) as soon as it is known to exceed ``limit``."""
    if headers.content_length is not None:
        try:
            declared = int(headers.content_length)
        except ValueError:
            raise _BadRequest("invalid Content-Length") from None
        if declared > limit:
            raise _BodyTooLarge
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        if message["type"] == "http.disconnect":
            raise _Disconnected
        if len(body) > limit:
            raise _BodyTooLarge
        return body
    chunks = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _respond(
    send: Send,
    status: int,
    body: bytes = b"",
    content_type: bytes | None = _JSON,
    extra: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    headers = [(b"content-length", str(len(body)).encode()), *extra]
    if content_type is not None:
        headers.append((b"content-type", content_type))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _refuse_non_http(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    elif scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})


_Fixed = tuple[int, bytes, list[tuple[bytes, bytes]]]
_UNAUTHORIZED: _Fixed = (401, b'{"error":"unauthorized"}', [(b"www-authenticate", b"Bearer")])
_NOT_FOUND: _Fixed = (404, b'{"error":"not found"}', [])
_NOT_ALLOWED: _Fixed = (405, b'{"error":"method not allowed"}', [(b"allow", b"POST")])
_TOO_LARGE: _Fixed = (413, b'{"error":"request body too large"}', [])


async def _respond_fixed(send: Send, answer: _Fixed) -> None:
    await _respond(send, answer[0], answer[1], _JSON, answer[2])


def check_token(token: str) -> str:
    """``token`` if it can ride in an Authorization header and is long enough to be a per-run secret."""
    if not isinstance(token, str) or len(token) < _MIN_TOKEN_CHARS or not all("\x21" <= ch <= "\x7e" for ch in token):
        raise ToolBridgeConfigError(
            f"a bridge token must be at least {_MIN_TOKEN_CHARS} visible ASCII characters (mint one with "
            "boxwright.secrets.mint_token())"
        )
    return token


async def refuse_bad_run_id(send: Send, segment: str) -> bool:
    """Answer 400 ``invalid_run_id`` if a path's run segment is no run id (``..``, ``%2F``, ``%00``,
    bytes that are not UTF-8, ...): no run can be registered under it, and saying why beats a 404."""
    problem = id_problem(segment)
    if problem is None:
        return False
    error = InvalidRunIdError(segment, problem)
    await _respond(send, 400, msgspec.json.encode({"error": str(error), "code": error.code}))
    return True


# -- the app -------------------------------------------------------------------------------------


class _Run:
    __slots__ = ("authorization", "core", "registration")

    def __init__(self, core: ToolBridgeCore, token: str) -> None:
        self.core = core
        self.authorization = b"Bearer " + token.encode()
        self.registration: BridgeRegistration | None = None


@dataclass(eq=False)
class BridgeRegistration:
    """One run on a bridge: the URL and token the agent is given, and ``close()`` to remove it."""

    run_id: str
    url: str
    token: str = field(repr=False)
    core: ToolBridgeCore = field(repr=False)
    name: str = SERVER_NAME
    _close: Callable[[], None] = field(repr=False, default=lambda: None)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def close(self) -> None:
        """Unregister the run and abort its in-flight tool calls. Idempotent."""
        self._close()

    def __enter__(self) -> BridgeRegistration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def read_gated_body(
    scope: Scope,
    receive: Receive,
    send: Send,
    headers: _RequestHeaders,
    authorization: bytes | None,
    max_body_bytes: int,
) -> bytes | None:
    """The checks every bridge endpoint makes, in order: a known route (``authorization`` is its
    expected header, None for an unknown one: 404), the bearer (401), POST (405), a body within
    the cap (413, read incrementally) — answering the first that fails. The body, or None when
    a response was sent (or the caller left)."""
    if authorization is None:
        await _respond_fixed(send, _NOT_FOUND)
        return None
    if not _bearer_matches(headers.authorization, authorization):
        await _respond_fixed(send, _UNAUTHORIZED)
        return None
    if scope["method"] != "POST":
        await _respond_fixed(send, _NOT_ALLOWED)
        return None
    try:
        return await _read_body(receive, headers, max_body_bytes)
    except _BodyTooLarge:
        await _respond_fixed(send, _TOO_LARGE)
    except _BadRequest as exc:
        await _respond(send, 400, msgspec.json.encode({"error": str(exc)}))
    except _Disconnected:
        pass
    return None


class ToolBridgeApp:
    """An ASGI app serving each registered run's tools over MCP at ``/runs/<run_id>/mcp``."""

    def __init__(
        self,
        *,
        base_url: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_requests_per_run: int = DEFAULT_MAX_REQUESTS_PER_RUN,
    ) -> None:
        self.base_url = base_url.rstrip("/") if base_url is not None else None
        self.max_body_bytes = max_body_bytes
        self._runs: dict[str, _Run] = {}
        self._slots = RunSlots(max_requests_per_run)
        self._expected: ExpectRun | None = None
        self._hold_s = 0.0

    @staticmethod
    def path_for(run_id: str) -> str:
        return f"/runs/{quote(check_run_id(run_id), safe='')}/mcp"

    def url_for(self, run_id: str) -> str:
        if self.base_url is None:
            raise ToolBridgeConfigError("this ToolBridgeApp has no base_url; pass base_url= (from configuration)")
        return self.base_url + self.path_for(run_id)

    @property
    def run_ids(self) -> list[str]:
        return list(self._runs)

    def register(
        self,
        run_id: str,
        tools: Iterable[Tool],
        *,
        token: str | None = None,
        url: str | None = None,
        context: Any = None,
        signal: AbortSignal | None = None,
        emit_custom_event: EmitCustomEvent | None = None,
        thread_id: str | None = None,
        permission: Tool | None = None,
    ) -> BridgeRegistration:
        """Serve ``tools`` for ``run_id`` until the registration is closed; the token is minted unless given.

        A bad ``run_id`` / ``thread_id`` raises ``InvalidRunIdError`` / ``InvalidThreadIdError`` (``boxwright.ids``).
        """
        check_run_id(run_id)
        if thread_id is not None:
            check_thread_id(thread_id)
        if run_id in self._runs:
            raise ToolBridgeConfigError(f"run {run_id!r} is already registered on this bridge")
        token = check_token(token) if token is not None else mint_token()
        controller = AbortController()
        core = ToolBridgeCore(
            tools,
            context=context,
            signal=AbortSignal.any([signal, controller.signal]),
            emit_custom_event=emit_custom_event,
            run_id=run_id,
            thread_id=thread_id,
            permission=permission,
        )
        entry = _Run(core, token)

        def close() -> None:
            if self._runs.get(run_id) is entry:
                del self._runs[run_id]
            controller.abort("tool bridge registration closed")

        registration = BridgeRegistration(
            run_id=run_id,
            url=url if url is not None else self.url_for(run_id),
            token=token,
            core=core,
            _close=close,
        )
        entry.registration = registration
        self._runs[run_id] = entry
        return registration

    def close_all(self) -> None:
        for entry in list(self._runs.values()):
            if entry.registration is not None:
                entry.registration.close()

    def hold_unregistered(self, expected: ExpectRun, *, hold_s: float = DEFAULT_HOLD_S) -> None:
        """Hold a call for a run not registered here while ``expected`` says it is coming, up to ``hold_s``.

        Why: a replica that takes a run over registers its tools only once it holds the run's claim,
        but the agent goes on in its sandbox meanwhile and its next call (the public origin now routes
        it here) would be a 404 it does not retry. ``expected(run_id, authorization)`` (the service's)
        returns ``None`` for a call it does not vouch for (answered at once, 404 as before), else a
        ``still_coming()`` polled while the call waits; the call is then served once the run is
        registered, checked like any other, or answered 404 once it is no longer coming or ``hold_s``
        passed. A held call takes its token's slot (``RunSlots``) like any other.
        """
        self._expected = expected
        self._hold_s = hold_s

    async def _registered(self, run_id: str, headers: _RequestHeaders) -> _Run | None:
        if self._expected is None or len(headers.authorization) != 1:
            return None
        still_coming = await self._expected(run_id, headers.authorization[0])
        if still_coming is None:
            return None
        deadline = asyncio.get_running_loop().time() + self._hold_s
        # Polled, not awaited on an event: a hold is rare (a takeover's first seconds), and a poll
        # leaves nothing behind when the caller goes away or the run never comes.
        while (entry := self._runs.get(run_id)) is None:
            if not still_coming() or asyncio.get_running_loop().time() >= deadline:
                return None
            await asyncio.sleep(_HOLD_POLL_S)
        return entry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await _refuse_non_http(scope, receive, send)
            return
        slot = RunSlots.key(scope)  # per run token, before the body is read (guard.RunSlots)
        if slot is not None and not self._slots.acquire(slot):
            await _respond_fixed(send, RUN_BUSY)
            return
        try:
            await self._serve(scope, receive, send)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Logged without headers or body: those carry the token and the tool arguments.
            log.error("tool bridge request failed", exc_info=True)
            with contextlib.suppress(Exception):
                await _respond(send, 500, _BRIDGE_ERROR)
        finally:
            if slot is not None:
                self._slots.release(slot)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        segments = _path_segments(scope)
        entry = None
        headers = _RequestHeaders(scope)
        if segments is not None and len(segments) == 3 and segments[0] == "runs" and segments[2] == "mcp":
            if await refuse_bad_run_id(send, segments[1]):
                return
            entry = self._runs.get(segments[1])
            if entry is None:
                entry = await self._registered(segments[1], headers)
        body = await read_gated_body(
            scope, receive, send, headers, entry.authorization if entry else None, self.max_body_bytes
        )
        if entry is None or body is None:
            return
        try:
            message = decode_json(body)  # bounded in depth: too deep is a parse error (-32700), not a 500
        except msgspec.DecodeError:
            await _respond(send, 400, msgspec.json.encode(parse_error_reply()))
            return
        reply = await handle_json_rpc(entry.core, message)
        if reply is None:
            await _respond(send, 202, b"", None)
            return
        status = 400 if "error" in reply and reply["error"]["code"] == INVALID_REQUEST else 200
        payload = msgspec.json.encode(reply)
        accept = headers.accept
        if b"text/event-stream" in accept and b"application/json" not in accept and b"*/*" not in accept:
            # A client that accepts only a stream gets the one reply as a single SSE event.
            await _respond(
                send,
                status,
                b"event: message\ndata: " + payload + b"\n\n",
                b"text/event-stream",
                [(b"cache-control", b"no-cache")],
            )
            return
        await _respond(send, status, payload)


# -- in-process server ---------------------------------------------------------------------------


class _EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # Signals belong to the application that embeds the bridge; uvicorn's own handlers would
        # turn the app's Ctrl-C into a bridge shutdown.
        yield


def _format_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class AsgiServer:
    """An ASGI app served by uvicorn as an asyncio task of the running loop (see ``serve_asgi``)."""

    def __init__(self, server: uvicorn.Server, task: asyncio.Task[None], host: str, port: int) -> None:
        self._server = server
        self._task = task
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        return f"http://{_format_host(self.host)}:{self.port}"

    async def close(self) -> None:
        """Stop accepting, let in-flight requests finish (bounded), and wait for the task. Idempotent."""
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=10)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        except Exception:
            log.warning("embedded ASGI server ended with an error", exc_info=True)

    async def __aenter__(self) -> AsgiServer:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP, and an
    # accepted socket inherits it; socket.create_server leaves it 0, which costs 40 ms delayed-ACK
    # stalls on every response written in more than one piece.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


async def serve_asgi(
    app: Any,
    *,
    host: str = LOOPBACK,
    port: int = 0,
    lifespan: str = "off",
    limits: ServerLimits | None = None,
    websockets: bool = True,
) -> AsgiServer:
    """Serve ``app`` with uvicorn inside the running loop; returns once it accepts connections.

    ``limits`` (``guard.ServerLimits``, defaults unless given) bounds how long a client may take to
    send a request, how long it may idle between requests, and how many connections it may hold.
    ``websockets=False``: an upgrade request is an HTTP request like any other, under those limits.
    For a listener the sandbox reaches (the tool bridge, tool-exec): an upgrade leaves the HTTP
    guard's deadlines behind, and one whose head is too large to parse was answered by nothing and
    held open for good, so an agent could fill the listener's connection cap and cut off every run.
    """
    limits = limits if limits is not None else ServerLimits()
    sock = _listen(host, port)
    bound_port = sock.getsockname()[1]
    keep_alive: Any = limits.keep_alive_timeout_s  # uvicorn annotates int; loop.call_later takes float
    config = uvicorn.Config(
        app,
        http=guarded_protocol(limits),
        timeout_keep_alive=keep_alive,
        ws="auto" if websockets else "none",
        ws_max_size=limits.ws_max_message_bytes,
        lifespan=lifespan,  # type: ignore[arg-type]
        log_level="warning",
        access_log=False,
        server_header=False,
        # Never trust X-Forwarded-*: nothing here may depend on what a client claims about the connection.
        proxy_headers=False,
        date_header=False,
        timeout_graceful_shutdown=5,
    )
    server = _EmbeddedServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name=f"boxwright-asgi-{bound_port}")
    while not server.started:
        if task.done():
            sock.close()
            exc = task.exception() if not task.cancelled() else None
            raise RuntimeError(f"the embedded server on {host}:{bound_port} did not start: {exc!r}")
        await asyncio.sleep(0.001)
    return AsgiServer(server, task, host, bound_port)


# -- topology ------------------------------------------------------------------------------------


def host_for_sandbox(provider: str) -> str:
    """The host name a sandbox of ``provider`` dials to reach a bridge on this machine."""
    if provider in LOOPBACK_PROVIDERS:
        return LOOPBACK
    if provider in DOCKER_PROVIDERS:
        return DOCKER_HOST
    raise ToolBridgeConfigError(
        f"a {provider!r} sandbox cannot reach this machine's loopback; configure public_url "
        "(a tunnel or an address the sandbox can reach) for the tool bridge"
    )


def _interface_ipv4(name: str) -> str | None:
    if not sys.platform.startswith("linux"):
        return None
    import fcntl
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def bind_address_for(provider: str) -> str:
    """Where to bind a bridge for ``provider``'s sandboxes (see the module docstring's table)."""
    if provider in DOCKER_PROVIDERS:
        return _interface_ipv4("docker0") or LOOPBACK
    return LOOPBACK


class HostToolBridge:
    """One in-process listener serving the tool bridge of many runs; ``register`` adds one."""

    name = SERVER_NAME

    def __init__(self, app: ToolBridgeApp, server: AsgiServer) -> None:
        self.app = app
        self._server = server

    @property
    def host(self) -> str:
        return self._server.host

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def base_url(self) -> str:
        assert self.app.base_url is not None
        return self.app.base_url

    def url_for(self, run_id: str) -> str:
        return self.app.url_for(run_id)

    def register(
        self, run_id: str, tools: Iterable[Tool], *, token: str | None = None, **core_opts: Any
    ) -> BridgeRegistration:
        """Serve ``tools`` for one run at ``url_for(run_id)``; see ``ToolBridgeApp.register``."""
        return self.app.register(run_id, tools, token=token, **core_opts)

    async def close(self) -> None:
        """Close every registration (aborting in-flight tools), then stop the listener. Idempotent."""
        self.app.close_all()
        await self._server.close()

    async def __aenter__(self) -> HostToolBridge:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


async def start_host_tool_bridge(
    *,
    host: str | None = None,
    port: int = 0,
    public_url: str | None = None,
    provider: str | None = None,
    connect_host: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    limits: ServerLimits | None = None,
) -> HostToolBridge:
    """Start a bridge listener in this process (uvicorn, as a task of the running loop).

    ``host`` is the bind address (default: ``bind_address_for(provider)``, else 127.0.0.1). The URL
    handed to sandboxes is ``public_url`` if configured, else ``http://<connect_host>:<port>`` with
    ``connect_host`` defaulting to ``host_for_sandbox(provider)`` (or the bind address).
    """
    if public_url is None and provider is not None and connect_host is None:
        connect_host = host_for_sandbox(provider)
    bind = host if host is not None else (bind_address_for(provider) if provider is not None else LOOPBACK)
    limits = limits if limits is not None else ServerLimits()
    app = ToolBridgeApp(max_body_bytes=max_body_bytes, max_requests_per_run=limits.max_requests_per_run)
    # MCP over HTTP only: nothing here speaks WebSocket, and the sandbox must not be able to open one.
    server = await serve_asgi(app, host=bind, port=port, limits=limits, websockets=False)
    app.base_url = (public_url or f"http://{_format_host(connect_host or bind)}:{server.port}").rstrip("/")
    return HostToolBridge(app, server)
