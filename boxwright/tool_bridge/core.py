"""The tool bridge without a transport: MCP's tool methods over JSON-RPC 2.0 as plain dicts in and out.

No I/O and no authentication live here, so the host HTTP listener, an orchestrator's own route
and the in-container runner all serve the same dispatcher.

Batches (a JSON array) are refused with one ``-32600 Invalid Request`` reply (id null) rather
than answered element-wise: MCP 2025-06-18 removed JSON-RPC batching, no client we serve sends
one, and an array still gets the error JSON-RPC 2.0 prescribes for a message it cannot process.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import itertools
import logging
import secrets
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import msgspec

from ..abort import AbortSignal
from ..errors import ToolArgumentsError, ToolDefinitionError, UnknownToolError
from .tools import EmitCustomEvent, Tool, ToolContext, _no_emit, invoke_tool

__all__ = [
    "BRIDGE_FAILED_EVENT",
    "BRIDGE_FINISHED_EVENT",
    "BRIDGE_STARTED_EVENT",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "LATEST_PROTOCOL_VERSION",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "SERVER_NAME",
    "SUPPORTED_PROTOCOL_VERSIONS",
    "ToolBridgeCore",
    "ToolCallRecord",
    "create_tool_bridge_core",
    "handle_json_rpc",
    "parse_error_reply",
]

log = logging.getLogger("boxwright.tool_bridge")

SERVER_NAME = "boxwright"
# Every revision negotiated with `initialize`. The 2026 revisions start with `server/discover`
# instead; we answer that with "method not found", which makes the official client fall back here.
SUPPORTED_PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_PROTOCOL_VERSION = SUPPORTED_PROTOCOL_VERSIONS[-1]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

BRIDGE_STARTED_EVENT = "tool_bridge.started"
BRIDGE_FINISHED_EVENT = "tool_bridge.finished"
BRIDGE_FAILED_EVENT = "tool_bridge.failed"


def _server_version() -> str:
    try:
        return importlib.metadata.version("boxwright")
    except importlib.metadata.PackageNotFoundError:
        return "0"


_SERVER_INFO = {"name": SERVER_NAME, "version": _server_version()}


class ToolCallRecord(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """One tools/call the bridge ran for a run, kept in ``core.history`` in call order."""

    call_id: str
    name: str
    args: Any
    ok: bool
    duration_ms: float
    error: str | None = None


class ToolBridgeCore:
    """Lists and calls one run's tools; ``call_tool`` turns every tool failure into an MCP error result."""

    name = SERVER_NAME

    def __init__(
        self,
        tools: Iterable[Tool],
        *,
        context: Any = None,
        signal: AbortSignal | None = None,
        emit_custom_event: EmitCustomEvent | None = None,
        run_id: str | None = None,
        thread_id: str | None = None,
        permission: Tool | None = None,
    ) -> None:
        ordered = [*tools, *([permission] if permission is not None else [])]
        self._tools: dict[str, Tool] = {}
        for t in ordered:
            if t.name in self._tools:
                raise ToolDefinitionError(t.name, "two tools of one bridge share this name")
            self._tools[t.name] = t
        self._listing = [_listing_entry(t) for t in ordered]
        self._context = context
        self._signal = signal
        self._emit = emit_custom_event
        self.run_id = run_id
        self.thread_id = thread_id
        self.history: list[ToolCallRecord] = []
        self._call_ids = itertools.count()
        # A nonce per registration: a host that takes a run over registers it again and counts from 0, and
        # its calls must not reuse the ids its predecessor's calls already have in the run's log.
        nonce = secrets.token_hex(3)
        self._call_prefix = f"{run_id}-bridge-{nonce}-" if run_id else f"bridge-{nonce}-"

    @property
    def tools(self) -> Mapping[str, Tool]:
        return self._tools

    def list_tools(self) -> list[dict[str, Any]]:
        return self._listing

    async def call_tool(self, name: str, args: Mapping[str, Any] | None) -> dict[str, Any]:
        """Run one tool and return an MCP ``CallToolResult``. Raises only ``UnknownToolError`` (and cancellation)."""
        tool = self._tools.get(name)
        if tool is None:
            raise UnknownToolError(name)
        call_id = f"{self._call_prefix}{next(self._call_ids)}"
        arguments: Any = {} if args is None else args
        self._send_event(BRIDGE_STARTED_EVENT, {"callId": call_id, "toolName": name, "args": arguments})
        started = time.perf_counter()
        error: str | None = None
        try:
            if not isinstance(arguments, dict):
                raise ToolArgumentsError(name, f"arguments must be an object, got {type(arguments).__name__}")
            value = await self._run(tool, arguments)
            result = _result(value, tool.structured_output)
        except ToolArgumentsError as exc:
            error = str(exc)
            result = _error_result(error)
        except Exception as exc:
            error = str(exc) or type(exc).__name__
            result = _error_result(f"Tool execution failed: {error}")
        except asyncio.CancelledError:
            self._finish(call_id, name, arguments, started, "cancelled")
            raise
        self._finish(call_id, name, arguments, started, error)
        return result

    async def _run(self, tool: Tool, args: dict[str, Any]) -> Any:
        signal = self._signal
        ctx = ToolContext(
            run_id=self.run_id,
            thread_id=self.thread_id,
            abort_signal=signal if signal is not None else AbortSignal(),
            context=self._context,
            emit_custom_event=self._emit if self._emit is not None else _no_emit,
        )
        return await invoke_tool(tool, args, ctx, signal=signal)

    def _finish(self, call_id: str, name: str, args: Any, started: float, error: str | None) -> None:
        duration_ms = round((time.perf_counter() - started) * 1000, 3)
        self.history.append(
            ToolCallRecord(
                call_id=call_id, name=name, args=args, ok=error is None, duration_ms=duration_ms, error=error
            )
        )
        payload: dict[str, Any] = {"callId": call_id, "toolName": name, "durationMs": duration_ms}
        if error is None:
            self._send_event(BRIDGE_FINISHED_EVENT, payload)
        else:
            payload["error"] = error
            self._send_event(BRIDGE_FAILED_EVENT, payload)

    def _send_event(self, name: str, value: dict[str, Any]) -> None:
        if self._emit is None:
            return
        try:
            self._emit(name, value)
        except Exception:
            # An event sink that fails must not fail the tool call the agent is waiting for.
            log.warning("tool bridge event sink raised on %s", name, exc_info=True)


