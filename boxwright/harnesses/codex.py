"""Codex as a harness: ``codex exec --json`` in the sandbox, its JSONL as AG-UI events.

Measured against Codex 0.169.0 (recordings in ``tests/fixtures/codex``). Facts this module leans on:

- only the OpenAI Responses API works (``wire_api="chat"`` is refused) and ``OPENAI_BASE_URL`` is
  ignored: another endpoint needs a ``model_providers`` entry, which ``base_url`` writes as ``-c``
  overrides (the key comes from ``CODEX_API_KEY``, the provider's ``env_key``);
- the bridge is an ``mcp_servers`` entry; its bearer token travels in the env
  (``bearer_token_env_var``), never in argv, and ``default_tools_approval_mode="approve"`` is
  required, or every bridged tool that is not read-only fails "requires approval, but approval
  policy is never" (decision 10);
- items come as ``item.started``/``item.completed``; with a Responses model the agent's text only
  ever arrives completed; a command the inner sandbox blocks produces no item at all;
- resume is ``exec … resume <thread_id> -``: the same ``thread_id`` comes back in ``thread.started``.

Two sandboxes. Codex has its own (``--sandbox``, bwrap on Linux). On ``local-process`` it is the only
layer, so it stays on (``workspace-write``). Inside boxwright's bubblewrap or a container, ours
holds: nested bwrap cannot create its namespaces there (measured in boxwright's bubblewrap: every
command fails "bwrap: No permissions to create new namespace"), so Codex runs ``danger-full-access``
and the outer sandbox is the boundary. A ``sandbox_mode`` given explicitly wins.

Permission hook: none. ``codex exec`` never asks anyone (approvals only exist in its interactive
and app-server modes), so a policy maps to the sandbox mode and ``approval_policy`` (``codex_permissions``;
its ``untrusted`` for a deny default becomes ``on-request``, as 0.169.0 refuses ``untrusted``), and command
globs (``allow echo *``, ``deny rm *``, ``ask``) are not enforced per command. Measured under
``on-request``: what Codex itself would ask about is rejected headless (``rm -f`` style commands: "not
permitted"), and such a rejected command shows no item in ``--json`` at all; only the model is told.
The README's harness table says so.

Pitfalls measured: with ``workspace-write`` and ``CODEX_HOME`` under ``$TMPDIR`` the inner sandbox
fails (``bwrap: execvp codex-linux-sandbox``): keep ``CODEX_HOME`` outside ``$TMPDIR`` (or set
``TMPDIR`` in ``env``). An unreachable endpoint makes Codex retry forever: a run needs a deadline.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

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
from ..policy import codex_permissions
from .base import HarnessContext, HarnessPlan, RunFrame, ToolCallLedger, executable_argv, executable_not_found_hint
from .base import as_count as _count
from .base import as_dict as _dict
from .base import as_str as _str
from .base import compact_json as _compact

NAME = "codex"
LOCAL_PROCESS = "local-process"
SESSION_ID_EVENT = "codex.session-id"
INSTALL_COMMAND = "npm install @openai/codex"
PROVIDER_ID = "boxwright"
BRIDGE_TOKEN_ENV = "BOXWRIGHT_BRIDGE_TOKEN"
STDERR_TAIL_CHARS = 1000
TOOL_ITEMS = ("command_execution", "mcp_tool_call", "file_change", "web_search", "todo_list")

SandboxMode = Literal["read-only", "workspace-write", "danger-full-access"]
_SANDBOX_MODES = ("read-only", "workspace-write", "danger-full-access")


def _toml(value: Any) -> str:
    """A TOML value for ``-c key=value``: JSON's string/number/bool syntax is TOML's too."""
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


@dataclass(frozen=True)
class CodexHarness:
    """Runs ``codex exec --json``. Build it with :func:`codex`."""

    model: str | None = None
    executable: str = "codex"
    sandbox_mode: SandboxMode | None = None
    approval_policy: str | None = None
    base_url: str | None = None
    max_retries: int | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    add_dirs: tuple[str, ...] = ()
    auth_mode: AuthMode | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    emit_diff: bool = True

    @property
    def name(self) -> str:
        return NAME

    def resolve_sandbox_mode(self, ctx: HarnessContext) -> str:
        """Explicit > policy (``read-only`` on fileWrite deny) > which layer holds (see the module doc)."""
        if self.sandbox_mode:
            return self.sandbox_mode
        policy_mode = codex_permissions(ctx.policy).sandbox
        if policy_mode:
            return policy_mode
        return "workspace-write" if ctx.provider == LOCAL_PROCESS else "danger-full-access"

    def overrides(self, ctx: HarnessContext) -> list[tuple[str, str]]:
        """The ``-c key=value`` pairs, in order: approval, network, provider, bridge, raw config."""
        permissions = codex_permissions(ctx.policy)
        approval = self.approval_policy or permissions.approval or "never"
        if approval == "untrusted" and not self.approval_policy:
            # 0.169.0 exits at start on it ("no longer supported"); on-request is the strictest it takes.
            approval = "on-request"
        pairs: list[tuple[str, str]] = [("approval_policy", _toml(approval))]
        if permissions.network_access is not None:
            pairs.append(("sandbox_workspace_write.network_access", _toml(permissions.network_access)))
        base_url = self.base_url or ctx.host_env.get("OPENAI_BASE_URL")
        if base_url:
            provider: dict[str, Any] = {
                "name": PROVIDER_ID,
                "base_url": base_url,
                "env_key": "CODEX_API_KEY",
                "wire_api": "responses",
            }
            if self.max_retries is not None:
                provider["request_max_retries"] = self.max_retries
                provider["stream_max_retries"] = self.max_retries
            pairs += [("model_provider", _toml(PROVIDER_ID)), (f"model_providers.{PROVIDER_ID}", _toml(provider))]
        if ctx.bridge is not None:
            server = f"mcp_servers.{ctx.bridge.name}"
            pairs += [
                (f"{server}.url", _toml(ctx.bridge.url)),
                (f"{server}.bearer_token_env_var", _toml(BRIDGE_TOKEN_ENV)),
                (f"{server}.default_tools_approval_mode", _toml("approve")),
            ]
        pairs += [(key, _toml(value)) for key, value in self.config.items()]
        return pairs

    def plan(self, ctx: HarnessContext) -> HarnessPlan:
        q = shell.quote
        parts = ["exec", *(q(p) for p in executable_argv(self.executable, ctx)), "exec", "--json"]
        if self.model:
            parts += ["--model", q(self.model)]
        parts += ["--sandbox", q(self.resolve_sandbox_mode(ctx)), "--skip-git-repo-check"]
        for directory in self.add_dirs:
            parts += ["--add-dir", q(directory)]
        for key, value in self.overrides(ctx):
            parts += ["-c", q(f"{key}={value}")]
        if ctx.session_id:
            parts += ["resume", q(ctx.session_id)]
        parts.append("-")  # the prompt comes on stdin: never in argv, where `ps` shows it
        prompt = f"{ctx.system_prompt}\n\n{ctx.prompt}" if ctx.system_prompt else ctx.prompt
        files: dict[str, str] = {}
        stdin: str | None = prompt
        if not ctx.capabilities.writable_stdin:
            prompt_file = f"/tmp/boxwright-codex-prompt-{ctx.file_suffix or 'run'}"
            files[prompt_file] = prompt
            parts += ["<", q(prompt_file)]
            stdin = None
        env = harness_auth_env(NAME, resolve_auth_mode(ctx.auth_mode, self.auth_mode), ctx.host_env)
        secrets = list(env.values())
        if ctx.bridge is not None:
            env[BRIDGE_TOKEN_ENV] = ctx.bridge.token
            secrets.append(ctx.bridge.token)
        env.update(self.env)
        command = " ".join(parts)
        made = [env[name] for name in ("CODEX_HOME", "TMPDIR") if env.get(name)]
        if made:
            # Codex refuses a CODEX_HOME that does not exist; a sandbox's private /tmp starts empty.
            command = f"mkdir -p -- {' '.join(q(path) for path in made)} && {command}"
        scrub = scrub_env_for(NAME, resolve_auth_mode(ctx.auth_mode, self.auth_mode))
        if scrub:
            command = f"unset {' '.join(scrub)}; {command}"
        return HarnessPlan(command=command, stdin=stdin, env=env, files=files, secrets=list(dict.fromkeys(secrets)))

    def translator(self, ctx: HarnessContext) -> CodexTranslator:
        return CodexTranslator(
            ctx, bridge_server=ctx.bridge.name if ctx.bridge is not None else "boxwright", executable=self.executable
        )


def codex(
    model: str | None = None,
    *,
    executable: str = "codex",
    sandbox_mode: SandboxMode | None = None,
    approval_policy: str | None = None,
    base_url: str | None = None,
    max_retries: int | None = None,
    config: Mapping[str, Any] | None = None,
    add_dirs: Sequence[str] = (),
    auth_mode: AuthMode | None = None,
    env: Mapping[str, str] | None = None,
    emit_diff: bool = True,
) -> CodexHarness:
    """The Codex harness.

    ``base_url``: an OpenAI Responses endpoint (``…/v1``) other than OpenAI's, keyed by ``CODEX_API_KEY``
    (host ``OPENAI_BASE_URL`` is used when this is unset). ``config``: raw ``-c`` overrides (values
    rendered as TOML). ``max_retries``: the provider's request and stream retries (with ``base_url``).
    """
    if not executable.split():
        raise ValueError("executable must name the codex command")
    if sandbox_mode is not None and sandbox_mode not in _SANDBOX_MODES:
        raise ValueError(f"sandbox_mode must be one of {', '.join(_SANDBOX_MODES)}, got {sandbox_mode!r}")
    if max_retries is not None and (
        isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0
    ):
        raise ValueError(f"max_retries must be a non-negative integer, got {max_retries!r}")
    if isinstance(add_dirs, str):
        raise ValueError("add_dirs must be a list of strings, not one string")
    resolve_auth_mode(auth_mode, None)
    return CodexHarness(
        model=model,
        executable=executable,
        sandbox_mode=sandbox_mode,
        approval_policy=approval_policy,
        base_url=base_url,
        max_retries=max_retries,
        config=dict(config or {}),
        add_dirs=tuple(add_dirs),
        auth_mode=auth_mode,
        env=dict(env or {}),
        emit_diff=emit_diff,
    )


# -- translation -----------------------------------------------------------------------------------


class CodexTranslator:
    """``exec --json`` lines -> AG-UI events (R25; R7, R8). Never raises; ids come only from ``gen_id``."""

    def __init__(self, ctx: HarnessContext, *, bridge_server: str, executable: str) -> None:
        self._ctx = ctx
        self._gen_id = ctx.gen_id
        self._frame = RunFrame(ctx.thread_id, ctx.run_id)
        self._ledger = ToolCallLedger()
        self._bridge = bridge_server
        self._executable = executable
        self._texts: dict[str, str] = {}  # open agent messages: item id -> text so far
        self._tools: set[str] = set()
        self._sessions: set[str] = set()
        self._errors: list[str] = []
        self.skipped_lines = 0

    def feed(self, line: str) -> list[Event]:
        out: list[Event] = []
        if self._frame.ended or not line.strip():
            return out
        try:
            data = decode_json(line, max_bytes=MAX_AGENT_LINE_BYTES)
        except Exception:  # a log line or a cut-off write: counted, never fatal
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
        out += self._close_texts()
        out += self._ledger.interrupt_all(self._gen_id)
        tail = stderr_tail.strip()[-STDERR_TAIL_CHARS:]
        if exit_code == 127 and ("not found" in tail.lower() or "no such file" in tail.lower()):
            message = (
                f"the Codex executable {self._executable!r} was not found in the sandbox ({tail}): "
                + executable_not_found_hint(self._executable, self._ctx, INSTALL_COMMAND)
            )
            return out + self._frame.error(message, "executable_not_found")
        if self._errors:
            return out + self._frame.error("; ".join(self._errors), "codex_error")
        message = "codex ended without turn.completed" if exit_code == 0 else f"codex exited with code {exit_code}"
        code = "no_result" if exit_code == 0 else f"exit_code_{exit_code}"
        return out + self._frame.error(f"{message}: {tail}" if tail else message, code)

    def _dispatch(self, data: dict[str, Any], out: list[Event]) -> None:
        kind = data.get("type")
        if kind == "thread.started":
            out += self._frame.start()
            thread_id = _str(data.get("thread_id"))
            if thread_id is not None and thread_id not in self._sessions:
                self._sessions.add(thread_id)
                out.append(CustomEvent(name=SESSION_ID_EVENT, value={"sessionId": thread_id}, timestamp=now_ms()))
        elif kind in ("item.started", "item.updated", "item.completed"):
            out += self._frame.start()
            self._item(kind, _dict(data.get("item")), out)
        elif kind == "turn.completed":
            out += self._close_texts()
            out += self._ledger.interrupt_all(self._gen_id)
            usage = self._usage(_dict(data.get("usage")))
            out += self._frame.finish("stop", **({"usage": [usage]} if usage is not None else {}))
        elif kind == "turn.failed":
            out += self._close_texts()
            out += self._ledger.interrupt_all(self._gen_id)
            message = _str(_dict(data.get("error")).get("message")) or "; ".join(self._errors) or "Codex turn failed"
            out += self._frame.error(message, "turn_failed")
        elif kind == "error":
            # Retry notices ("Reconnecting...") come as `error` too: remembered for the end, not terminal.
            notice = _str(data.get("message"))
            if notice is not None:
                self._errors.append(notice)

    def _item(self, kind: str, item: dict[str, Any], out: list[Event]) -> None:
        item_id, item_type = _str(item.get("id")), item.get("type")
        if item_id is None:
            return
        if item_type == "agent_message":
            self._agent_message(item_id, _str(item.get("text")) or "", kind == "item.completed", out)
        elif item_type == "reasoning" and kind == "item.completed":
            text = _str(item.get("text"))
            if text is not None:
                out.append(ReasoningStartEvent(message_id=item_id, timestamp=now_ms()))
                out.append(ReasoningMessageStartEvent(message_id=item_id, timestamp=now_ms()))
                out.append(ReasoningMessageContentEvent(message_id=item_id, delta=text, timestamp=now_ms()))
                out.append(ReasoningMessageEndEvent(message_id=item_id, timestamp=now_ms()))
                out.append(ReasoningEndEvent(message_id=item_id, timestamp=now_ms()))
        elif item_type in TOOL_ITEMS:
            if kind == "item.updated":
                return  # todo list progress and the like: the completed item carries the outcome
            self._tool_start(item_id, str(item_type), item, out)
            if kind == "item.completed":
                self._tool_result(item_id, str(item_type), item, out)

    def _agent_message(self, item_id: str, text: str, done: bool, out: list[Event]) -> None:
        before = self._texts.get(item_id)
        if before is None:
            out.append(TextMessageStartEvent(message_id=item_id, role="assistant", timestamp=now_ms()))
            before = ""
        # A snapshot each time: the delta is what it adds; a rewrite (not a suffix) is sent whole.
        delta = text[len(before) :] if text.startswith(before) else text
        if delta:
            out.append(TextMessageContentEvent(message_id=item_id, delta=delta, timestamp=now_ms()))
        self._texts[item_id] = text
        if done:
            del self._texts[item_id]
            out.append(TextMessageEndEvent(message_id=item_id, timestamp=now_ms()))

    def _close_texts(self) -> list[Event]:
        out: list[Event] = [TextMessageEndEvent(message_id=i, timestamp=now_ms()) for i in self._texts]
        self._texts.clear()
        return out

    def _tool_name(self, item_type: str, item: dict[str, Any]) -> str:
        if item_type != "mcp_tool_call":
            return item_type
        server, tool = str(item.get("server") or ""), str(item.get("tool") or "")
        # The bridge's server name is ours, so the bare tool is what the user defined; another is kept.
        return tool if server == self._bridge else f"mcp__{server}__{tool}"

    @staticmethod
    def _tool_args(item_type: str, item: dict[str, Any]) -> Any:
        if item_type == "command_execution":
            return {"command": item.get("command")}
        if item_type == "mcp_tool_call":
            return item.get("arguments") if isinstance(item.get("arguments"), dict) else {}
        if item_type == "file_change":
            return {"changes": item.get("changes")}
        if item_type == "web_search":
            return {"query": item.get("query")}
        return {}

    def _tool_start(self, item_id: str, item_type: str, item: dict[str, Any], out: list[Event]) -> None:
        if item_id in self._tools:
            return
        self._tools.add(item_id)
        name = self._tool_name(item_type, item)
        args = self._tool_args(item_type, item)
        out.append(ToolCallStartEvent(tool_call_id=item_id, tool_call_name=name, tool_name=name, timestamp=now_ms()))
        out.append(ToolCallArgsEvent(tool_call_id=item_id, delta=_compact(args), timestamp=now_ms()))
        out.append(ToolCallEndEvent(tool_call_id=item_id, input=args, timestamp=now_ms()))
        self._ledger.started(item_id)

    def _tool_result(self, item_id: str, item_type: str, item: dict[str, Any], out: list[Event]) -> None:
        if not self._ledger.resolved(item_id):
            return
        status = _str(item.get("status")) or "completed"
        failed = status in ("failed", "declined")
        content: str
        if item_type == "command_execution":
            result: dict[str, Any] = {"aggregated_output": item.get("aggregated_output") or "", "status": status}
            if _count(item.get("exit_code")) is not None:
                result["exit_code"] = item["exit_code"]
                failed = failed or item["exit_code"] != 0
            content = _compact(result)
        elif item_type == "mcp_tool_call":
            error = _dict(item.get("error"))
            mcp_result = _dict(item.get("result"))
            if error:
                failed = True
                content = str(error.get("message") or _compact(error))
            elif mcp_result.get("content"):
                texts = [
                    p["text"] for p in mcp_result["content"] if isinstance(p, dict) and isinstance(p.get("text"), str)
                ]
                content = "\n".join(texts) if texts else _compact(mcp_result["content"])
            elif mcp_result.get("structured_content") is not None:
                content = _compact(mcp_result["structured_content"])
            else:
                content = _compact({"status": status})
        elif item_type == "file_change":
            content = _compact({"changes": item.get("changes"), "status": status})
        elif item_type == "todo_list":
            content = _compact({"items": item.get("items")})
        else:
            content = _compact({"status": status})
        out.append(
            ToolCallResultEvent(
                message_id=self._gen_id(),
                tool_call_id=item_id,
                content=content,
                role="tool",
                state="output-error" if failed else None,
                timestamp=now_ms(),
            )
        )

    @staticmethod
    def _usage(raw: dict[str, Any]) -> TokenUsage | None:
        input_tokens, output_tokens = _count(raw.get("input_tokens")), _count(raw.get("output_tokens"))
        if input_tokens is None and output_tokens is None:
            return None
        return TokenUsage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            total_tokens=(input_tokens or 0) + (output_tokens or 0),
            cached_input_tokens=_count(raw.get("cached_input_tokens")),
            cache_write_input_tokens=_count(raw.get("cache_write_input_tokens")),
            reasoning_tokens=_count(raw.get("reasoning_output_tokens")),
        )
