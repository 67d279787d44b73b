"""OpenCode as a harness: ``opencode run --format json`` in the sandbox, its JSON lines as AG-UI events.

Measured against OpenCode 1.18.33 (recordings in ``tests/fixtures/opencode``). Why ``run`` and not
``serve``: ``run`` is one process with its events on stdout, so it fits the sandbox contract as it is
(spawn, stdin, stdout, kill; a journal for durable runs) with no port to publish out of the sandbox,
and one turn through a fresh ``serve`` is no clear win once its start is counted (unloaded: ``run``
2.4 s against 1.2 s to serve's ready line plus a 0.15-1.5 s turn; issue 16, on a 2-core machine at load
14: ``run`` 67-95 s, serve 25-26 s to ready and 43-59 s to the end of its first turn, 2 samples each).
Only a server kept warm across runs is quick (a second turn: 3-11 s there), and it would hold the
session and its event stream outside the journal, where no successor can take a run over. So ``run``,
for now. What the module leans on:

- its config comes whole from ``OPENCODE_CONFIG_CONTENT`` (merged over the project's
  ``opencode.json``): the model provider (``provider``), the bridge as a ``remote`` MCP server with
  its bearer header (the token stays in the env, never in argv), and the policy as ``permission`` rules;
- tool parts arrive once, already ``completed`` or ``error`` (no started event); text and reasoning
  parts arrive whole; ``step_finish`` carries each step's tokens and the finish reason;
- a bridged tool is named ``<server>_<tool>``; the prefix is ours and is stripped;
- resume is ``run -s <sessionID>``: the same ``sessionID`` comes back on every line.

Permission hook: OpenCode's ``permission`` rules (last matching pattern wins). The policy's command
rules become ``bash`` patterns: ``allow`` runs, ``deny`` fails with "a rule which prevents you", and
``ask`` is auto-rejected by headless ``run``; that rejection is reported as an ``approval-requested``
CUSTOM event (id ``opencode:command:<command>``) so an app can ask a person. fileWrite maps to
``edit`` (OpenCode's write, edit and patch tools), network to ``webfetch``.

Pitfalls measured: the first start in a fresh HOME takes seconds (its database and plugin cache);
with the API unreachable it retries for about a minute before an ``error`` line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import shell
from .._json import MAX_AGENT_LINE_BYTES, decode_json
from ..auth import harness_auth_env
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
    Decision,
    SandboxPolicy,
    approval_id,
    approval_requested_value,
)
from .base import HarnessContext, HarnessPlan, RunFrame, ToolCallLedger, executable_argv, executable_not_found_hint
from .base import as_count as _count
from .base import as_dict as _dict
from .base import as_str as _str
from .base import compact_json as _compact

NAME = "opencode"
SESSION_ID_EVENT = "opencode.session-id"
INSTALL_COMMAND = "npm install opencode-ai"
STDERR_TAIL_CHARS = 1000
# What OpenCode says when headless ``run`` rejects a permission it would have asked about.
ASK_REJECTED = "The user rejected permission"
DENIED_BY_RULE = "specified a rule which prevents"


def permission_rules(policy: SandboxPolicy | None) -> dict[str, Any]:
    """OpenCode ``permission`` config for ``policy``. OpenCode applies the last matching pattern, so the
    default goes first and deny last (deny > ask > allow, as ``evaluate_command`` decides)."""
    if policy is None:
        return {}
    rules: dict[str, Any] = {}
    commands = policy.commands
    if commands.allow or commands.ask or commands.deny or policy.default is not None:
        bash: dict[str, Decision] = {"*": policy.default or "allow"}
        for patterns, decision in ((commands.allow, "allow"), (commands.ask, "ask"), (commands.deny, "deny")):
            for pattern in patterns:
                bash.pop(pattern, None)  # re-inserted, so its place in the order is its decision's
                bash[pattern] = decision  # type: ignore[assignment]
        rules["bash"] = bash
    file_write = policy.capabilities.file_write or policy.default
    if file_write is not None:
        rules["edit"] = file_write
    network = policy.capabilities.network or policy.default
    if network is not None:
        rules["webfetch"] = network
    return rules


# How long OpenCode waits for the bridge's tool list (its default is 5 s). A server that misses it is dropped
# and the run goes on without its tools. CI once showed just that on a loaded 2-core host: the run finished,
# and the model's call to the host tool never reached the host.
MCP_FETCH_TIMEOUT_MS = 60_000


@dataclass(frozen=True)
class OpenCodeHarness:
    """Runs ``opencode run --format json``. Build it with :func:`opencode`."""

    model: str | None = None
    executable: str = "opencode"
    config: Mapping[str, Any] = field(default_factory=dict)
    agent: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    emit_diff: bool = True

    @property
    def name(self) -> str:
        return NAME

    def config_content(self, ctx: HarnessContext) -> dict[str, Any]:
        """The JSON for ``OPENCODE_CONFIG_CONTENT``: ``config`` plus the bridge and the policy's rules."""
        content: dict[str, Any] = json.loads(json.dumps(dict(self.config)))  # a deep copy, JSON-shaped
        if ctx.bridge is not None:
            servers = content.setdefault("mcp", {})
            servers[ctx.bridge.name] = {
                "type": "remote",
                "url": ctx.bridge.url,
                "enabled": True,
                "headers": {"Authorization": f"Bearer {ctx.bridge.token}"},
                "timeout": MCP_FETCH_TIMEOUT_MS,
            }
        rules = permission_rules(ctx.policy)
        if rules:
            permission = content.setdefault("permission", {})
            permission.update(rules)
        return content

    def plan(self, ctx: HarnessContext) -> HarnessPlan:
        q = shell.quote
        parts = [
            "exec",
            *(q(p) for p in executable_argv(self.executable, ctx)),
            "run",
            "--format",
            "json",
            "--thinking",
        ]
        if self.model:
            parts += ["--model", q(self.model)]
        if self.agent:
            parts += ["--agent", q(self.agent)]
        if ctx.session_id:
            parts += ["--session", q(ctx.session_id)]
        prompt = f"{ctx.system_prompt}\n\n{ctx.prompt}" if ctx.system_prompt else ctx.prompt
        files: dict[str, str] = {}
        stdin: str | None = prompt
        if not ctx.capabilities.writable_stdin:
            prompt_file = f"/tmp/boxwright-opencode-prompt-{ctx.file_suffix or 'run'}"
            files[prompt_file] = prompt
            parts += ["<", q(prompt_file)]
            stdin = None
        # OpenCode has no auth mode: its provider reads OPENAI_API_KEY whatever the mode (``boxwright.auth``).
        env = harness_auth_env(NAME, "api-key", ctx.host_env)
        secrets = list(env.values())
        env["OPENCODE_DISABLE_AUTOUPDATE"] = "1"
        content = self.config_content(ctx)
        if content:
            env["OPENCODE_CONFIG_CONTENT"] = json.dumps(content, separators=(",", ":"))
        if ctx.bridge is not None:
            secrets.append(ctx.bridge.token)
        env.update(self.env)
        return HarnessPlan(
            command=" ".join(parts), stdin=stdin, env=env, files=files, secrets=list(dict.fromkeys(secrets))
        )

    def translator(self, ctx: HarnessContext) -> OpenCodeTranslator:
        return OpenCodeTranslator(
            ctx, bridge_server=ctx.bridge.name if ctx.bridge is not None else "boxwright", executable=self.executable
        )


