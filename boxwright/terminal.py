"""Rendering a run's AG-UI events live in a terminal (rich): text as it streams, tool calls with their
results, a spinner while the agent works, the final diff.

Everything the agent says ends up in the scrollback as whole lines. Streamed text is never printed
half a line at a time: the line being streamed lives in the live region (above the spinner) and is
printed once it is complete. A live region is redrawn and, at the end, erased; a partial line printed
next to it used to be erased with it, so in a real terminal every word the agent said vanished.
Keeping the partial line in the live region also means a line printed meanwhile (a file change, a
host tool) goes above the sentence instead of into the middle of it.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

from .events import (
    CustomEvent,
    Event,
    ReasoningEndEvent,
    ReasoningMessageChunkEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningStartEvent,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)

RESULT_LINES = 12
THINKING_STYLE = "dim italic"
# A line the agent streams without a newline is printed at a word boundary past this many
# screens' widths: the live region must stay short enough to redraw in place.
MAX_PARTIAL_WIDTHS = 4
# Custom events that carry bookkeeping for programs, not news for a person.
QUIET_EVENTS = frozenset(
    {"claude-code.session-id", "codex.session-id", "opencode.session-id", "structured-output.start"}
)

Stream = Literal["text", "reasoning"]


def _compact(value: Any) -> str:
    """A value as one line of JSON (never a Python repr): what a person can read and paste."""
    try:
        return msgspec.json.encode(value).decode()
    except (TypeError, msgspec.EncodeError):
        return str(value)


def _diff_line(line: str) -> Text:
    if line.startswith(("diff --git", "index ", "--- ", "+++ ")):
        style = "bold"
    elif line.startswith("@@"):
        style = "cyan"
    elif line.startswith("+"):
        style = "green"
    elif line.startswith("-"):
        style = "red"
    else:
        style = ""
    return Text(line, style=style)


class RunRenderer:
    """``with RunRenderer() as r: r.render(event)`` for each event of a run."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(highlight=False)
        self._spinner = Spinner("dots", text=Text("starting the sandbox…", style="dim"))
        self._live: Live | None = None
        self._args: dict[str, list[str]] = {}
        self._names: dict[str, str] = {}
        self._stream: Stream | None = None
        self._line = Text()  # the streamed line not yet printed
        self._said: list[str] = []  # the current assistant message, to recognise it in a RUN_ERROR
        self._last_said = ""

    def __enter__(self) -> RunRenderer:
        self._live = Live(console=self.console, get_renderable=self._view, transient=True, refresh_per_second=12.5)
        self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._end_stream()
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _view(self) -> RenderableType:
        if self._line.plain:
            return Group(self._line, self._spinner)
        return self._spinner

    def _status(self, message: str) -> None:
        self._spinner.update(text=Text(message, style="dim"))

    def _print(self, *renderables: RenderableType, soft_wrap: bool = False) -> None:
        self.console.print(*renderables, soft_wrap=soft_wrap)

    # -- streamed text -----------------------------------------------------------------------------

    def _begin(self, stream: Stream) -> None:
        if self._stream == stream:
            return
        self._end_stream()
        self._stream = stream
        self._said = []
        self._line = Text("thinking: ", style=THINKING_STYLE) if stream == "reasoning" else Text()

    def _feed(self, stream: Stream, delta: str) -> None:
        self._begin(stream)
        style = THINKING_STYLE if stream == "reasoning" else ""
        if stream == "text":
            self._said.append(delta)
        *complete, rest = delta.split("\n")
        for piece in complete:
            self._line.append(piece, style=style)
            self._print(self._line)
            self._line = Text()
        self._line.append(rest, style=style)
        limit = max(self.console.width, 20) * MAX_PARTIAL_WIDTHS
        if len(self._line.plain) > limit:
            cut = self._line.plain.rfind(" ", 0, limit)
            cut = cut + 1 if cut > 0 else limit
            head, tail = self._line[:cut], self._line[cut:]
            head.rstrip()
            self._print(head)
            self._line = tail

    def _end_stream(self) -> None:
        if self._stream is None:
            return
        if self._line.plain.strip() and self._line.plain != "thinking: ":
            self._print(self._line)
        if self._stream == "text":
            self._last_said = "".join(self._said).strip()
        self._stream = None
        self._line = Text()

    # -- events ------------------------------------------------------------------------------------

    def render(self, event: Event) -> None:
        if isinstance(event, RunStartedEvent):
            self._print(Text.assemble(("run ", "bold"), event.run_id, (f"  thread {event.thread_id}", "dim")))
            self._status("the agent is working…")
        elif isinstance(event, ReasoningStartEvent):
            self._begin("reasoning")
        elif isinstance(event, ReasoningMessageContentEvent):
            self._feed("reasoning", event.delta)
        elif isinstance(event, ReasoningMessageChunkEvent):
            if event.delta:
                self._feed("reasoning", event.delta)
        elif isinstance(event, (ReasoningMessageEndEvent, ReasoningEndEvent)):
            if self._stream == "reasoning":
                self._end_stream()
        elif isinstance(event, TextMessageStartEvent):
            self._begin("text")
        elif isinstance(event, TextMessageContentEvent):
            self._feed("text", event.delta)
        elif isinstance(event, TextMessageEndEvent):
            self._end_stream()
        elif isinstance(event, ToolCallStartEvent):
            self._end_stream()
            self._names[event.tool_call_id] = event.tool_name or event.tool_call_name
            self._args[event.tool_call_id] = []
        elif isinstance(event, ToolCallArgsEvent):
            self._args.setdefault(event.tool_call_id, []).append(event.delta)
        elif isinstance(event, ToolCallEndEvent):
            self._print_call(event.tool_call_id)
        elif isinstance(event, ToolCallResultEvent):
            self._end_stream()
            self._print_result(event)
        elif isinstance(event, CustomEvent):
            self._custom(event)
        elif isinstance(event, RunFinishedEvent):
            self._end_stream()
            self._print(Text.assemble(("✓ finished", "green"), (f" ({event.finish_reason or 'stop'})", "dim")))
        elif isinstance(event, RunErrorEvent):
            self._end_stream()
            self._print_error(event)

    def _print_call(self, call_id: str) -> None:
        raw = "".join(self._args.get(call_id, []))
        try:
            args: Any = json.loads(raw) if raw else {}
        except ValueError:
            args = raw
        shown = args["command"] if isinstance(args, dict) and "command" in args else _compact(args)
        name = self._names.get(call_id, "tool")
        self._print(Text.assemble((f"▶ {name} ", "cyan"), str(shown)))

    def _print_result(self, event: ToolCallResultEvent) -> None:
        if isinstance(event.content, str):
            text = event.content
        else:
            text = "\n".join(getattr(part, "text", None) or _compact(part) for part in event.content)
        lines = text.rstrip().splitlines()
        body = "\n".join(lines[:RESULT_LINES])
        if len(lines) > RESULT_LINES:
            body += f"\n… {len(lines) - RESULT_LINES} more lines"
        style = "red" if event.state == "output-error" else "dim"
        self._print(Text(body or "(no output)", style=style))

    def _print_error(self, event: RunErrorEvent) -> None:
        code = f" ({event.code})" if event.code else ""
        # Claude Code says its error as text, then the run fails with the same words: say them once.
        if self._last_said and event.message.strip() == self._last_said:
            self._print(Text.assemble(("✗ the run failed, as said above", "red"), (code, "dim")))
        else:
            self._print(Text.assemble((f"✗ {event.message}", "red"), (code, "dim")))

    def _custom(self, event: CustomEvent) -> None:
        value = event.value if isinstance(event.value, dict) else {}
        if event.name in QUIET_EVENTS:
            return
        if event.name == "file.changed" and value.get("diff"):
            self._end_stream()
            self._print(Text("changes", style="bold"))
            # soft_wrap: every diff line goes out whole and the terminal wraps it, so nothing is
            # cut at the width and a copied diff is still a diff.
            for line in str(value["diff"]).rstrip("\n").split("\n"):
                self._print(_diff_line(line), soft_wrap=True)
        elif event.name == "sandbox.file":
            self._print(Text(f"  {value.get('type', 'change')} {value.get('path', '?')}", style="dim"))
        elif event.name.startswith("tool_bridge."):
            self._print(Text(f"  {self._bridge_line(event.name.split('.', 1)[1], value)}", style="dim"))
        elif event.name == "approval-requested":
            self._print(Text(f"  approval requested: {_compact(event.value)}", style="yellow"))
        else:
            self._print(Text(f"  {event.name}: {_compact(event.value)}", style="dim"))

    @staticmethod
    def _bridge_line(phase: str, value: dict[str, Any]) -> str:
        name = str(value.get("toolName", "?"))
        took = f" in {float(value['durationMs']):.0f} ms" if "durationMs" in value else ""
        if phase == "started":
            return f"⚙ host tool {name}({_compact(value.get('args', {}))})"
        if phase == "finished":
            return f"⚙ host tool {name} done{took}"
        if phase == "failed":
            return f"⚙ host tool {name} failed{took}: {value.get('error', 'unknown error')}"
        return f"⚙ host tool {name} {phase}"