def create_tool_bridge_core(
    tools: Iterable[Tool],
    *,
    context: Any = None,
    signal: AbortSignal | None = None,
    emit_custom_event: EmitCustomEvent | None = None,
    run_id: str | None = None,
    thread_id: str | None = None,
    permission: Tool | None = None,
) -> ToolBridgeCore:
    """The transport-free bridge for one run; ``permission`` (Claude's prompt tool) is listed last."""
    return ToolBridgeCore(
        tools,
        context=context,
        signal=signal,
        emit_custom_event=emit_custom_event,
        run_id=run_id,
        thread_id=thread_id,
        permission=permission,
    )


def _listing_entry(tool: Tool) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": tool.name, "description": tool.description, "inputSchema": tool.input_schema}
    if tool.read_only:
        # Codex runs a tool marked read-only without an approval prompt.
        entry["annotations"] = {"readOnlyHint": True}
    return entry


def _result(value: Any, structured: bool) -> dict[str, Any]:
    text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": False}
    if structured:
        plain = msgspec.to_builtins(value)
        result["structuredContent"] = plain if isinstance(plain, dict) else {"result": plain}
    return result


def _error_result(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": True}


# -- JSON-RPC ------------------------------------------------------------------------------------


class BridgeCore(Protocol):
    def list_tools(self) -> list[dict[str, Any]]: ...
    async def call_tool(self, name: str, args: Mapping[str, Any] | None) -> dict[str, Any]: ...


def _error(id_: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": id_, "error": error}


def parse_error_reply() -> dict[str, Any]:
    """The reply to a body that is not JSON at all (sent by the transport, which does the parsing)."""
    return _error(None, PARSE_ERROR, "Parse error")


def _valid_id(value: Any) -> bool:
    # MCP narrows JSON-RPC ids to strings and integers (never null); bool is an int to Python, not to JSON.
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


async def handle_json_rpc(core: BridgeCore, message: Any) -> dict[str, Any] | None:
    """Answer one parsed JSON-RPC message; ``None`` means no reply (a notification, or a client's response)."""
    try:
        return await _dispatch(core, message)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("tool bridge dispatch failed")
        reply_id = message.get("id") if isinstance(message, dict) and _valid_id(message.get("id")) else None
        return _error(reply_id, INTERNAL_ERROR, "Internal error")


async def _dispatch(core: BridgeCore, message: Any) -> dict[str, Any] | None:
    if isinstance(message, list):
        return _error(None, INVALID_REQUEST, "Invalid Request: JSON-RPC batches are not supported")
    if not isinstance(message, dict):
        return _error(None, INVALID_REQUEST, "Invalid Request")
    has_id = "id" in message
    id_ = message.get("id")
    if has_id and not _valid_id(id_):
        return _error(None, INVALID_REQUEST, "Invalid Request: id must be a string or an integer")
    if message.get("jsonrpc") != "2.0":
        return _error(id_, INVALID_REQUEST, 'Invalid Request: jsonrpc must be "2.0"')
    method = message.get("method")
    if "method" not in message and has_id and ("result" in message or "error" in message):
        return None  # a response to a server request; we send none, so there is nothing to match it to
    if not isinstance(method, str):
        return _error(id_, INVALID_REQUEST, "Invalid Request: method must be a string")
    params = message.get("params")
    if params is not None and not isinstance(params, dict | list):
        return _error(id_, INVALID_REQUEST, "Invalid Request: params must be an object or an array")
    if not has_id:
        return None  # notifications (initialized, cancelled, ...) need no answer
    if isinstance(params, list):
        return _error(id_, INVALID_PARAMS, "Invalid params: expected an object")
    params = params or {}

    if method == "tools/call":
        name = params.get("name")
        if not isinstance(name, str):
            return _error(id_, INVALID_PARAMS, "Invalid params: name")
        arguments = params.get("arguments")
        if arguments is not None and not isinstance(arguments, dict):
            return _error(id_, INVALID_PARAMS, "Invalid params: arguments must be an object")
        try:
            result = await core.call_tool(name, arguments)
        except UnknownToolError as exc:
            return _error(id_, INVALID_PARAMS, str(exc))
        return {"jsonrpc": "2.0", "id": id_, "result": result}
    if method == "tools/list":
        return {"jsonrpc": "2.0", "id": id_, "result": {"tools": core.list_tools()}}
    if method == "initialize":
        requested = params.get("protocolVersion")
        version = requested if requested in SUPPORTED_PROTOCOL_VERSIONS else LATEST_PROTOCOL_VERSION
        result = {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": _SERVER_INFO,
        }
        return {"jsonrpc": "2.0", "id": id_, "result": result}
    if method == "ping":
        return {"jsonrpc": "2.0", "id": id_, "result": {}}
    return _error(id_, METHOD_NOT_FOUND, "Method not found", {"method": method[:200]})
