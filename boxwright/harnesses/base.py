"""The harness contract: how an agent CLI is started in a sandbox and how its output becomes events.

A harness does two pure things, so each can be tested without a sandbox:

- ``plan(ctx)`` says what to run: the shell command, the prompt for stdin,
  extra env, and files to write first (an MCP config, a schema);
- ``translator(ctx)`` turns the CLI's stdout, one line at a time, into AG-UI
  events, and ``finish(exit_code, stderr)`` closes whatever is still open.

``run_agent`` (``boxwright.agent``) does the I/O in between.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec

from ..auth import AuthMode
from ..events import (
    Event,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    ToolCallResultEvent,
    now_ms,
)
from ..host_paths import HostCommand, bind_hint, find_host_command, host_path_env
from ..policy import SandboxPolicy
from ..sandbox import Capabilities

# A CLI line longer than this (in characters) is dropped and counted: no event we use is that big,
# and buffering it whole would let one runaway line take the host's memory.
MAX_LINE_BYTES = 1 << 20
INTERRUPTED = '{"status":"interrupted"}'


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """One chat message handed to ``run_agent`` (AG-UI shape, text content only)."""

    role: Literal["user", "assistant", "system", "developer", "tool"]
    content: str
    id: str | None = None


@dataclass(frozen=True)
class BridgeConfig:
    """Where the agent reaches the host tool bridge (MCP over HTTP) and with which bearer token."""

    url: str
    token: str
    name: str = "boxwright"


@dataclass
class HarnessContext:
    """Everything a harness may read to plan one run. Built by ``run_agent``."""

    run_id: str
    thread_id: str
    prompt: str
    system_prompt: str | None
    capabilities: Capabilities
    provider: str
    gen_id: Callable[[], str]
    cwd: str = "/workspace"
    policy: SandboxPolicy | None = None
    bridge: BridgeConfig | None = None
    session_id: str | None = None
    auth_mode: AuthMode | None = None
    host_env: Mapping[str, str] = field(default_factory=dict)
    file_suffix: str = ""
    # The harness's executable as the host found it and the sandbox was shown it (``boxwright.host_paths``):
    # run by this argv instead of its bare name, which the sandbox's own PATH need not find.
    executable: HostCommand | None = None


@dataclass
class HarnessPlan:
    """What to start. ``files`` are written (virtual paths) before and removed after the run."""

    command: str
    stdin: str | None
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    # Names that must never appear in an event or log (e.g. the bridge token in a config file).
    secrets: Sequence[str] = ()


class Translator(Protocol):
    def feed(self, line: str) -> list[Event]: ...
    def finish(self, exit_code: int, stderr_tail: str) -> list[Event]: ...


class Harness(Protocol):
    @property
    def name(self) -> str: ...
    def plan(self, ctx: HarnessContext) -> HarnessPlan: ...
    def translator(self, ctx: HarnessContext) -> Translator: ...


# -- shared rules --------------------------------------------------------------------------------


def prompt_from_messages(messages: Sequence[Message], adapter: str) -> tuple[str, str | None]:
    """The prompt for a fresh session and the joined system prompt (R3, R4).

    The last message must be user text. Earlier user/assistant text becomes a
    ``Previous conversation:`` preamble; tool messages and empty turns are dropped.
    """
    if not messages or messages[-1].role != "user" or not messages[-1].content.strip():
        raise ValueError(f"{adapter} requires a trailing user message with text")
    system = "\n\n".join(m.content for m in messages if m.role in ("system", "developer") and m.content.strip())
    history = [m for m in messages[:-1] if m.role in ("user", "assistant") and m.content.strip()]
    last = messages[-1].content
    if not history:
        return last, system or None
    lines = [f"{'User' if m.role == 'user' else 'Assistant'}: {m.content}" for m in history]
    return "Previous conversation:\n" + "\n".join(lines) + "\n\n" + last, system or None


class ToolCallLedger:
    """Remembers tool calls that started and not yet got a result (R8)."""

    def __init__(self) -> None:
        self._open: dict[str, None] = {}

    def started(self, tool_call_id: str) -> None:
        self._open[tool_call_id] = None

    def resolved(self, tool_call_id: str) -> bool:
        """Mark resolved; False when the call was never started (or already resolved)."""
        return self._open.pop(tool_call_id, False) is None

    def interrupt_all(self, gen_id: Callable[[], str]) -> list[Event]:
        events: list[Event] = [
            ToolCallResultEvent(
                message_id=gen_id(),
                tool_call_id=call_id,
                content=INTERRUPTED,
                role="tool",
                state="output-error",
                timestamp=now_ms(),
            )
            for call_id in self._open
        ]
        self._open.clear()
        return events


class RunFrame:
    """RUN_STARTED exactly once first, RUN_FINISHED or RUN_ERROR exactly once last."""

    def __init__(self, thread_id: str, run_id: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.started = False
        self.ended = False

    def start(self) -> list[Event]:
        if self.started:
            return []
        self.started = True
        return [RunStartedEvent(thread_id=self.thread_id, run_id=self.run_id, timestamp=now_ms())]

    def finish(self, finish_reason: Literal["stop", "length"] = "stop", **extra: Any) -> list[Event]:
        if self.ended:
            return []
        self.ended = True
        return [
            *self.start(),
            RunFinishedEvent(
                thread_id=self.thread_id,
                run_id=self.run_id,
                finish_reason=finish_reason,
                timestamp=now_ms(),
                **extra,
            ),
        ]

    def error(self, message: str, code: str | None = None) -> list[Event]:
        if self.ended:
            return []
        self.ended = True
        return [
            *self.start(),
            RunErrorEvent(message=message, code=code, thread_id=self.thread_id, run_id=self.run_id, timestamp=now_ms()),
        ]


class LineSplitter:
    """Splits a text stream into lines; a line over ``MAX_LINE_BYTES`` is dropped, counted, never buffered whole."""

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        self._limit = limit
        self._parts: list[str] = []
        self._size = 0
        self._oversized = False
        self.dropped = 0

    def feed(self, text: str) -> list[str]:
        lines: list[str] = []
        start = 0
        while True:
            end = text.find("\n", start)
            piece = text[start:] if end < 0 else text[start:end]
            if not self._oversized:
                self._size += len(piece)
                if self._size > self._limit:
                    self._oversized = True
                    self._parts.clear()
                else:
                    self._parts.append(piece)
            if end < 0:
                return lines
            if self._oversized:
                self.dropped += 1
            else:
                lines.append("".join(self._parts))
            self._parts.clear()
            self._size = 0
            self._oversized = False
            start = end + 1

    def flush(self) -> list[str]:
        """The trailing partial line (a truncated last line still counts)."""
        tail = [] if self._oversized or not self._parts else ["".join(self._parts)]
        if self._oversized:
            self.dropped += 1
        self._parts.clear()
        self._size = 0
        self._oversized = False
        return [line for line in tail if line.strip()]


def executable_argv(executable: str, ctx: HarnessContext) -> list[str]:
    """``executable`` (split on spaces, ``"npx claude"`` works) with its first word as the host found it."""
    words = executable.split()
    if ctx.executable is not None and ctx.executable.name == words[0]:
        return [*ctx.executable.argv, *words[1:]]
    return words


def executable_not_found_hint(executable: str, ctx: HarnessContext, install: str) -> str:
    """What a user does about an executable the sandbox did not find: where the host has it, and how to show it."""
    found = ctx.executable
    if found is None:
        name = executable.split()[0]
        on_host = find_host_command(name, host_path_env(ctx.host_env))
        if on_host is None:
            return f"it is not on the host's PATH either; install it ({install}) or pass its path as executable="
        return (
            f"it is at {on_host.host_path} on the host, which this sandbox does not show; "
            f"install it in the sandbox image or setup ({install})"
        )
    bound = f", with {', '.join(found.bound)} bound read-only" if found.bound else ""
    return (
        f"it is at {found.host_path} on the host and ran as {' '.join(found.argv)}{bound}; "
        f"something it needs is not visible in the sandbox: {bind_hint('<that host path>')}"
    )


def csv(values: Iterable[str]) -> str:
    return ",".join(dict.fromkeys(v for v in values if v))


# -- reading an agent's JSON lines: one home for the small coercions every translator needs ---------


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one: a translator reads fields, never raises."""
    return value if isinstance(value, dict) else {}


def as_str(value: Any) -> str | None:
    """A non-empty string, else None."""
    return value if isinstance(value, str) and value else None


def as_count(value: Any) -> int | None:
    """A non-negative integer (token counts and the like; a bool is not one), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def compact_json(value: Any) -> str:
    """One line of JSON, non-ASCII kept: tool arguments and results as an agent sent them."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
