"""The co-located seam: the bridge runs in the container, only ``{name, args}`` crosses back to the host.

Container side: ``tool_descriptors`` travel with the run request, ``remote_tool_stubs`` rebuild
tools from them whose execution is ``http_remote_tool_executor``'s POST. Host side:
``tool_exec_app`` answers that POST by running the real tool (``execute_host_tool``), so the
tool's closures, database handles and secrets never leave the host.

Tool-exec answers: 200 ``{"result": <value>}``; 400 body not JSON, no string ``name``, ``args``
not an object, or an unknown tool; 400 ``{"error", "code": "invalid_run_id"}`` when the path's run
segment is no run id (``boxwright.ids``: ``..``, ``%2F``, ``%00``, ...); 401 bad bearer; 404
unknown run; 405 not POST; 413 body over the cap; 422 ``{"error", "kind": "arguments"}`` when the
arguments fail the tool's schema; 500 ``{"error"}`` when the tool raised. Every body is JSON and
none carries a traceback or the token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec

from .._json import JsonBoundsError, decode_json
from ..abort import AbortSignal
from ..errors import RemoteToolError, ToolArgumentsError, UnknownToolError
from ..ids import check_run_id, check_thread_id
from .asgi import (
    _BRIDGE_ERROR,
    DEFAULT_MAX_BODY_BYTES,
    LOOPBACK,
    AsgiServer,
    Receive,
    Scope,
    Send,
    _path_segments,
    _refuse_non_http,
    _RequestHeaders,
    _respond,
    _respond_fixed,
    read_gated_body,
    refuse_bad_run_id,
    serve_asgi,
)
from .guard import DEFAULT_MAX_REQUESTS_PER_RUN, RUN_BUSY, RunSlots
from .tools import (
    EMPTY_OBJECT_SCHEMA,
    EmitCustomEvent,
    Tool,
    ToolContext,
    _no_emit,
    define_tool,
    invoke_tool,
    object_schema,
)

__all__ = [
    "HttpRemoteToolExecutor",
    "RemoteToolExecutor",
    "ToolDescriptor",
    "ToolExecRun",
    "execute_host_tool",
    "http_remote_tool_executor",
    "remote_tool_stubs",
    "tool_descriptors",
    "tool_exec_app",
    "tool_exec_path",
]

log = logging.getLogger("boxwright.tool_bridge")

RemoteToolExecutor = Callable[[str, dict[str, Any]], Awaitable[Any]]
"""``await executor(name, args)`` -> the host tool's raw result; raises on failure."""

_ERROR_DETAIL_CHARS = 200


