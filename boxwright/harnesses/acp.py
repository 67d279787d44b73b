"""Any ACP agent as a harness: a JSON-RPC client over the agent's stdio (harness-bridge §6, R36-R41).

The agent runs in the sandbox; this module speaks the Agent Client Protocol (v1, schema of
``@agentclientprotocol/sdk``) to it: ``initialize``, ``session/new`` with the tool bridge as an
HTTP MCP server (or ``session/load`` to resume), one ``session/prompt``, and ``session/cancel``
on abort. ``session/update`` notifications become AG-UI events; the agent's own requests are
answered here: ``session/request_permission`` by the sandbox policy (an undecided ``ask`` is
rejected and announced as ``approval-requested``), ``fs/read_text_file`` and
``fs/write_text_file`` inside the sandbox, confined to the workspace.

Measured (harness-clis §5, and the recordings in tests/fixtures/acp): agents do not exit when
stdin closes, so the conversation ends with a kill; claude-agent-acp sends a ``tool_call`` with an
empty ``rawInput`` and the command in a later ``tool_call_update``; permission requests do not
repeat the call's ``kind``.

Durable (a deviation from R5/R6, which refuse ACP attaches): journaled, the agent runs under the
in-sandbox relay (``relay.py``), and a successor joins the conversation with ``resume`` (what the
earlier host sent, from the relay's inbox). The session id and the run's end are emitted by ``feed``
as their answers are read, so a replay of the journal yields them where the first driver did. MCP
servers given in ``session/new`` (the tool bridge) belong to the host that made the session: after a
takeover the agent still calls the dead host's bridge.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from .. import shell
from .._json import MAX_AGENT_LINE_BYTES, decode_json
from ..events import (
    CustomEvent,
    Event,
    ReasoningEndEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    now_ms,
)
from ..policy import APPROVAL_REQUESTED_EVENT, ApprovalKind, approval_requested_value, resolve_approval
from ..sandbox import ProcessOptions
from .base import HarnessContext, HarnessPlan, RunFrame, ToolCallLedger, executable_argv, executable_not_found_hint
from .interactive import AgentChannel

PROTOCOL_VERSION = 1
CLIENT_NAME = "boxwright"
CLIENT_VERSION = "0.1.0"
STDERR_TAIL_CHARS = 1000
# fs/* requests larger than this are refused: the agent's file tools are for source files, and a
# reply is one JSON line held in memory on both sides.
MAX_FS_BYTES = 8 << 20
# After session/cancel was answered, how long the agent may take to stop its tools before it is killed.
CANCEL_WIND_DOWN = 1.5
_WRITE_KINDS = frozenset({"edit", "delete", "move"})

# -- the wire (ACP v1) ---------------------------------------------------------------------------


class _Camel(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    pass


class ClientInfo(_Camel, kw_only=True):
    name: str
    title: str
    version: str


class FsCapabilities(_Camel, kw_only=True):
    read_text_file: bool
    write_text_file: bool


class ClientCapabilities(_Camel, kw_only=True):
    fs: FsCapabilities
    terminal: bool = False


class InitializeParams(_Camel, kw_only=True):
    protocol_version: int
    client_capabilities: ClientCapabilities
    client_info: ClientInfo


class HttpHeader(_Camel, kw_only=True):
    name: str
    value: str


class McpServerHttp(_Camel, kw_only=True, tag_field="type", tag="http"):
    name: str
    url: str
    headers: list[HttpHeader]


class NewSessionParams(_Camel, kw_only=True):
    cwd: str
    mcp_servers: list[McpServerHttp]


class LoadSessionParams(_Camel, kw_only=True):
    session_id: str
    cwd: str
    mcp_servers: list[McpServerHttp]


class AuthenticateParams(_Camel, kw_only=True):
    method_id: str


class TextContent(_Camel, kw_only=True, tag_field="type", tag="text"):
    text: str


class PromptParams(_Camel, kw_only=True):
    session_id: str
    prompt: list[TextContent]


class CancelParams(_Camel, kw_only=True):
    session_id: str


class RequestOut(msgspec.Struct, kw_only=True):
    jsonrpc: Literal["2.0"] = "2.0"
    id: int
    method: str
    params: Any


class NotificationOut(msgspec.Struct, kw_only=True):
    jsonrpc: Literal["2.0"] = "2.0"
    method: str
    params: Any


class RpcError(msgspec.Struct, omit_defaults=True, kw_only=True):
    code: int
    message: str
    data: Any = None


class ResponseOut(msgspec.Struct, kw_only=True):
    jsonrpc: Literal["2.0"] = "2.0"
    id: int | str
    result: Any


class ErrorOut(msgspec.Struct, kw_only=True):
    jsonrpc: Literal["2.0"] = "2.0"
    id: int | str
    error: RpcError


class SelectedOutcome(_Camel, kw_only=True, tag_field="outcome", tag="selected"):
    option_id: str


class CancelledOutcome(_Camel, kw_only=True, tag_field="outcome", tag="cancelled"):
    pass


class PermissionResult(_Camel, kw_only=True):
    outcome: SelectedOutcome | CancelledOutcome


class Incoming(msgspec.Struct, kw_only=True):
    """Any line from the agent: a request (method+id), a notification (method) or a response (id)."""

    id: int | str | None = None
    method: str | None = None
    params: Any = None
    result: Any = None
    error: RpcError | None = None


class ToolCallFields(_Camel, kw_only=True):
    tool_call_id: str
    title: str | None = None
    kind: str | None = None
    status: str | None = None
    raw_input: Any = None
    raw_output: Any = None
    content: Any = None


class SessionUpdate(_Camel, kw_only=True):
    session_update: str
    content: Any = None
    tool_call_id: str | None = None
    title: str | None = None
    kind: str | None = None
    status: str | None = None
    raw_input: Any = None
    raw_output: Any = None
    entries: Any = None
    message_id: str | None = None


class SessionNotification(_Camel, kw_only=True):
    session_id: str
    update: SessionUpdate


class PermissionOption(_Camel, kw_only=True):
    option_id: str
    kind: str
    name: str | None = None


class PermissionRequest(_Camel, kw_only=True):
    session_id: str
    tool_call: ToolCallFields
    options: list[PermissionOption]


class ReadTextFile(_Camel, kw_only=True):
    session_id: str
    path: str
    line: int | None = None
    limit: int | None = None


class WriteTextFile(_Camel, kw_only=True):
    session_id: str
    path: str
    content: str


class PromptUsage(_Camel, kw_only=True):
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    cached_read_tokens: int | None = None
    cached_write_tokens: int | None = None
    thought_tokens: int | None = None


class PromptResult(_Camel, kw_only=True):
    stop_reason: str
    usage: PromptUsage | None = None


class AgentCapabilities(_Camel, kw_only=True):
    load_session: bool = False


class AuthMethod(_Camel, kw_only=True):
    id: str


class InitializeResult(_Camel, kw_only=True):
    protocol_version: int
    agent_capabilities: AgentCapabilities = msgspec.field(default_factory=AgentCapabilities)
    auth_methods: list[AuthMethod] = msgspec.field(default_factory=list)


class NewSessionResult(_Camel, kw_only=True):
    session_id: str


_encode = msgspec.json.Encoder().encode


def _line(message: msgspec.Struct) -> str:
    return _encode(message).decode()


class AcpError(Exception):
    """The agent answered a request with a JSON-RPC error, or broke the protocol."""

    def __init__(self, method: str, message: str, code: str = "acp_error") -> None:
        super().__init__(f"ACP {method} failed: {message}")
        self.code = code


# -- the harness -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AcpHarness:
    """An ACP agent started by ``command`` in the sandbox. Build it with :func:`acp`."""

    command: tuple[str, ...]
    label: str = "acp"
    env: Mapping[str, str] = field(default_factory=dict)
    # Served inside the sandbox when advertised; off makes agents use their own file tools.
    serve_fs: bool = True
    auth_method: str | None = None
    emit_diff: bool = True
    install_hint: str = "install the ACP agent in the sandbox"
    # Copied from the host env (run_agent's ``host_env``) when set there; ``env`` wins. Their values
    # are secrets (API keys): masked in every event and log of the run.
    host_env_names: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.label

    @property
    def executable(self) -> str:
        # run_agent looks this up on the host and shows it to a bubblewrap sandbox read-only.
        return self.command[0]

    def plan(self, ctx: HarnessContext) -> HarnessPlan:
        if not ctx.capabilities.writable_stdin:
            raise ValueError(f"{self.label} speaks ACP over stdio and needs a sandbox with writable stdin")
        argv = [*executable_argv(self.command[0], ctx), *self.command[1:]]
        env = {name: ctx.host_env[name] for name in self.host_env_names if ctx.host_env.get(name)}
        env.update(self.env)
        secrets = [env[name] for name in self.host_env_names if env.get(name) and ("KEY" in name or "TOKEN" in name)]
        command = "exec " + " ".join(shell.quote(p) for p in argv)
        return HarnessPlan(command=command, stdin=None, env=env, secrets=secrets)

    def translator(self, ctx: HarnessContext) -> AcpTranslator:
        return AcpTranslator(ctx, self)


def acp(
    command: str | Sequence[str],
    *,
    name: str = "acp",
    env: Mapping[str, str] | None = None,
    serve_fs: bool = True,
    auth_method: str | None = None,
    emit_diff: bool = True,
) -> AcpHarness:
    """A harness for any ACP agent: ``command`` is its argv (a string is split on spaces)."""
    argv = tuple(command.split() if isinstance(command, str) else command)
    if not argv or not argv[0]:
        raise ValueError("acp needs the agent's command, e.g. acp('claude-agent-acp')")
    return AcpHarness(
        command=argv, label=name, env=dict(env or {}), serve_fs=serve_fs, auth_method=auth_method, emit_diff=emit_diff
    )


# -- translation -----------------------------------------------------------------------------------


@dataclass
class _Call:
    title: str | None = None
    kind: str | None = None
    raw_input: Any = None
    ended: bool = False


def _text_of(content: Any) -> str | None:
    """Text of a tool call's ``content`` list (``{type:"content", content:{type:"text"}}`` / diff blocks)."""
    if not isinstance(content, list):
        return None
    parts: list[str] = []
    for item in content:
        if not isinstance(item, dict):
            continue
        inner = item.get("content")
        if isinstance(inner, dict) and inner.get("type") == "text" and isinstance(inner.get("text"), str):
            parts.append(inner["text"])
        elif item.get("type") == "diff":
            parts.append(json.dumps({k: item.get(k) for k in ("path", "oldText", "newText")}))
    return "\n".join(parts) if parts else None


