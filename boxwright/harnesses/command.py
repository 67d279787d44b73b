"""Any program as a harness: it prints AG-UI events as NDJSON, or plain text.

A line that decodes as an AG-UI event is passed through; any other line is
text the agent said, streamed as one assistant message. The prompt goes to
stdin (or to a file the command reads, where stdin is not writable). Exit 0
finishes the run; any other exit code is a RUN_ERROR naming it and the tail
of stderr. Tests and the demo use it; so can any agent that speaks AG-UI.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .._json import MAX_AGENT_LINE_BYTES
from ..errors import EventDecodeError
from ..events import (
    Event,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    decode_event,
    now_ms,
)
from ..shell import quote
from .base import HarnessContext, HarnessPlan, RunFrame, ToolCallLedger

NOT_FOUND = 127


class CommandTranslator:
    def __init__(self, ctx: HarnessContext) -> None:
        self._ctx = ctx
        self._frame = RunFrame(ctx.thread_id, ctx.run_id)
        self._calls = ToolCallLedger()
        self._text_id: str | None = None

    def _close_text(self) -> list[Event]:
        if self._text_id is None:
            return []
        ended: list[Event] = [TextMessageEndEvent(message_id=self._text_id, timestamp=now_ms())]
        self._text_id = None
        return ended

    def feed(self, line: str) -> list[Event]:
        if self._frame.ended:
            return []
        if len(line) > MAX_AGENT_LINE_BYTES:
            return self._text(line + "\n")  # longer than any event we decode: text, like any other non-event
        try:
            event = decode_event(line)  # bounded: a too-deep line or one like ``1e999`` is text too
        except EventDecodeError:
            return self._text(line + "\n")
        out = self._close_text()
        if isinstance(event, RunStartedEvent):
            return out + self._frame.start()
        out += self._frame.start()
        if isinstance(event, ToolCallStartEvent):
            self._calls.started(event.tool_call_id)
        elif isinstance(event, ToolCallResultEvent):
            self._calls.resolved(event.tool_call_id)
        elif isinstance(event, (RunFinishedEvent, RunErrorEvent)):
            self._frame.ended = True
            if isinstance(event, RunErrorEvent):
                out += self._calls.interrupt_all(self._ctx.gen_id)
        return [*out, event]

    def _text(self, text: str) -> list[Event]:
        out = self._frame.start()
        if self._text_id is None:
            self._text_id = self._ctx.gen_id()
            out.append(TextMessageStartEvent(message_id=self._text_id, role="assistant", timestamp=now_ms()))
        out.append(TextMessageContentEvent(message_id=self._text_id, delta=text, timestamp=now_ms()))
        return out

    def finish(self, exit_code: int, stderr_tail: str) -> list[Event]:
        out = self._close_text() + self._calls.interrupt_all(self._ctx.gen_id)
        if exit_code == 0:
            return out + self._frame.finish()
        if exit_code == NOT_FOUND and "not found" in stderr_tail:
            message = f"the agent command was not found: {stderr_tail.strip()[-300:]}"
            return out + self._frame.error(message, "executable_not_found")
        detail = f": {stderr_tail.strip()[-1000:]}" if stderr_tail.strip() else ""
        return out + self._frame.error(f"agent exited with code {exit_code}{detail}", f"exit_code_{exit_code}")


@dataclass(frozen=True)
class CommandHarness:
    """Runs ``command`` (a shell command line) in the sandbox as the agent."""

    command: str
    env: Mapping[str, str] = field(default_factory=dict)
    name: str = "command"
    emit_diff: bool = True

    def plan(self, ctx: HarnessContext) -> HarnessPlan:
        prompt = f"{ctx.system_prompt}\n\n{ctx.prompt}" if ctx.system_prompt else ctx.prompt
        if ctx.capabilities.writable_stdin:
            return HarnessPlan(command=self.command, stdin=prompt, env=dict(self.env))
        path = f"/tmp/boxwright-command-prompt-{ctx.file_suffix}"
        return HarnessPlan(
            command=f"{{ {self.command} ; }} < {quote(path)}", stdin=None, env=dict(self.env), files={path: prompt}
        )

    def translator(self, ctx: HarnessContext) -> CommandTranslator:
        return CommandTranslator(ctx)


def command_harness(command: str | Sequence[str], *, env: Mapping[str, str] | None = None) -> CommandHarness:
    """A harness for any program; a list is quoted word by word, a string is a shell command line."""
    line = command if isinstance(command, str) else " ".join(quote(part) for part in command)
    if not line.strip():
        raise ValueError("command_harness needs a non-empty command")
    return CommandHarness(command=line, env=dict(env or {}))