class ToolDescriptor(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What the container needs to list a host tool: everything but its code."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = msgspec.field(default_factory=lambda: dict(EMPTY_OBJECT_SCHEMA))
    read_only: bool = False
    structured_output: bool = False


def tool_descriptors(tools: Iterable[Tool]) -> list[ToolDescriptor]:
    return [
        ToolDescriptor(
            name=t.name,
            description=t.description,
            input_schema=object_schema(t.input_schema),
            read_only=t.read_only,
            structured_output=t.structured_output,
        )
        for t in tools
    ]


def remote_tool_stubs(descriptors: Iterable[ToolDescriptor], executor: RemoteToolExecutor) -> list[Tool]:
    """Tools that list like the host's and execute by ``await executor(name, args)``."""

    def stub(descriptor: ToolDescriptor) -> Tool:
        name = descriptor.name

        async def execute(args: dict[str, Any], ctx: ToolContext) -> Any:
            # Cancelling this coroutine (the bridge's abort) cancels the executor's request with it.
            return await executor(name, args)

        return define_tool(
            name,
            descriptor.description,
            descriptor.input_schema,
            execute,
            descriptor.read_only,
            structured_output=descriptor.structured_output,
        )

    return [stub(d) for d in descriptors]


class HttpRemoteToolExecutor:
    """POSTs ``{"name", "args"}`` with the run's bearer token to the host's tool-exec URL (keep-alive client)."""

    def __init__(self, url: str, token: str, *, client: httpx.AsyncClient | None = None) -> None:
        self.url = url
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self._client = client
        self._owns_client = client is None

    def __repr__(self) -> str:
        return f"HttpRemoteToolExecutor(url={self.url!r})"

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            # No read timeout: a tool may legitimately run for minutes; the run's abort cancels the call.
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None))
        return self._client

    async def __call__(self, name: str, args: dict[str, Any]) -> Any:
        body = msgspec.json.encode({"name": name, "args": args})
        try:
            response = await self._http().post(self.url, content=body, headers=self._headers)
        except httpx.HTTPError as exc:
            raise RemoteToolError(name, 0, f"{type(exc).__name__}: {exc}"[:_ERROR_DETAIL_CHARS]) from None
        try:
            payload = decode_json(response.content)
        except msgspec.DecodeError:
            payload = None
        if not response.is_success:
            detail = payload.get("error") if isinstance(payload, dict) else None
            if not isinstance(detail, str):
                detail = response.text
            if response.status_code == 422 and isinstance(payload, dict) and payload.get("kind") == "arguments":
                raise ToolArgumentsError(name, detail[:1000])
            raise RemoteToolError(name, response.status_code, detail[:_ERROR_DETAIL_CHARS])
        if not isinstance(payload, dict) or "result" not in payload:
            raise RemoteToolError(name, response.status_code, "malformed orchestrator response")
        return payload["result"]

    async def aclose(self) -> None:
        if self._owns_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    async def __aenter__(self) -> HttpRemoteToolExecutor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def http_remote_tool_executor(
    url: str, token: str, *, client: httpx.AsyncClient | None = None
) -> HttpRemoteToolExecutor:
    """An executor for ``remote_tool_stubs`` that calls the host's tool-exec endpoint at ``url``."""
    return HttpRemoteToolExecutor(url, token, client=client)


async def execute_host_tool(
    tools: Iterable[Tool] | Mapping[str, Tool],
    name: str,
    args: Mapping[str, Any] | None,
    *,
    context: Any = None,
    signal: AbortSignal | None = None,
    run_id: str | None = None,
    thread_id: str | None = None,
    emit_custom_event: EmitCustomEvent | None = None,
) -> Any:
    """Run the real tool ``name`` on the host and return its raw value; raises what the tool raises."""
    by_name = tools if isinstance(tools, Mapping) else {t.name: t for t in tools}
    tool = by_name.get(name)
    if tool is None:
        raise UnknownToolError(name)
    arguments: Any = {} if args is None else args
    if not isinstance(arguments, dict):
        raise ToolArgumentsError(name, f"arguments must be an object, got {type(arguments).__name__}")
    ctx = ToolContext(
        run_id=run_id,
        thread_id=thread_id,
        abort_signal=signal if signal is not None else AbortSignal(),
        context=context,
        emit_custom_event=emit_custom_event if emit_custom_event is not None else _no_emit,
    )
    return await invoke_tool(tool, arguments, ctx, signal=signal)


@dataclass(eq=False)
class ToolExecRun:
    """One run's host tools as the tool-exec endpoint serves them."""

    tools: Sequence[Tool]
    token: str = field(repr=False)
    context: Any = None
    signal: AbortSignal | None = None
    thread_id: str | None = None
    emit_custom_event: EmitCustomEvent | None = None
    _by_name: dict[str, Tool] = field(init=False, repr=False)
    _authorization: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.thread_id is not None:
            check_thread_id(self.thread_id)
        self._by_name = {t.name: t for t in self.tools}
        self._authorization = b"Bearer " + self.token.encode()


def tool_exec_path(run_id: str) -> str:
    from urllib.parse import quote

    return f"/tool-exec/{quote(check_run_id(run_id), safe='')}"


def _json(status: int, value: Any) -> tuple[int, bytes]:
    return status, msgspec.json.encode(value)