def opencode(
    model: str | None = None,
    *,
    executable: str = "opencode",
    config: Mapping[str, Any] | None = None,
    agent: str | None = None,
    env: Mapping[str, str] | None = None,
    emit_diff: bool = True,
) -> OpenCodeHarness:
    """The OpenCode harness. ``model`` is ``provider/model`` (R32); ``config`` is OpenCode config JSON
    (e.g. a ``provider`` entry for an OpenAI-compatible endpoint), merged with the bridge and policy."""
    if not executable.split():
        raise ValueError("executable must name the opencode command")
    if model is not None and (model.count("/") < 1 or not all(model.split("/", 1))):
        raise ValueError(f"an OpenCode model is provider/model (e.g. openai/gpt-5), got {model!r}")
    if config is not None and not isinstance(config, Mapping):
        raise ValueError("config must be an OpenCode config object (a dict)")
    try:
        json.dumps(dict(config or {}))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"config must be JSON-serialisable: {exc}") from exc
    return OpenCodeHarness(
        model=model,
        executable=executable,
        config=dict(config or {}),
        agent=agent,
        env=dict(env or {}),
        emit_diff=emit_diff,
    )


# -- translation -----------------------------------------------------------------------------------


class OpenCodeTranslator:
    """``run --format json`` lines -> AG-UI events (R35; R7, R8). Never raises; ids come only from ``gen_id``."""

    def __init__(self, ctx: HarnessContext, *, bridge_server: str, executable: str) -> None:
        self._ctx = ctx
        self._gen_id = ctx.gen_id
        self._frame = RunFrame(ctx.thread_id, ctx.run_id)
        self._ledger = ToolCallLedger()
        self._prefix = f"{bridge_server}_"
        self._executable = executable
        self._sessions: set[str] = set()
        self._parts: dict[str, str] = {}  # part id -> the id its events carry
        self._tools: set[str] = set()
        self._input = self._output = self._reasoning = self._cache_read = self._cache_write = 0
        self._counted = False
        self._finish_reason: str | None = None
        self._error: tuple[str, str] | None = None
        self.approvals: list[dict[str, Any]] = []
        self.skipped_lines = 0

    def feed(self, line: str) -> list[Event]:
        out: list[Event] = []
        if self._frame.ended or not line.strip():
            return out
        try:
            data = decode_json(line, max_bytes=MAX_AGENT_LINE_BYTES)
        except Exception:
            self.skipped_lines += 1
            return out
        if not isinstance(data, dict):
            self.skipped_lines += 1
            return out
        try:
            self._dispatch(data, out)
        except Exception:
            self.skipped_lines += 1
        return out

    def finish(self, exit_code: int, stderr_tail: str) -> list[Event]:
        out: list[Event] = []
        if self._frame.ended:
            return out
        out += self._ledger.interrupt_all(self._gen_id)
        tail = stderr_tail.strip()[-STDERR_TAIL_CHARS:]
        if exit_code == 127 and ("not found" in tail.lower() or "no such file" in tail.lower()):
            message = (
                f"the OpenCode executable {self._executable!r} was not found in the sandbox ({tail}): "
                + executable_not_found_hint(self._executable, self._ctx, INSTALL_COMMAND)
            )
            return out + self._frame.error(message, "executable_not_found")
        if self._error is not None:
            return out + self._frame.error(*self._error)
        if exit_code != 0:
            message = f"opencode exited with code {exit_code}"
            return out + self._frame.error(f"{message}: {tail}" if tail else message, f"exit_code_{exit_code}")
        extra: dict[str, Any] = {}
        if self._counted:
            extra["usage"] = [
                TokenUsage(
                    input_tokens=self._input,
                    output_tokens=self._output,
                    total_tokens=self._input + self._output,
                    reasoning_tokens=self._reasoning,
                    cached_input_tokens=self._cache_read,
                    cache_write_input_tokens=self._cache_write,
                )
            ]
        return out + self._frame.finish("length" if self._finish_reason == "length" else "stop", **extra)

    def _dispatch(self, data: dict[str, Any], out: list[Event]) -> None:
        kind = data.get("type")
        session_id = _str(data.get("sessionID"))
        if kind not in ("step_start", "step_finish", "text", "reasoning", "tool_use", "error"):
            return
        out += self._frame.start()
        if session_id is not None and session_id not in self._sessions:
            self._sessions.add(session_id)
            out.append(CustomEvent(name=SESSION_ID_EVENT, value={"sessionId": session_id}, timestamp=now_ms()))
        part = _dict(data.get("part"))
        if kind == "text":
            self._text(part, out)
        elif kind == "reasoning":
            self._reasoning_part(part, out)
        elif kind == "tool_use":
            self._tool(part, out)
        elif kind == "step_finish":
            self._step_finish(part)
        elif kind == "error":
            error = _dict(data.get("error"))
            message = (
                _str(_dict(error.get("data")).get("message")) or _str(error.get("message")) or "OpenCode run failed"
            )
            self._error = (message, _str(error.get("name")) or "opencode_error")

    def _part_id(self, part: dict[str, Any]) -> tuple[str, bool]:
        """The event id for a part (its own id, else a generated one) and whether it is new."""
        key = _str(part.get("id")) or self._gen_id()
        if key in self._parts:
            return self._parts[key], False
        self._parts[key] = key
        return key, True

    def _text(self, part: dict[str, Any], out: list[Event]) -> None:
        text = _str(part.get("text"))
        message_id, new = self._part_id(part)
        if text is None or not new:
            return
        out.append(TextMessageStartEvent(message_id=message_id, role="assistant", timestamp=now_ms()))
        out.append(TextMessageContentEvent(message_id=message_id, delta=text, timestamp=now_ms()))
        out.append(TextMessageEndEvent(message_id=message_id, timestamp=now_ms()))

    def _reasoning_part(self, part: dict[str, Any], out: list[Event]) -> None:
        text = _str(part.get("text"))
        message_id, new = self._part_id(part)
        if text is None or not new:
            return
        out.append(ReasoningStartEvent(message_id=message_id, timestamp=now_ms()))
        out.append(ReasoningMessageStartEvent(message_id=message_id, timestamp=now_ms()))
        out.append(ReasoningMessageContentEvent(message_id=message_id, delta=text, timestamp=now_ms()))
        out.append(ReasoningMessageEndEvent(message_id=message_id, timestamp=now_ms()))
        out.append(ReasoningEndEvent(message_id=message_id, timestamp=now_ms()))

    def _tool(self, part: dict[str, Any], out: list[Event]) -> None:
        call_id = _str(part.get("callID")) or _str(part.get("id"))
        tool = _str(part.get("tool"))
        state = _dict(part.get("state"))
        if call_id is None or tool is None:
            return
        shown = tool.removeprefix(self._prefix) or tool
        raw_input = state.get("input")
        tool_input: dict[str, Any] = raw_input if isinstance(raw_input, dict) else {}
        if call_id not in self._tools:
            self._tools.add(call_id)
            out.append(
                ToolCallStartEvent(tool_call_id=call_id, tool_call_name=shown, tool_name=shown, timestamp=now_ms())
            )
            out.append(ToolCallArgsEvent(tool_call_id=call_id, delta=_compact(tool_input), timestamp=now_ms()))
            out.append(ToolCallEndEvent(tool_call_id=call_id, input=tool_input, timestamp=now_ms()))
            self._ledger.started(call_id)
        status = state.get("status")
        if status not in ("completed", "error") or not self._ledger.resolved(call_id):
            return
        if status == "completed":
            content = state.get("output")
            text = content if isinstance(content, str) else _compact(content)
        else:
            text = str(state.get("error") or "tool failed")
            if ASK_REJECTED in text:
                self._approval(tool, tool_input, out)
        out.append(
            ToolCallResultEvent(
                message_id=self._gen_id(),
                tool_call_id=call_id,
                content=text,
                role="tool",
                state="output-error" if status == "error" else None,
                timestamp=now_ms(),
            )
        )

    def _approval(self, tool: str, tool_input: dict[str, Any], out: list[Event]) -> None:
        command = tool_input.get("command")
        if tool == "bash" and isinstance(command, str):
            key, title = approval_id(NAME, "command", command), f"Approve bash: {command}"
        elif tool in ("edit", "write", "patch"):
            key, title = approval_id(NAME, "fileWrite", tool), f"Approve {tool}"
        elif tool == "webfetch":
            key, title = approval_id(NAME, "network", tool), f"Approve {tool}"
        else:
            key, title = approval_id(NAME, "tool", tool), f"Approve {tool}"
        value = approval_requested_value(key, title, {"provider": NAME, "toolName": tool})
        self.approvals.append(value)
        out.append(CustomEvent(name=APPROVAL_REQUESTED_EVENT, value=value, timestamp=now_ms()))

    def _step_finish(self, part: dict[str, Any]) -> None:
        tokens = _dict(part.get("tokens"))
        if tokens:
            self._counted = True
            cache = _dict(tokens.get("cache"))
            self._input += _count(tokens.get("input")) or 0
            self._output += _count(tokens.get("output")) or 0
            self._reasoning += _count(tokens.get("reasoning")) or 0
            self._cache_read += _count(cache.get("read")) or 0
            self._cache_write += _count(cache.get("write")) or 0
        reason = _str(part.get("reason"))
        if reason is not None:
            self._finish_reason = reason