def _command_text(command: Any) -> str | None:
    """The shell command a tool call runs: a string, or an argv (codex-acp: ``["/bin/bash", "-lc", cmd]``)."""
    if isinstance(command, str):
        return command
    if isinstance(command, list) and command and all(isinstance(part, str) for part in command):
        if (
            len(command) == 3
            and posixpath.basename(command[0]) in ("bash", "sh", "zsh")
            and command[1] in ("-c", "-lc")
        ):
            return str(command[2])
        return " ".join(command)
    return None


class AcpTranslator:
    """ACP lines -> AG-UI events, and the client side of the conversation. Never raises from ``feed``."""

    def __init__(self, ctx: HarnessContext, harness: AcpHarness) -> None:
        self._ctx = ctx
        self._harness = harness
        self._gen_id = ctx.gen_id
        self._frame = RunFrame(ctx.thread_id, ctx.run_id)
        self._ledger = ToolCallLedger()
        self._bridge_prefix = f"mcp__{ctx.bridge.name}__" if ctx.bridge is not None else None
        self._channel: AgentChannel | None = None
        self._next_id = 0
        self._pending: dict[int, tuple[str, asyncio.Future[Any]]] = {}
        self._session_id: str | None = None
        self._replaying = False
        self._text_id: str | None = None
        self._reasoning_id: str | None = None
        self._calls: dict[str, _Call] = {}
        self._usage: PromptUsage | None = None
        self._cancelled = False
        self._rejected = False  # a permission was refused: an agent may then end its turn as cancelled
        # Joining a conversation another host began (``resume``): our requests it already sent (their
        # answers are in the journal, to be replayed) and the agent's requests it already answered.
        self._resumed: dict[int, asyncio.Future[Any]] = {}
        self._answered: set[int | str] = set()
        self.skipped_lines = 0
        self.real_cwd: str | None = None

    # -- the conversation --------------------------------------------------------------------------

    def attach(self, channel: AgentChannel) -> None:
        self._channel = channel
        channel.spawn(self._converse(channel))

    def resume(self, sent: list[str]) -> None:
        """What an earlier host sent this agent (the relay's inbox, in order): not to be sent again.

        The conversation is a fixed script (initialize, session/new or load, prompt), so this host's
        k-th request is the earlier host's k-th: it waits for that answer, which the journal replays.
        """
        for line in sent:
            try:
                message = msgspec.convert(decode_json(line, max_bytes=MAX_AGENT_LINE_BYTES), Incoming)
            except Exception:
                continue  # a line cut by the earlier host's death: the agent never had it whole
            if message.method is None and message.id is not None:
                self._answered.add(message.id)
            elif message.method == "session/cancel":
                self._cancelled = True
            elif message.method is not None and isinstance(message.id, int):
                future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                self._resumed[message.id] = future
                self._pending[message.id] = (message.method, future)
                if message.method == "session/load":
                    self._replaying = True  # until its answer: the replayed old turns are not this run's

    def on_abort(self) -> None:
        self._cancelled = True
        if self._channel is not None and self._session_id is not None:
            self._channel.send(
                _line(NotificationOut(method="session/cancel", params=CancelParams(session_id=self._session_id)))
            )

    def _call(self, method: str, params: msgspec.Struct) -> asyncio.Future[Any]:
        assert self._channel is not None
        self._next_id += 1
        resumed = self._resumed.pop(self._next_id, None)
        if resumed is not None:
            return resumed  # an earlier host sent it; its answer is (or will be) in the journal
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = (method, future)
        if method == "session/load":
            # Set here, not after the call: the answer and the replay before it may be read at once.
            self._replaying = True
        self._channel.send(_line(RequestOut(id=self._next_id, method=method, params=params)))
        return future

    async def _converse(self, channel: AgentChannel) -> None:
        try:
            await self._handshake(channel)
            assert self._session_id is not None
            prompt = self._ctx.prompt
            if self._ctx.system_prompt:
                prompt = f"{self._ctx.system_prompt}\n\n{prompt}"  # R4: only Claude has a flag for it
            # Its answer ends the run in ``feed`` (``_answered_call``), in the order of the agent's lines.
            await self._call(
                "session/prompt", PromptParams(session_id=self._session_id, prompt=[TextContent(text=prompt)])
            )
        except AcpError as exc:
            channel.emit(self._fail(str(exc), exc.code))
        except msgspec.ValidationError as exc:
            channel.emit(self._fail(f"ACP agent sent a malformed reply: {exc}", "acp_protocol_error"))
        finally:
            # A cancelled turn: the agent is still stopping its tools' processes; let it, then stop it.
            channel.end(CANCEL_WIND_DOWN if self._cancelled else 0.0)

    async def _handshake(self, channel: AgentChannel) -> None:
        info = ClientInfo(name=CLIENT_NAME, title="boxwright", version=CLIENT_VERSION)
        serve = self._harness.serve_fs
        caps = ClientCapabilities(fs=FsCapabilities(read_text_file=serve, write_text_file=serve))
        init = msgspec.convert(
            await self._call(
                "initialize",
                InitializeParams(protocol_version=PROTOCOL_VERSION, client_capabilities=caps, client_info=info),
            ),
            InitializeResult,
        )
        if init.protocol_version > PROTOCOL_VERSION:
            raise AcpError(
                "initialize",
                f"the agent speaks ACP protocol {init.protocol_version}; boxwright speaks {PROTOCOL_VERSION}",
                "acp_protocol_version",
            )
        if self._harness.auth_method is not None:
            if self._harness.auth_method not in {m.id for m in init.auth_methods}:
                advertised = ", ".join(m.id for m in init.auth_methods) or "none"
                raise AcpError("authenticate", f"method {self._harness.auth_method!r} not advertised ({advertised})")
            await self._call("authenticate", AuthenticateParams(method_id=self._harness.auth_method))
        # session/new wants the path as the agent sees it; /workspace is virtual on local-process.
        where = await channel.handle.process.exec("pwd -P", ProcessOptions(cwd=channel.cwd))
        self.real_cwd = where.stdout.strip() or channel.cwd
        servers = self._mcp_servers()
        loaded = False
        if self._ctx.session_id and init.agent_capabilities.load_session:
            # The agent replays the old turns as updates first: not this run's output (see _call).
            try:
                await self._call(
                    "session/load",
                    LoadSessionParams(session_id=self._ctx.session_id, cwd=self.real_cwd, mcp_servers=servers),
                )
                loaded = True
            except AcpError:
                self._session_id = None  # R38: a failed load falls back to a new session
        if not loaded:
            msgspec.convert(
                await self._call("session/new", NewSessionParams(cwd=self.real_cwd, mcp_servers=servers)),
                NewSessionResult,
            )
        # The session id is set, and announced, by ``feed`` as the answer is read (``_answered_call``).

    def _mcp_servers(self) -> list[McpServerHttp]:
        bridge = self._ctx.bridge
        if bridge is None:
            return []
        header = HttpHeader(name="Authorization", value=f"Bearer {bridge.token}")
        return [McpServerHttp(name=bridge.name, url=bridge.url, headers=[header])]

    # -- lines from the agent --------------------------------------------------------------------------

    def feed(self, line: str) -> list[Event]:
        out: list[Event] = []
        if not line.strip():
            return out
        try:
            message = msgspec.convert(decode_json(line, max_bytes=MAX_AGENT_LINE_BYTES), Incoming)
        except Exception:  # a log line on stdout, a cut-off write: counted, never fatal
            self.skipped_lines += 1
            return out
        try:
            if message.method is not None and message.id is not None:
                self._request(message, out)
            elif message.method is not None:
                if message.method == "session/update" and not self._frame.ended:
                    self._update(msgspec.convert(message.params, SessionNotification).update, out)
            elif isinstance(message.id, int) and message.id in self._pending:
                method, future = self._pending.pop(message.id)
                if method == "session/load":
                    self._replaying = False
                if future.done():
                    pass
                elif message.error is not None:
                    future.set_exception(AcpError(method, message.error.message))
                else:
                    future.set_result(message.result)
                    out += self._answered_call(method, message.result)
        except Exception:  # a line of an unforeseen shape must not end the run
            self.skipped_lines += 1
        return out

    def _answered_call(self, method: str, result: Any) -> list[Event]:
        """The events an answer brings, in line order: a replay (a successor's) then yields them where they were."""
        if method in ("session/new", "session/load"):
            if method == "session/new":
                self._session_id = msgspec.convert(result, NewSessionResult).session_id
            else:
                self._session_id = self._ctx.session_id
            name = f"{self._harness.label}.session-id"
            return [*self._frame.start(), CustomEvent(name=name, value={"sessionId": self._session_id})]
        if method == "session/prompt" and not self._frame.ended:
            try:
                return self._done(msgspec.convert(result, PromptResult))
            except msgspec.ValidationError as exc:
                return self._fail(f"ACP agent sent a malformed reply: {exc}", "acp_protocol_error")
        return []

    def finish(self, exit_code: int, stderr_tail: str) -> list[Event]:
        for method, future in self._pending.values():
            if not future.done():
                future.set_exception(AcpError(method, "the agent exited"))
        self._pending.clear()
        if self._frame.ended:
            return []
        out = self._close_open()
        out += self._ledger.interrupt_all(self._gen_id)
        tail = stderr_tail.strip()[-STDERR_TAIL_CHARS:]
        if exit_code == 127 and ("not found" in tail.lower() or "no such file" in tail.lower()):
            name = self._harness.command[0]
            hint = executable_not_found_hint(name, self._ctx, self._harness.install_hint)
            return out + self._frame.error(
                f"the ACP agent {name!r} was not found in the sandbox ({tail}): {hint}", "executable_not_found"
            )
        message = f"the ACP agent exited with code {exit_code} before its turn ended"
        return out + self._frame.error(message + (f": {tail}" if tail else ""), f"exit_code_{exit_code}")

    # -- agent requests (R40, fs) -----------------------------------------------------------------------

    def _request(self, message: Incoming, out: list[Event]) -> None:
        assert message.id is not None
        request_id = message.id
        if message.method == "session/request_permission":
            result = self.answer_permission(msgspec.convert(message.params, PermissionRequest), out)
            self._reply(ResponseOut(id=request_id, result=result))
        elif message.method in ("fs/read_text_file", "fs/write_text_file") and self._harness.serve_fs:
            if self._channel is not None:
                self._channel.spawn(self._serve_fs(request_id, message.method, message.params))
        else:
            error = RpcError(code=-32601, message=f"Method not found: {message.method}")
            self._reply(ErrorOut(id=request_id, error=error))

    def _reply(self, message: ResponseOut | ErrorOut) -> None:
        if message.id in self._answered:
            return  # an earlier host answered it (see resume): the agent has its answer
        if self._channel is not None:
            self._channel.send(_line(message))

    def answer_permission(self, request: PermissionRequest, out: list[Event]) -> PermissionResult:
        """The policy's reply to ``session/request_permission`` (R40); an ask adds an approval event to ``out``."""
        call = request.tool_call
        known = self._calls.get(call.tool_call_id, _Call())
        title = call.title or known.title or ""
        kind = call.kind or known.kind
        raw_input = call.raw_input if isinstance(call.raw_input, dict) and call.raw_input else known.raw_input
        tool_input = raw_input if isinstance(raw_input, dict) else {}
        decision = self._decide(title, kind, tool_input, out)
        self._rejected = self._rejected or decision != "allow"
        wanted = ("allow_once", "allow_always") if decision == "allow" else ("reject_once", "reject_always")
        for option_kind in wanted:
            for option in request.options:
                if option.kind == option_kind:
                    return PermissionResult(outcome=SelectedOutcome(option_id=option.option_id))
        return PermissionResult(outcome=CancelledOutcome())

    def _decide(self, title: str, kind: str | None, tool_input: Mapping[str, Any], out: list[Event]) -> str:
        policy = self._ctx.policy
        if policy is None or self._bridged(title, tool_input) is not None:
            return "allow"  # no policy = bypassPermissions (R40); our own bridge tools are the app's
        command = _command_text(tool_input.get("command"))
        if command is None and kind == "execute" and title:
            command = title.strip().strip("`")  # Gemini CLI asks with the command as the title alone
        action: ApprovalKind
        if kind == "execute" and command is not None:
            action, target = "command", command
        elif kind in _WRITE_KINDS:
            action, target = "fileWrite", title
        elif kind == "fetch":
            action, target = "network", title
        else:
            action, target = "tool", title or kind or "tool"
        label = self._harness.label
        verdict = resolve_approval(policy, provider=label, kind=action, target=target)
        if verdict.needs_approval:
            shown = f"Approve {kind or 'tool'}" + (
                f": {target}" if action == "command" else f": {title}" if title else ""
            )
            value = approval_requested_value(verdict.approval_id, shown, {"provider": label, "toolName": kind or title})
            out.append(CustomEvent(name=APPROVAL_REQUESTED_EVENT, value=value, timestamp=now_ms()))
        return verdict.decision

    async def _serve_fs(self, request_id: int | str, method: str | None, params: Any) -> None:
        assert self._channel is not None
        try:
            if method == "fs/read_text_file":
                read = msgspec.convert(params, ReadTextFile)
                text = await self._channel.handle.fs.read(self._virtual(read.path))
                if len(text) > MAX_FS_BYTES:
                    raise ValueError(f"{read.path} is larger than {MAX_FS_BYTES} bytes")
                if read.line is not None or read.limit is not None:
                    lines = text.splitlines(keepends=True)
                    start = max((read.line or 1) - 1, 0)
                    text = "".join(lines[start : start + read.limit if read.limit is not None else None])
                self._reply(ResponseOut(id=request_id, result={"content": text}))
            else:
                write = msgspec.convert(params, WriteTextFile)
                if len(write.content) > MAX_FS_BYTES:
                    raise ValueError(f"the content for {write.path} is larger than {MAX_FS_BYTES} bytes")
                await self._channel.handle.fs.write(self._virtual(write.path), write.content)
                self._reply(ResponseOut(id=request_id, result=None))
        except Exception as exc:
            self._reply(ErrorOut(id=request_id, error=RpcError(code=-32603, message=str(exc)[:500])))

    def _virtual(self, path: str) -> str:
        """The agent's absolute path as a workspace path; anything outside the workspace is refused."""
        real = self.real_cwd or self._ctx.cwd
        clean = posixpath.normpath(posixpath.join(real, path))
        if clean != real and not clean.startswith(real.rstrip("/") + "/"):
            raise PermissionError(f"{path} is outside the workspace {real}")
        return posixpath.join(self._ctx.cwd, posixpath.relpath(clean, real)) if clean != real else self._ctx.cwd

    # -- session updates (R39) ------------------------------------------------------------------------

    def _update(self, update: SessionUpdate, out: list[Event]) -> None:
        if self._replaying:
            return
        kind = update.session_update
        if kind == "agent_message_chunk":
            content = update.content if isinstance(update.content, dict) else {}
            if content.get("type") == "text" and isinstance(content.get("text"), str):
                if not content["text"]:
                    return  # claude-agent-acp opens each message with an empty chunk
                out += self._close_reasoning()
                if self._text_id is None:
                    self._text_id = self._gen_id()
                    out.append(TextMessageStartEvent(message_id=self._text_id, role="assistant", timestamp=now_ms()))
                out.append(TextMessageContentEvent(message_id=self._text_id, delta=content["text"], timestamp=now_ms()))
            elif content:
                out.append(
                    CustomEvent(name=f"{self._harness.label}.message-content", value=content, timestamp=now_ms())
                )
        elif kind == "agent_thought_chunk":
            content = update.content if isinstance(update.content, dict) else {}
            if isinstance(content.get("text"), str):
                out += self._close_text()
                if self._reasoning_id is None:
                    self._reasoning_id = self._gen_id()
                    out.append(ReasoningStartEvent(message_id=self._reasoning_id, timestamp=now_ms()))
                    out.append(ReasoningMessageStartEvent(message_id=self._reasoning_id, timestamp=now_ms()))
                out.append(
                    ReasoningMessageContentEvent(
                        message_id=self._reasoning_id, delta=content["text"], timestamp=now_ms()
                    )
                )
        elif kind in ("tool_call", "tool_call_update") and update.tool_call_id:
            out += self._close_open()
            self._tool(update, update.tool_call_id, out)
        elif kind == "plan":
            out.append(
                CustomEvent(name=f"{self._harness.label}.plan", value={"entries": update.entries}, timestamp=now_ms())
            )

    def _tool(self, update: SessionUpdate, call_id: str, out: list[Event]) -> None:
        call = self._calls.get(call_id)
        if call is None:
            call = self._calls[call_id] = _Call()
            call.title, call.kind = update.title, update.kind
            name = self._bridged(update.title or "", update.raw_input) or update.kind or "tool"
            out.append(
                ToolCallStartEvent(tool_call_id=call_id, tool_call_name=name, tool_name=name, timestamp=now_ms())
            )
            self._ledger.started(call_id)
        call.title = update.title or call.title
        call.kind = update.kind or call.kind
        if isinstance(update.raw_input, dict) and update.raw_input:
            call.raw_input = update.raw_input
        status = update.status
        if not call.ended and status in ("in_progress", "completed", "failed"):
            self._end_call(call_id, call, out)
        if status in ("completed", "failed") and self._ledger.resolved(call_id):
            out.append(
                ToolCallResultEvent(
                    message_id=self._gen_id(),
                    tool_call_id=call_id,
                    content=self._result_text(update, status),
                    role="tool",
                    state="output-error" if status == "failed" else None,
                    timestamp=now_ms(),
                )
            )

    def _end_call(self, call_id: str, call: _Call, out: list[Event]) -> None:
        call.ended = True
        tool_input: dict[str, Any] = {"title": call.title} if call.title else {}
        if isinstance(call.raw_input, dict):
            tool_input.update(call.raw_input)
        args = json.dumps(tool_input, separators=(",", ":"), ensure_ascii=False)
        out.append(ToolCallArgsEvent(tool_call_id=call_id, delta=args, timestamp=now_ms()))
        out.append(ToolCallEndEvent(tool_call_id=call_id, input=tool_input, timestamp=now_ms()))

    @staticmethod
    def _result_text(update: SessionUpdate, status: str) -> str:
        raw = update.raw_output
        if isinstance(raw, str) and raw:
            return raw
        if isinstance(raw, list) and raw and all(isinstance(b, dict) and b.get("type") == "text" for b in raw):
            return "\n".join(str(b.get("text", "")) for b in raw)  # MCP content blocks: their text
        if raw not in (None, "", {}, []):
            return json.dumps(raw, ensure_ascii=False)
        text = _text_of(update.content)
        if text is not None:
            return text
        return json.dumps({"status": status})

    def _bridged(self, title: str, raw_input: Any) -> str | None:
        """The bridge tool a call is, by its title or (codex-acp) its ``rawInput {server, tool}``; else None."""
        if self._bridge_prefix is None:
            return None
        if isinstance(raw_input, dict) and isinstance(raw_input.get("tool"), str):
            if raw_input.get("server") == self._bridge_prefix.split("__")[1]:
                return str(raw_input["tool"])
        return self._bridged_name(title.removeprefix("Tool: "))

    def _bridged_name(self, title: str) -> str | None:
        """The bridge tool a title names: ``mcp__<bridge>__t``, ``t``-prefixed forms; None for the agent's own tools."""
        if self._bridge_prefix is None:
            return None
        stripped = title.strip("`")
        if stripped.startswith(self._bridge_prefix):
            return stripped.removeprefix(self._bridge_prefix).split(" ", 1)[0] or None
        bridge = self._bridge_prefix.split("__")[1]
        served = re.fullmatch(rf"(\S+) \({re.escape(bridge)} MCP Server\)", stripped)
        if served is not None:
            return served.group(1)  # Gemini CLI's title: "<tool> (<server> MCP Server)"
        stripped = stripped.removeprefix("mcp_")  # Gemini CLI's function name: mcp_<server>_<tool>
        for sep in ("_", ".", "/", ": "):
            if stripped.startswith(bridge + sep):
                return stripped.removeprefix(bridge + sep).split(" ", 1)[0] or None
        return None

    # -- the end --------------------------------------------------------------------------------------

    def _done(self, result: PromptResult) -> list[Event]:
        out = self._close_open()
        out += self._ledger.interrupt_all(self._gen_id)
        usage = result.usage
        tokens: list[TokenUsage] | None = None
        if usage is not None and (usage.input_tokens is not None or usage.output_tokens is not None):
            total = usage.total_tokens
            if total is None and usage.input_tokens is not None and usage.output_tokens is not None:
                total = usage.input_tokens + usage.output_tokens
            tokens = [
                TokenUsage(
                    input_tokens=usage.input_tokens,
                    output_tokens=usage.output_tokens,
                    total_tokens=total,
                    cached_input_tokens=usage.cached_read_tokens,
                    cache_write_input_tokens=usage.cached_write_tokens,
                    reasoning_tokens=usage.thought_tokens,
                )
            ]
        reason = result.stop_reason
        if reason == "refusal":
            return out + self._frame.error("the agent refused the prompt", "refusal")
        if reason == "cancelled" and (self._cancelled or not self._rejected):
            return out + self._frame.error("the agent's turn was cancelled", "cancelled")
        # Measured: codex-acp ends the whole turn as ``cancelled`` when a permission is rejected. That
        # is the policy's refusal taking effect, not a cancel: the run finishes.
        finish: Literal["stop", "length"] = "length" if reason in ("max_tokens", "max_turn_requests") else "stop"
        return out + self._frame.finish(finish, usage=tokens)

    def _fail(self, message: str, code: str) -> list[Event]:
        return self._close_open() + self._ledger.interrupt_all(self._gen_id) + self._frame.error(message, code)

    def _close_text(self) -> list[Event]:
        if self._text_id is None:
            return []
        closed: list[Event] = [TextMessageEndEvent(message_id=self._text_id, timestamp=now_ms())]
        self._text_id = None
        return closed

    def _close_reasoning(self) -> list[Event]:
        if self._reasoning_id is None:
            return []
        rid, self._reasoning_id = self._reasoning_id, None
        return [
            ReasoningMessageEndEvent(message_id=rid, timestamp=now_ms()),
            ReasoningEndEvent(message_id=rid, timestamp=now_ms()),
        ]

    def _close_open(self) -> list[Event]:
        return self._close_text() + self._close_reasoning()