async def serve_tool_exec(
    tools_for_run: Callable[[str], ToolExecRun | None] | Mapping[str, ToolExecRun],
    *,
    host: str = LOOPBACK,
    port: int = 0,
) -> AsgiServer:
    """``tool_exec_app(tools_for_run)`` on a listener of its own, for a sandbox to call back.

    HTTP only: the sandbox reaches it, and a WebSocket upgrade would leave the HTTP guard's
    deadlines behind (``serve_asgi(websockets=False)``).
    """
    return await serve_asgi(tool_exec_app(tools_for_run), host=host, port=port, websockets=False)


def tool_exec_app(
    tools_for_run: Callable[[str], ToolExecRun | None] | Mapping[str, ToolExecRun],
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_requests_per_run: int = DEFAULT_MAX_REQUESTS_PER_RUN,
) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The host's ``POST /tool-exec/<run_id>`` endpoint as an ASGI app (mount it under any prefix).

    At most ``max_requests_per_run`` requests of one run token in flight; one more is a 503.
    """
    lookup = tools_for_run.get if isinstance(tools_for_run, Mapping) else tools_for_run
    slots = RunSlots(max_requests_per_run)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await _refuse_non_http(scope, receive, send)
            return
        slot = RunSlots.key(scope)
        if slot is not None and not slots.acquire(slot):
            await _respond_fixed(send, RUN_BUSY)
            return
        try:
            await serve(scope, receive, send)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.error("tool-exec request failed", exc_info=True)
            with contextlib.suppress(Exception):
                await _respond(send, 500, _BRIDGE_ERROR)
        finally:
            if slot is not None:
                slots.release(slot)

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        segments = _path_segments(scope)
        run = None
        if len(segments) == 2 and segments[0] == "tool-exec":
            if await refuse_bad_run_id(send, segments[1]):
                return
            run = lookup(segments[1])
        headers = _RequestHeaders(scope)
        body = await read_gated_body(scope, receive, send, headers, run._authorization if run else None, max_body_bytes)
        if run is None or body is None:
            return
        work = asyncio.ensure_future(execute(run, segments[1], body))
        # The body is read, so the next receive() only returns when the caller hangs up: then the
        # container has given up on this call (its run was aborted) and the host tool is cancelled too.
        hangup = asyncio.ensure_future(receive())
        try:
            await asyncio.wait((work, hangup), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, hangup):
                task.cancel()
            # Awaited, never left to end on their own: a result read before the cancel landed was an
            # InvalidStateError (a 500 and an ERROR traceback on every container hang-up).
            await asyncio.wait((work, hangup))
        if work.cancelled() or not hangup.cancelled():
            return  # the caller hung up: nobody reads an answer, so none is sent
        status, payload = work.result()
        await _respond(send, status, payload)

    async def execute(run: ToolExecRun, run_id: str, body: bytes) -> tuple[int, bytes]:
        try:
            request = decode_json(body)
        except JsonBoundsError as exc:
            return _json(400, {"error": f"body is not JSON the bridge accepts: {exc}"})
        except msgspec.DecodeError:
            return _json(400, {"error": "body is not JSON"})
        name = request.get("name") if isinstance(request, dict) else None
        if not isinstance(name, str):
            return _json(400, {"error": 'body needs a string "name"'})
        args = request.get("args")
        if args is not None and not isinstance(args, dict):
            return _json(400, {"error": '"args" must be an object'})
        if name not in run._by_name:
            return _json(400, {"error": f"Unknown tool: {name}"})
        try:
            result = await execute_host_tool(
                run._by_name,
                name,
                args,
                context=run.context,
                signal=run.signal,
                run_id=run_id,
                thread_id=run.thread_id,
                emit_custom_event=run.emit_custom_event,
            )
        except ToolArgumentsError as exc:
            return _json(422, {"error": str(exc), "kind": "arguments"})
        except Exception as exc:
            return _json(500, {"error": str(exc) or type(exc).__name__})
        try:
            return _json(200, {"result": result})
        except (TypeError, msgspec.EncodeError) as exc:
            return _json(500, {"error": f"tool result is not JSON-serializable: {exc}"})

    return app
