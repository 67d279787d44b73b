"""Claude Code as a harness: ``claude -p --output-format stream-json`` in the sandbox, its NDJSON as AG-UI events.

The line shapes handled here were measured against Claude Code 2.1.328 (recordings in
``tests/fixtures/claude``). Facts the translator leans on:

- one ``assistant`` line per content block, several sharing one ``message.id``;
- with ``--include-partial-messages`` a block's full ``assistant`` line arrives between its
  last delta and its ``content_block_stop``, so text and thinking of a streamed message are
  emitted from the deltas and the full line is not repeated;
- parallel tool results may come back in any order (reverse, measured): they are matched by id;
- a failed run can say ``subtype:"success"`` with ``is_error:true``: ``is_error`` decides.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from .. import shell
from .._json import MAX_AGENT_LINE_BYTES, decode_json
from ..auth import AuthMode, harness_auth_env, resolve_auth_mode, scrub_env_for
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
from ..policy import (
    APPROVAL_REQUESTED_EVENT,
    ApprovalKind,
    SandboxPolicy,
    approval_requested_value,
    claude_code_permissions,
    resolve_approval,
)
from ..tool_bridge.tools import Tool, define_tool
from .base import (
    HarnessContext,
    HarnessPlan,
    RunFrame,
    ToolCallLedger,
    csv,
    executable_argv,
    executable_not_found_hint,
)
from .base import as_count as _count
from .base import as_dict as _dict
from .base import as_str as _str
from .base import compact_json as _compact

NAME = "claude-code"
LOCAL_PROCESS = "local-process"
DEFAULT_PERMISSION_MODE = "bypassPermissions"
SESSION_ID_EVENT = "claude-code.session-id"
FILE_CHANGED_EVENT = "file.changed"
STRUCTURED_START_EVENT = "structured-output.start"
STRUCTURED_COMPLETE_EVENT = "structured-output.complete"
# The synthetic tool through which ``--json-schema`` delivers its object; an implementation detail
# of the CLI, so it gets no tool events (R21).
STRUCTURED_TOOL = "StructuredOutput"
INSTALL_COMMAND = "npm install @anthropic-ai/claude-code"
STDERR_TAIL_CHARS = 1000
SCHEMA_INSTRUCTION = "Respond with a single JSON object (no prose, no code fence) that matches this JSON Schema:"

SystemPromptMode = Literal["append", "replace"]


def _host_is_root() -> bool:
    geteuid = getattr(os, "geteuid", None)
    return geteuid is not None and geteuid() == 0


@dataclass(frozen=True)
class ClaudeCodeHarness:
    """Runs ``claude`` headless. Build it with :func:`claude_code`."""

    model: str | None = None
    executable: str = "claude"
    permission_mode: str | None = None
    allowed_tools: tuple[str, ...] = ()
    disallowed_tools: tuple[str, ...] = ()
    max_turns: int | None = None
    add_dirs: tuple[str, ...] = ()
    include_partial_messages: bool = True
    system_prompt_mode: SystemPromptMode = "append"
    output_schema: dict[str, Any] | None = None
    auth_mode: AuthMode | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    emit_diff: bool = True

    @property
    def name(self) -> str:
        return NAME

    # -- plan ------------------------------------------------------------------------------------

    def permission_tool(
        self,
        policy: SandboxPolicy | None,
        mode: str | None = None,
        *,
        approvals: Mapping[str, bool] | None = None,
        emit: Callable[[str, Any], None] | None = None,
    ) -> Tool | None:
        """The bridge tool that decides Claude's permission prompts by ``policy`` (R18), or None.

        Needed when the policy has rules a permission mode cannot express (command globs, ``ask``)
        and the mode lets Claude ask at all (``bypassPermissions`` never asks).
        """
        if policy is None or not _needs_prompts(policy):
            return None
        if (mode or self.permission_mode) == "bypassPermissions":
            return None  # bypass never asks
        return approval_prompt_tool(policy, approvals=approvals, emit=emit)

    def resolve_permission_mode(self, ctx: HarnessContext) -> str:
        """Config > ``default`` when the policy answers prompts > policy mapping > ``bypassPermissions``.

        Measured: ``acceptEdits`` lets Bash write without asking, so a policy with command rules or
        an ``ask``/``deny`` default runs Claude in ``default`` mode, where every action that is not
        read-only goes to the policy's prompt tool.
        """
        if self.permission_mode:
            return self.permission_mode
        if ctx.bridge is not None and ctx.policy is not None and _needs_prompts(ctx.policy):
            return "default"
        return claude_code_permissions(ctx.policy).permission_mode or DEFAULT_PERMISSION_MODE

    def plan(self, ctx: HarnessContext) -> HarnessPlan:
        permissions = claude_code_permissions(ctx.policy)
        mode = self.resolve_permission_mode(ctx)
        suffix = _file_suffix(ctx)
        q = shell.quote
        # ``project`` too: with ``user`` alone Claude ignores the workspace's .mcp.json and .claude/skills.
        # By absolute path when run_agent found it on the host: a sandbox's PATH need not find an install in /opt.
        parts = ["exec", *(q(p) for p in executable_argv(self.executable, ctx))]
        parts += ["--setting-sources", "user,project", "-p", "--output-format", "stream-json", "--verbose"]
        if self.model:
            parts += ["--model", q(self.model)]
        if self.include_partial_messages:
            parts.append("--include-partial-messages")
        if ctx.session_id:
            parts += ["--resume", q(ctx.session_id)]
        parts += ["--permission-mode", q(mode)]
        if self.max_turns is not None:
            parts += ["--max-turns", q(str(self.max_turns))]
        for directory in self.add_dirs:
            parts += ["--add-dir", q(directory)]
        files: dict[str, str] = {}
        secrets: list[str] = []
        allowed = [*self.allowed_tools, *permissions.allowed_tools]
        mcp_config: str | None = None
        if ctx.bridge is not None:
            mcp_config = f"/tmp/boxwright-mcp-{suffix}.json"
            server = {"type": "http", "url": ctx.bridge.url, "headers": {"Authorization": f"Bearer {ctx.bridge.token}"}}
            files[mcp_config] = json.dumps({"mcpServers": {ctx.bridge.name: server}})
            secrets.append(ctx.bridge.token)
            # Measured: MCP tools are denied unless allowed, and the whole server is the unit that works.
            allowed.append(f"mcp__{ctx.bridge.name}")
        if csv(allowed):
            parts += ["--allowedTools", q(csv(allowed))]
        disallowed = csv([*self.disallowed_tools, *permissions.disallowed_tools])
        if disallowed:
            parts += ["--disallowedTools", q(disallowed)]
        system_prompt = (ctx.system_prompt or "").strip()
        if system_prompt:
            flag = "--system-prompt" if self.system_prompt_mode == "replace" else "--append-system-prompt"
            parts += [flag, q(system_prompt)]
        if mcp_config is not None:
            parts += ["--mcp-config", q(mcp_config)]
            if self.permission_tool(ctx.policy, mode) is not None and ctx.bridge is not None:
                # Claude asks this bridge tool before each action the mode does not allow outright.
                parts += ["--permission-prompt-tool", q(f"mcp__{ctx.bridge.name}__{APPROVAL_TOOL}")]
        prompt = ctx.prompt
        if self.output_schema is not None:
            schema = _compact(self.output_schema)
            parts += ["--json-schema", q(schema)]
            prompt = f"{prompt}\n\n{SCHEMA_INSTRUCTION}\n{schema}"
        stdin: str | None = prompt
        if not ctx.capabilities.writable_stdin:
            prompt_file = f"/tmp/boxwright-claude-prompt-{suffix}"
            files[prompt_file] = prompt
            parts += ["<", q(prompt_file)]
            stdin = None
        env = self._env(ctx, mode)
        secrets += [value for name, value in env.items() if name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")]
        command = " ".join(parts)
        scrub = scrub_env_for(NAME, resolve_auth_mode(ctx.auth_mode, self.auth_mode))
        if scrub:
            # Host login: keys inherited from the host env (local-process) must not override it; unset, not blank.
            command = f"unset {' '.join(scrub)}; {command}"
        return HarnessPlan(command=command, stdin=stdin, env=env, files=files, secrets=list(dict.fromkeys(secrets)))

    def _env(self, ctx: HarnessContext, mode: str) -> dict[str, str]:
        host = ctx.host_env
        env = harness_auth_env(NAME, resolve_auth_mode(ctx.auth_mode, self.auth_mode), host)
        if host.get("ANTHROPIC_BASE_URL"):
            env["ANTHROPIC_BASE_URL"] = host["ANTHROPIC_BASE_URL"]
        env["DISABLE_TELEMETRY"] = "1"
        env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] = "1"
        # Claude refuses bypassPermissions as root unless told it is sandboxed. Other providers are
        # sandboxes by construction. On local-process it is only set where the mode needs it and the
        # host is root, i.e. the operator already chose to run an unconfined root agent there.
        local = ctx.provider == LOCAL_PROCESS
        if not local or (mode == "bypassPermissions" and _host_is_root()):
            env["IS_SANDBOX"] = "1"
            env["CLAUDE_CODE_SANDBOXED"] = "1"
        if local and not host.get("HOME") and host.get("USERPROFILE"):
            env["HOME"] = host["USERPROFILE"]  # Windows hosts have no HOME; claude keeps its state there
        env.update(self.env)
        return env

    # -- translate -------------------------------------------------------------------------------

    def translator(self, ctx: HarnessContext) -> ClaudeCodeTranslator:
        return ClaudeCodeTranslator(
            ctx,
            bridge_server=ctx.bridge.name if ctx.bridge is not None else "boxwright",
            structured=self.output_schema is not None,
            executable=self.executable,
        )

    # -- after the run (R20) -------------------------------------------------------------------

    def diff_command(self, ctx: HarnessContext) -> str | None:
        """The command whose output becomes ``file.changed``; None when ``emit_diff`` is off."""
        return f"git -C {shell.quote(ctx.cwd)} diff" if self.emit_diff else None

    def diff_events(self, ctx: HarnessContext, exit_code: int, stdout: str) -> list[Event]:
        """``CUSTOM file.changed {path:".", diff}`` for a dirty tree; a failed ``git diff`` is no event."""
        if not self.emit_diff or exit_code != 0 or not stdout.strip():
            return []
        value = {"path": ".", "diff": stdout, "threadId": ctx.thread_id, "runId": ctx.run_id}
        return [CustomEvent(name=FILE_CHANGED_EVENT, value=value, timestamp=now_ms())]


def _file_suffix(ctx: HarnessContext) -> str:
    # run_agent passes the journal's filename encoding; without it, a hash keeps names safe and per-run.
    return ctx.file_suffix or hashlib.sha256(ctx.run_id.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def claude_code(
    model: str | None = None,
    *,
    executable: str = "claude",
    permission_mode: str | None = None,
    allowed_tools: Sequence[str] = (),
    disallowed_tools: Sequence[str] = (),
    max_turns: int | None = None,
    add_dirs: Sequence[str] = (),
    include_partial_messages: bool = True,
    system_prompt_mode: SystemPromptMode = "append",
    output_schema: dict[str, Any] | None = None,
    auth_mode: AuthMode | None = None,
    env: Mapping[str, str] | None = None,
    emit_diff: bool = True,
) -> ClaudeCodeHarness:
    """The Claude Code harness. ``executable`` is split on spaces (``"npx claude"`` works)."""
    if not executable.split():
        raise ValueError("executable must name the claude command")
    if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1):
        raise ValueError(f"max_turns must be a positive integer, got {max_turns!r}")
    if system_prompt_mode not in ("append", "replace"):
        raise ValueError(f"system_prompt_mode must be 'append' or 'replace', got {system_prompt_mode!r}")
    if output_schema is not None and not isinstance(output_schema, dict):
        raise ValueError("output_schema must be a JSON Schema object (a dict)")
    for what, values in (
        ("allowed_tools", allowed_tools),
        ("disallowed_tools", disallowed_tools),
        ("add_dirs", add_dirs),
    ):
        if isinstance(values, str):
            raise ValueError(f"{what} must be a list of strings, not one string")
    resolve_auth_mode(auth_mode, None)  # refuses an unknown mode now rather than at the first run
    return ClaudeCodeHarness(
        model=model,
        executable=executable,
        permission_mode=permission_mode,
        allowed_tools=tuple(allowed_tools),
        disallowed_tools=tuple(disallowed_tools),
        max_turns=max_turns,
        add_dirs=tuple(add_dirs),
        include_partial_messages=include_partial_messages,
        system_prompt_mode=system_prompt_mode,
        output_schema=output_schema,
        auth_mode=auth_mode,
        env=dict(env or {}),
        emit_diff=emit_diff,
    )


# -- translation -----------------------------------------------------------------------------------


@dataclass
class _Block:
    """A content block being streamed as partials, by its index in the message."""

    kind: Literal["text", "reasoning", "structured"]
    message_id: str
    parts: list[str] = field(default_factory=list)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _json_object(text: str) -> dict[str, Any] | None:
    """A non-empty JSON object from model text: whole, inside a code fence, or from first ``{`` to last ``}``."""
    candidates = [text.strip()]
    stripped = candidates[0]
    if stripped.startswith("```"):
        body = stripped.split("\n", 1)[1] if "\n" in stripped else ""
        candidates.append(body.rsplit("```", 1)[0].strip())
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            value = decode_json(candidate)  # model text: bounded like every line it came in
        except msgspec.DecodeError:
            continue
        if isinstance(value, dict) and value:
            return value
    return None


class ClaudeCodeTranslator:
    """stream-json lines -> AG-UI events (R19, R21; R7, R8). Never raises; ids come only from ``gen_id``."""

    def __init__(self, ctx: HarnessContext, *, bridge_server: str, structured: bool, executable: str) -> None:
        self._gen_id = ctx.gen_id
        self._frame = RunFrame(ctx.thread_id, ctx.run_id)
        self._ledger = ToolCallLedger()
        self._bridge_prefix = f"mcp__{bridge_server}__"
        self._structured = structured
        self._executable = executable
        self._ctx = ctx
        self._announced_sessions: set[str] = set()
        self._model: str | None = None
        self._streamed: set[str] = set()  # message ids whose text and thinking came as partials
        self._stream_message_id: str | None = None
        self._blocks: dict[int, _Block] = {}
        self._text_ids: set[str] = set()
        self._tool_calls: set[str] = set()
        self._hidden_calls: set[str] = set()
        self._captured: dict[str, Any] | None = None
        self._last_text = ""
        # Lines that were not a JSON object, or not of a shape we could read: skipped, never fatal.
        self.skipped_lines = 0

    def feed(self, line: str) -> list[Event]:
        out: list[Event] = []
        if self._frame.ended or not line.strip():
            return out
        try:
            data = decode_json(line, max_bytes=MAX_AGENT_LINE_BYTES)
        except Exception:  # not JSON (a log line, a cut-off write): counted, never fatal
            self.skipped_lines += 1
            return out
        if not isinstance(data, dict):
            self.skipped_lines += 1
            return out
        try:
            self._dispatch(data, out)
        except Exception:  # a line of an unforeseen shape must not end the run; what it produced stays
            self.skipped_lines += 1
        return out

    def finish(self, exit_code: int, stderr_tail: str) -> list[Event]:
        out: list[Event] = []
        if self._frame.ended:
            return out
        try:
            self._close_blocks(out)
            out += self._ledger.interrupt_all(self._gen_id)
        except Exception:  # closing is best effort; the terminal event below must still go out
            pass
        message, code = self._exit_error(exit_code, stderr_tail)
        out += self._frame.error(message, code)
        return out

    # -- dispatch ------------------------------------------------------------------------------

    def _dispatch(self, data: dict[str, Any], out: list[Event]) -> None:
        kind = data.get("type")
        if kind not in ("system", "assistant", "user", "stream_event", "result"):
            return
        if data.get("parent_tool_use_id"):
            return  # a sub-agent's own traffic; its outcome reaches us as the Task tool's result
        out += self._frame.start()
        if kind == "system":
            if data.get("subtype") == "init":
                self._init(data, out)
        elif kind == "assistant":
            self._assistant(_dict(data.get("message")), out)
        elif kind == "user":
            self._tool_results(_dict(data.get("message")), out)
        elif kind == "stream_event":
            self._stream_event(_dict(data.get("event")), out)
        else:
            self._result(data, out)

    def _init(self, data: dict[str, Any], out: list[Event]) -> None:
        self._model = _str(data.get("model")) or self._model
        session_id = _str(data.get("session_id"))
        if session_id is None or session_id in self._announced_sessions:
            return
        self._announced_sessions.add(session_id)
        tools = [t for t in _list(data.get("tools")) if isinstance(t, str)]
        value = {"sessionId": session_id, "model": self._model, "tools": tools}
        out.append(CustomEvent(name=SESSION_ID_EVENT, value=value, timestamp=now_ms()))

    # -- whole messages ---------------------------------------------------------------------------

    def _assistant(self, message: dict[str, Any], out: list[Event]) -> None:
        message_id = _str(message.get("id"))
        streamed = message_id is not None and message_id in self._streamed
        for block in _list(message.get("content")):
            block = _dict(block)
            kind = block.get("type")
            if kind == "text" and not streamed:
                text = _str(block.get("text"))
                if text is not None:
                    text_id = self._text_id(message_id)
                    out += self._text_start(text_id)
                    out.append(TextMessageContentEvent(message_id=text_id, delta=text, timestamp=now_ms()))
                    out.append(TextMessageEndEvent(message_id=text_id, timestamp=now_ms()))
                    self._last_text = text
            elif kind == "thinking" and not streamed:
                thinking = _str(block.get("thinking"))
                if thinking is not None:
                    reasoning_id = self._gen_id()
                    out += self._reasoning_start(reasoning_id)
                    out.append(
                        ReasoningMessageContentEvent(message_id=reasoning_id, delta=thinking, timestamp=now_ms())
                    )
                    out += self._reasoning_end(reasoning_id)
            elif kind == "tool_use":
                self._tool_use(block, message_id, out)

    def _tool_use(self, block: dict[str, Any], message_id: str | None, out: list[Event]) -> None:
        call_id, name = _str(block.get("id")), _str(block.get("name"))
        if call_id is None or name is None or call_id in self._tool_calls:
            return
        tool_input = block.get("input")
        if name == STRUCTURED_TOOL:
            self._hidden_calls.add(call_id)
            self._capture(tool_input)
            return
        self._tool_calls.add(call_id)
        # The bridge's own prefix is ours, so it goes; another MCP server's name is what the user knows.
        shown = name.removeprefix(self._bridge_prefix) or name
        out.append(
            ToolCallStartEvent(
                tool_call_id=call_id,
                tool_call_name=shown,
                tool_name=shown,
                parent_message_id=message_id,
                timestamp=now_ms(),
            )
        )
        out.append(ToolCallArgsEvent(tool_call_id=call_id, delta=_compact(tool_input), timestamp=now_ms()))
        out.append(ToolCallEndEvent(tool_call_id=call_id, input=tool_input, timestamp=now_ms()))
        self._ledger.started(call_id)

    def _tool_results(self, message: dict[str, Any], out: list[Event]) -> None:
        for block in _list(message.get("content")):
            block = _dict(block)
            call_id = _str(block.get("tool_use_id"))
            if block.get("type") != "tool_result" or call_id is None or call_id in self._hidden_calls:
                continue
            if not self._ledger.resolved(call_id):
                continue  # never started here (or answered already): a result with no call is noise
            content = block.get("content")
            if isinstance(content, list):
                text = "\n".join(
                    part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
                )
            else:
                text = content if isinstance(content, str) else ""
            out.append(
                ToolCallResultEvent(
                    message_id=self._gen_id(),
                    tool_call_id=call_id,
                    content=text,
                    role="tool",
                    state="output-error" if block.get("is_error") is True else None,
                    timestamp=now_ms(),
                )
            )

    # -- partials -------------------------------------------------------------------------------

    def _stream_event(self, event: dict[str, Any], out: list[Event]) -> None:
        kind = event.get("type")
        index = event.get("index")
        if kind == "message_start":
            message_id = _str(_dict(event.get("message")).get("id"))
            self._stream_message_id = message_id
            if message_id is not None:
                self._streamed.add(message_id)
        elif kind == "content_block_start" and isinstance(index, int):
            self._block_start(index, _dict(event.get("content_block")), out)
        elif kind == "content_block_delta" and isinstance(index, int):
            self._block_delta(index, _dict(event.get("delta")), out)
        elif kind == "content_block_stop" and isinstance(index, int):
            block = self._blocks.pop(index, None)
            if block is not None:
                self._close_block(block, out)
        elif kind == "message_stop":
            self._close_blocks(out)

    def _block_start(self, index: int, content: dict[str, Any], out: list[Event]) -> None:
        kind = content.get("type")
        if index in self._blocks:  # a repeated start: close the first so nothing stays open
            self._close_block(self._blocks.pop(index), out)
        if kind == "text":
            block = _Block("text", self._text_id(self._stream_message_id))
            out += self._text_start(block.message_id)
            self._blocks[index] = block
            self._block_delta(index, {"type": "text_delta", "text": content.get("text")}, out)
        elif kind == "thinking":
            block = _Block("reasoning", self._gen_id())
            out += self._reasoning_start(block.message_id)
            self._blocks[index] = block
            self._block_delta(index, {"type": "thinking_delta", "thinking": content.get("thinking")}, out)
        elif kind == "tool_use" and content.get("name") == STRUCTURED_TOOL:
            call_id = _str(content.get("id"))
            if call_id is not None:
                self._hidden_calls.add(call_id)
            self._capture(content.get("input"))
            self._blocks[index] = _Block("structured", "")

    def _block_delta(self, index: int, delta: dict[str, Any], out: list[Event]) -> None:
        block = self._blocks.get(index)
        if block is None:
            return
        kind = delta.get("type")
        if block.kind == "text" and kind == "text_delta":
            text = _str(delta.get("text"))
            if text is not None:
                block.parts.append(text)
                out.append(TextMessageContentEvent(message_id=block.message_id, delta=text, timestamp=now_ms()))
        elif block.kind == "reasoning" and kind == "thinking_delta":
            thinking = _str(delta.get("thinking"))
            if thinking is not None:
                out.append(
                    ReasoningMessageContentEvent(message_id=block.message_id, delta=thinking, timestamp=now_ms())
                )
        elif block.kind == "structured" and kind == "input_json_delta":
            partial = _str(delta.get("partial_json"))
            if partial is not None:
                block.parts.append(partial)

    def _close_block(self, block: _Block, out: list[Event]) -> None:
        if block.kind == "text":
            out.append(TextMessageEndEvent(message_id=block.message_id, timestamp=now_ms()))
            if block.parts:
                self._last_text = "".join(block.parts)
        elif block.kind == "reasoning":
            out += self._reasoning_end(block.message_id)
        else:
            try:
                self._capture(decode_json("".join(block.parts)))
            except msgspec.DecodeError:
                pass

    def _close_blocks(self, out: list[Event]) -> None:
        for index in sorted(self._blocks):
            self._close_block(self._blocks[index], out)
        self._blocks.clear()

    # -- the end --------------------------------------------------------------------------------

    def _result(self, data: dict[str, Any], out: list[Event]) -> None:
        self._close_blocks(out)
        out += self._ledger.interrupt_all(self._gen_id)
        subtype = _str(data.get("subtype")) or "unknown"
        extra: dict[str, Any] = {}
        usage = self._usage(_dict(data.get("usage")))
        if usage is not None:
            extra["usage"] = [usage]
        cost = data.get("total_cost_usd")
        if isinstance(cost, int | float) and not isinstance(cost, bool):
            extra["result"] = {"totalCostUsd": cost}
        if subtype == "error_max_turns":
            self._structured_output(data, out)
            out += self._frame.finish("length", **extra)
        elif data.get("is_error") is True or subtype != "success":
            errors = "; ".join(str(e) for e in _list(data.get("errors")) if str(e).strip())
            message = _str(data.get("result")) or errors or f"Claude Code run failed: {subtype}"
            status = _count(data.get("api_error_status"))
            code = _str(data.get("terminal_reason")) or (str(status) if status is not None else subtype)
            out += self._frame.error(message, code)
        else:
            self._structured_output(data, out)
            out += self._frame.finish("stop", **extra)

    def _usage(self, raw: dict[str, Any]) -> TokenUsage | None:
        input_tokens, output_tokens = _count(raw.get("input_tokens")), _count(raw.get("output_tokens"))
        if input_tokens is None and output_tokens is None:
            return None
        return TokenUsage(
            model=self._model,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            total_tokens=(input_tokens or 0) + (output_tokens or 0),
            cached_input_tokens=_count(raw.get("cache_read_input_tokens")),
            cache_write_input_tokens=_count(raw.get("cache_creation_input_tokens")),
            reasoning_tokens=_count(_dict(raw.get("output_tokens_details")).get("thinking_tokens")),
        )

    def _structured_output(self, data: dict[str, Any], out: list[Event]) -> None:
        value: dict[str, Any] | None = None
        raw = ""
        field_value = data.get("structured_output")
        if isinstance(field_value, dict) and field_value:
            value = field_value
        elif self._captured is not None:
            value = self._captured
        elif self._structured:
            # Only when a schema was asked for: an ordinary reply that happens to be JSON is just text.
            for text in (self._last_text, _str(data.get("result")) or ""):
                value = _json_object(text) if text else None
                if value is not None:
                    raw = text
                    break
        if value is None:
            return
        message_id = self._gen_id()
        out.append(CustomEvent(name=STRUCTURED_START_EVENT, value={"messageId": message_id}, timestamp=now_ms()))
        complete = {"object": value, "raw": raw or _compact(value), "messageId": message_id}
        out.append(CustomEvent(name=STRUCTURED_COMPLETE_EVENT, value=complete, timestamp=now_ms()))

    def _exit_error(self, exit_code: int, stderr_tail: str) -> tuple[str, str]:
        tail = stderr_tail.strip()[-STDERR_TAIL_CHARS:]
        if exit_code == 127 and ("not found" in tail.lower() or "no such file" in tail.lower()):
            return (
                f"the Claude Code executable {self._executable!r} was not found in the sandbox ({tail}): "
                + executable_not_found_hint(self._executable, self._ctx, INSTALL_COMMAND),
                "executable_not_found",
            )
        if exit_code == 0:
            message, code = "claude ended without a result", "no_result"
        else:
            message, code = f"claude exited with code {exit_code}", f"exit_code_{exit_code}"
        if tail:
            message += f": {tail}"
        if self.skipped_lines:
            message += f" ({self.skipped_lines} unreadable output line(s) skipped)"
        return message, code

    # -- small pieces ---------------------------------------------------------------------------

    def _capture(self, value: Any) -> None:
        if isinstance(value, dict) and value:  # an empty capture never replaces a useful one
            self._captured = value

    def _text_id(self, message_id: str | None) -> str:
        # Claude sends one line per block under one message id; a second text block needs its own id.
        if message_id is not None and message_id not in self._text_ids:
            self._text_ids.add(message_id)
            return message_id
        return self._gen_id()

    @staticmethod
    def _text_start(message_id: str) -> list[Event]:
        return [TextMessageStartEvent(message_id=message_id, role="assistant", timestamp=now_ms())]

    @staticmethod
    def _reasoning_start(message_id: str) -> list[Event]:
        return [
            ReasoningStartEvent(message_id=message_id, timestamp=now_ms()),
            ReasoningMessageStartEvent(message_id=message_id, timestamp=now_ms()),
        ]

    @staticmethod
    def _reasoning_end(message_id: str) -> list[Event]:
        return [
            ReasoningMessageEndEvent(message_id=message_id, timestamp=now_ms()),
            ReasoningEndEvent(message_id=message_id, timestamp=now_ms()),
        ]


# -- the policy's permission prompt (R18) --------------------------------------------------------

APPROVAL_TOOL = "approval_prompt"
_FILE_WRITE_TOOLS = frozenset({"Write", "Edit", "MultiEdit", "NotebookEdit"})
_NETWORK_TOOLS = frozenset({"WebFetch", "WebSearch"})
_APPROVAL_SCHEMA = {
    "type": "object",
    "properties": {
        "tool_name": {"type": "string"},
        "input": {"type": "object"},
        "tool_use_id": {"type": "string"},
    },
    "required": ["tool_name", "input"],
}


def _needs_prompts(policy: SandboxPolicy) -> bool:
    rules = policy.commands
    return bool(rules.allow or rules.ask or rules.deny) or policy.default in ("ask", "deny")


def _action(tool_name: str, tool_input: Mapping[str, Any]) -> tuple[ApprovalKind, str]:
    if tool_name == "Bash" and isinstance(tool_input.get("command"), str):
        return "command", str(tool_input["command"])
    if tool_name in _FILE_WRITE_TOOLS:
        return "fileWrite", tool_name
    if tool_name in _NETWORK_TOOLS:
        return "network", tool_name
    return "tool", tool_name


def approval_prompt_tool(
    policy: SandboxPolicy,
    *,
    approvals: Mapping[str, bool] | None = None,
    emit: Callable[[str, Any], None] | None = None,
) -> Tool:
    """A bridge tool answering Claude's ``--permission-prompt-tool`` calls from ``policy``.

    allow -> ``{"behavior":"allow","updatedInput":...}``; deny -> ``{"behavior":"deny","message":...}``;
    an undecided ``ask`` is denied and announced as a CUSTOM ``approval-requested`` event, so the
    app can ask a person and pass the decision in ``approvals`` on the next run.
    """

    def decide(args: Mapping[str, Any], ctx: Any) -> str:
        tool_name = str(args.get("tool_name", ""))
        raw_input = args.get("input")
        tool_input: dict[str, Any] = raw_input if isinstance(raw_input, dict) else {}
        kind, target = _action(tool_name, tool_input)
        verdict = resolve_approval(policy, provider=NAME, kind=kind, target=target, approvals=approvals)
        if verdict.decision == "allow":
            return json.dumps({"behavior": "allow", "updatedInput": tool_input})
        if verdict.needs_approval:
            title = f"Approve {tool_name}" + (f": {target}" if kind == "command" else "")
            value = approval_requested_value(verdict.approval_id, title, {"provider": NAME, "toolName": tool_name})
            (emit or getattr(ctx, "emit_custom_event", None) or (lambda *_: None))(APPROVAL_REQUESTED_EVENT, value)
            message = f"needs approval ({verdict.approval_id}); denied until a person allows it"
        else:
            message = f"denied by the sandbox policy ({kind} {target!r})"
        return json.dumps({"behavior": "deny", "message": message})

    return define_tool(
        APPROVAL_TOOL,
        "Decides whether Claude Code may run a tool, by the sandbox policy.",
        _APPROVAL_SCHEMA,
        decide,
        read_only=True,
        threaded=False,
    )
