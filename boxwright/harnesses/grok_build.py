"""Grok Build as a harness: ``grok -p … --output-format streaming-json`` (harness-bridge §4, R28-R30).

Grok Build's CLI is on no package registry this project can install from, so this adapter is
built from the spec's line shapes and tested against a fake CLI that speaks them
(tests/fixtures/fake_grok.py), plus a live test that runs when a real ``grok`` is on PATH.
Native lines: ``thought`` (reasoning), ``text`` (the answer), ``end`` (``sessionId``, ``usage``),
``error``; the legacy Codex-like thread events (``thread.started``, ``item.*``,
``turn.completed``/``turn.failed``) are read with Codex's rules. No terminal line: the run
finishes with ``stop`` when the CLI exits 0 (R30).

Permission hook: none here. Headless grok either auto-approves (``--always-approve``) or, with
``--permission-mode default``, cancels every tool it would have asked about; the policy maps to
those flags (``policy.grok_permissions``), command globs cannot be enforced per command.

The bridge goes into ``<cwd>/.grok/config.toml`` (no ``--mcp-config`` flag exists): the
command keeps a copy of a workspace file that is already there, appends the bridge's table for
the run, and puts the original back (or removes the file) when grok exits, so neither the
token nor our table outlive the run in the workspace (S5). A kill mid-run skips the restore.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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
from ..policy import grok_permissions
from .base import HarnessContext, HarnessPlan, RunFrame, ToolCallLedger, executable_argv, executable_not_found_hint
from .base import as_count as _count
from .base import as_dict as _dict
from .base import compact_json as _compact

NAME = "grok-build"
SESSION_ID_EVENT = "grok-build.session-id"
INSTALL_COMMAND = "install Grok Build (https://x.ai/cli): it puts `grok` in $HOME/.grok/bin"
MODEL_ALIASES = {"grok-build": "grok-build-0.1"}
CONFIG = ".grok/config.toml"
STDERR_TAIL_CHARS = 1000
_TOOL_ITEMS = ("command_execution", "mcp_tool_call", "file_change", "web_search")


def _toml_string(value: str) -> str:
    # TOML basic strings share JSON's escapes for everything a URL or a token holds.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class GrokBuildHarness:
    """Runs ``grok`` headless with streaming-json output. Build it with :func:`grok_build`."""

    model: str = "grok-build-0.1"
    executable: str = "grok"
    max_turns: int | None = None
    extra_args: tuple[str, ...] = ()
    auth_mode: AuthMode | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    emit_diff: bool = True

    @property
    def name(self) -> str:
        return NAME

    def plan(self, ctx: HarnessContext) -> HarnessPlan:
        q = shell.quote
        prompt = f"{ctx.system_prompt}\n\n{ctx.prompt}" if ctx.system_prompt else ctx.prompt
        perms = grok_permissions(ctx.policy)
        argv = [q(p) for p in executable_argv(self.executable, ctx)]
        # The prompt is in argv here (R29): grok -p takes no stdin. --cwd wants the literal path.
        argv += ["-p", q(prompt), "--output-format", "streaming-json", "--model", q(self.model), "--cwd", '"$PWD"']
        if perms.auto_approve:
            argv += ["--always-approve", "--no-plan", "--no-auto-update"]
        else:
            argv += ["--permission-mode", "default"]
        if perms.read_only:
            argv += ["--sandbox", "read-only"]
        if not perms.web_search:
            argv.append("--disable-web-search")
        if ctx.session_id:
            argv += ["--resume", q(ctx.session_id)]
        if self.max_turns is not None:
            argv += ["--max-turns", q(str(self.max_turns))]
        argv += [q(a) for a in self.extra_args]
        mode = resolve_auth_mode(ctx.auth_mode, self.auth_mode)
        env = harness_auth_env(NAME, mode, ctx.host_env)
        secrets = list(env.values())
        scrub = scrub_env_for(NAME, mode)
        prefix = f"unset {' '.join(scrub)}; " if scrub else ""
        if ctx.bridge is None:
            command = prefix + "exec " + " ".join(argv)
        else:
            bridge = ctx.bridge
            table = (
                f"\n[mcp_servers.{bridge.name}]\nurl = {_toml_string(bridge.url)}\nenabled = true\n"
                f"[mcp_servers.{bridge.name}.headers]\nAuthorization = {_toml_string('Bearer ' + bridge.token)}\n"
            )
            env["BOXWRIGHT_GROK_MCP"] = table  # by env, never argv: it holds the token
            secrets.append(bridge.token)
            saved = q(f".grok/.config.toml.boxwright-{ctx.file_suffix or 'run'}")
            command = (
                f"{prefix}mkdir -p .grok && "
                f"if [ -f {CONFIG} ]; then cp -p {CONFIG} {saved}; fi && "
                f'printf %s "$BOXWRIGHT_GROK_MCP" >> {CONFIG} && unset BOXWRIGHT_GROK_MCP; '
                + " ".join(argv)
                + f"; rc=$?; if [ -f {saved} ]; then mv -f {saved} {CONFIG}; else rm -f {CONFIG}; "
                "rmdir .grok 2>/dev/null; fi; exit $rc"
            )
        env.update(self.env)
        return HarnessPlan(command=command, stdin=None, env=env, secrets=secrets)

    def translator(self, ctx: HarnessContext) -> GrokBuildTranslator:
        return GrokBuildTranslator(ctx, executable=self.executable, bridge=ctx.bridge.name if ctx.bridge else None)


def grok_build(
    model: str = "grok-build-0.1",
    *,
    executable: str = "grok",
    max_turns: int | None = None,
    extra_args: Sequence[str] = (),
    auth_mode: AuthMode | None = None,
    env: Mapping[str, str] | None = None,
    emit_diff: bool = True,
) -> GrokBuildHarness:
    """The Grok Build harness (streaming-json). ``model`` ``grok-build`` is an alias of ``grok-build-0.1``."""
    if not executable.split():
        raise ValueError("executable must name the grok command")
    if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1):
        raise ValueError(f"max_turns must be a positive integer, got {max_turns!r}")
    if isinstance(extra_args, str):
        raise ValueError("extra_args must be a list of strings, not one string")
    resolve_auth_mode(auth_mode, None)
    return GrokBuildHarness(
        model=MODEL_ALIASES.get(model, model),
        executable=executable,
        max_turns=max_turns,
        extra_args=tuple(extra_args),
        auth_mode=auth_mode,
        env=dict(env or {}),
        emit_diff=emit_diff,
    )


# -- translation -----------------------------------------------------------------------------------


def _text(data: dict[str, Any]) -> str | None:
    for key in ("content", "text", "delta"):
        value = data.get(key)
        if isinstance(value, str):
            return value
    return None


class GrokBuildTranslator:
    """streaming-json lines -> AG-UI events (R30, legacy lines by R25). Never raises."""

    def __init__(self, ctx: HarnessContext, *, executable: str, bridge: str | None) -> None:
        self._ctx = ctx
        self._gen_id = ctx.gen_id
        self._frame = RunFrame(ctx.thread_id, ctx.run_id)
        self._ledger = ToolCallLedger()
        self._executable = executable
        self._bridge = bridge
        self._text_id: str | None = None
        self._reasoning_id: str | None = None
        self._announced: set[str] = set()
        self._opened: set[str] = set()
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

    def _dispatch(self, data: dict[str, Any], out: list[Event]) -> None:
        kind = data.get("type")
        out += self._frame.start()
        if kind == "thought":
            text = _text(data)
            if text:
                out += self._close_text()
                if self._reasoning_id is None:
                    self._reasoning_id = self._gen_id()
                    out.append(ReasoningStartEvent(message_id=self._reasoning_id, timestamp=now_ms()))
                    out.append(ReasoningMessageStartEvent(message_id=self._reasoning_id, timestamp=now_ms()))
                out.append(ReasoningMessageContentEvent(message_id=self._reasoning_id, delta=text, timestamp=now_ms()))
        elif kind == "text":
            text = _text(data)
            if text:
                out += self._close_reasoning()
                if self._text_id is None:
                    self._text_id = self._gen_id()
                    out.append(TextMessageStartEvent(message_id=self._text_id, role="assistant", timestamp=now_ms()))
                out.append(TextMessageContentEvent(message_id=self._text_id, delta=text, timestamp=now_ms()))
        elif kind == "end":
            out += self._close_all()
            self._session(data.get("sessionId") or data.get("session_id"), out)
            out += self._frame.finish("stop", usage=self._usage(_dict(data.get("usage"))))
        elif kind in ("error", "turn.failed"):
            out += self._close_all()
            error = _dict(data.get("error"))
            message = str(error.get("message") or data.get("message") or "Grok Build reported an error")
            out += self._frame.error(message, "grok_error")
        elif kind == "thread.started":
            self._session(data.get("thread_id"), out)
        elif kind in ("item.started", "item.updated", "item.completed"):
            self._item(kind, _dict(data.get("item")), out)
        elif kind == "turn.completed":
            out += self._close_all()
            out += self._frame.finish("stop", usage=self._usage(_dict(data.get("usage"))))

    def _session(self, session_id: Any, out: list[Event]) -> None:
        if isinstance(session_id, str) and session_id and session_id not in self._announced:
            self._announced.add(session_id)
            out.append(CustomEvent(name=SESSION_ID_EVENT, value={"sessionId": session_id}, timestamp=now_ms()))

    def _item(self, kind: str, item: dict[str, Any], out: list[Event]) -> None:
        item_type, item_id = item.get("type"), item.get("id")
        if not isinstance(item_id, str):
            return
        if item_type == "agent_message" and kind == "item.completed":
            out += self._close_reasoning()
            text_id = self._text_id or item_id
            if self._text_id is None:
                out.append(TextMessageStartEvent(message_id=text_id, role="assistant", timestamp=now_ms()))
            out.append(TextMessageContentEvent(message_id=text_id, delta=str(item.get("text", "")), timestamp=now_ms()))
            out.append(TextMessageEndEvent(message_id=text_id, timestamp=now_ms()))
            self._text_id = None
        elif item_type == "reasoning" and kind == "item.completed":
            out += self._close_text()
            text = str(item.get("text", ""))
            out += [
                ReasoningStartEvent(message_id=item_id, timestamp=now_ms()),
                ReasoningMessageStartEvent(message_id=item_id, timestamp=now_ms()),
                ReasoningMessageContentEvent(message_id=item_id, delta=text, timestamp=now_ms()),
                ReasoningMessageEndEvent(message_id=item_id, timestamp=now_ms()),
                ReasoningEndEvent(message_id=item_id, timestamp=now_ms()),
            ]
        elif item_type in _TOOL_ITEMS and kind in ("item.started", "item.completed"):
            out += self._close_all()
            self._open_tool(item_id, str(item_type), item, out)
            if kind == "item.completed" and self._ledger.resolved(item_id):
                content, failed = self._tool_result(str(item_type), item)
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

    def _open_tool(self, item_id: str, item_type: str, item: dict[str, Any], out: list[Event]) -> None:
        if item_id in self._opened:
            return
        self._opened.add(item_id)
        name = item_type
        args: Any
        if item_type == "mcp_tool_call":
            server, tool = str(item.get("server", "")), str(item.get("tool", ""))
            name = tool if server == self._bridge else f"mcp__{server}__{tool}"
            args = item.get("arguments") or {}
        elif item_type == "command_execution":
            args = {"command": item.get("command")}
        elif item_type == "file_change":
            args = {"changes": item.get("changes")}
        else:
            args = {"query": item.get("query")}
        out.append(ToolCallStartEvent(tool_call_id=item_id, tool_call_name=name, tool_name=name, timestamp=now_ms()))
        out.append(ToolCallArgsEvent(tool_call_id=item_id, delta=_compact(args), timestamp=now_ms()))
        out.append(ToolCallEndEvent(tool_call_id=item_id, input=args, timestamp=now_ms()))
        self._ledger.started(item_id)

    @staticmethod
    def _tool_result(item_type: str, item: dict[str, Any]) -> tuple[str, bool]:
        failed = item.get("status") == "failed"
        if item_type == "command_execution":
            value: dict[str, Any] = {"aggregated_output": item.get("aggregated_output") or ""}
            if item.get("exit_code") is not None:
                value["exit_code"] = item.get("exit_code")
            value["status"] = item.get("status")
            return _compact(value), failed
        if item_type == "mcp_tool_call":
            error = _dict(item.get("error"))
            if error:
                return str(error.get("message", "")), True
            blocks = _dict(item.get("result")).get("content")
            text = (
                "".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict))
                if isinstance(blocks, list)
                else ""
            )
            return text or _compact({"status": item.get("status")}), failed
        if item_type == "file_change":
            return _compact({"changes": item.get("changes"), "status": item.get("status")}), failed
        return _compact({"query": item.get("query")}), False

    @staticmethod
    def _usage(raw: dict[str, Any]) -> list[TokenUsage] | None:
        inp, outp = _count(raw.get("input_tokens")), _count(raw.get("output_tokens"))
        if inp is None and outp is None:
            return None
        return [
            TokenUsage(
                input_tokens=inp,
                output_tokens=outp,
                total_tokens=(inp or 0) + (outp or 0),
                cached_input_tokens=_count(raw.get("cached_input_tokens")),
            )
        ]

    def finish(self, exit_code: int, stderr_tail: str) -> list[Event]:
        out: list[Event] = []
        if self._frame.ended:
            return out
        out += self._close_all()
        out += self._ledger.interrupt_all(self._gen_id)
        if exit_code == 0:
            return out + self._frame.finish("stop")  # R30: no terminal line, a clean exit finishes
        tail = stderr_tail.strip()[-STDERR_TAIL_CHARS:]
        if exit_code == 127 and ("not found" in tail.lower() or "no such file" in tail.lower()):
            hint = executable_not_found_hint(self._executable, self._ctx, INSTALL_COMMAND)
            message = f"the Grok Build executable {self._executable!r} was not found in the sandbox ({tail}): {hint}"
            return out + self._frame.error(message, "executable_not_found")
        message = f"grok exited with code {exit_code}" + (f": {tail}" if tail else "")
        return out + self._frame.error(message, f"exit_code_{exit_code}")

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

    def _close_all(self) -> list[Event]:
        return self._close_text() + self._close_reasoning()
