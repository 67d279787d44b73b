"""Rendering a run's AG-UI events live in a terminal (rich): text as it streams, tool calls with their
results, a spinner while the agent works, the final diff."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.status import Status
from rich.syntax import Syntax

from .events import (
    CustomEvent,
    Event,
    ReasoningMessageContentEvent,
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


class RunRenderer:
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(highlight=False)
        self._status: Status | None = None
        self._args: dict[str, list[str]] = {}
        self._names: dict[str, str] = {}
        self._in_text = False
        self._in_reasoning = False

    def __enter__(self) -> RunRenderer:
        self._status = self.console.status("starting the sandbox…", spinner="dots")
        self._status.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._pause()

    def _pause(self) -> None:
        if self._status is not None:
            self._status.stop()

    def _resume(self, message: str) -> None:
        if self._status is not None:
            self._status.update(message)
            self._status.start()

    def _end_stream(self) -> None:
        if self._in_text or self._in_reasoning:
            self.console.print()
            self._in_text = self._in_reasoning = False

    def render(self, event: Event) -> None:
        self._pause()
        if isinstance(event, RunStartedEvent):
            self.console.print(f"[bold]run[/] {escape(event.run_id)} [dim]thread {escape(event.thread_id)}[/]")
        elif isinstance(event, ReasoningStartEvent):
            self._end_stream()
            self.console.print("[dim italic]thinking: [/]", end="")
            self._in_reasoning = True
        elif isinstance(event, ReasoningMessageContentEvent):
            self.console.print(f"[dim italic]{escape(event.delta)}[/]", end="")
        elif isinstance(event, TextMessageStartEvent):
            self._end_stream()
            self._in_text = True
        elif isinstance(event, TextMessageContentEvent):
            self.console.print(escape(event.delta), end="")
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
            self._print_result(event)
        elif isinstance(event, CustomEvent):
            self._custom(event)
        elif isinstance(event, RunFinishedEvent):
            self._end_stream()
            self.console.print(f"[green]✓ finished[/] [dim]({event.finish_reason or 'stop'})[/]")
            return
        elif isinstance(event, RunErrorEvent):
            self._end_stream()
            code = f" [dim]({escape(event.code)})[/]" if event.code else ""
            self.console.print(f"[red]✗ {escape(event.message)}[/]{code}")
            return
        self._resume("the agent is working…")

    def _print_call(self, call_id: str) -> None:
        raw = "".join(self._args.get(call_id, []))
        try:
            args: Any = json.loads(raw) if raw else {}
        except ValueError:
            args = raw
        shown = args.get("command") if isinstance(args, dict) and "command" in args else json.dumps(args)
        name = self._names.get(call_id, "tool")
        self.console.print(f"[cyan]▶ {escape(name)}[/] {escape(str(shown))}")

    def _print_result(self, event: ToolCallResultEvent) -> None:
        text = event.content if isinstance(event.content, str) else json.dumps(event.content)
        lines = text.rstrip().splitlines()
        more = f"\n… {len(lines) - RESULT_LINES} more lines" if len(lines) > RESULT_LINES else ""
        body = "\n".join(lines[:RESULT_LINES]) + more
        style = "red" if event.state == "output-error" else "dim"
        self.console.print(f"[{style}]{escape(body) or '(no output)'}[/]")

    def _custom(self, event: CustomEvent) -> None:
        value = event.value if isinstance(event.value, dict) else {}
        if event.name == "file.changed" and value.get("diff"):
            self._end_stream()
            self.console.print("[bold]changes[/]")
            self.console.print(Syntax(str(value["diff"]), "diff", theme="ansi_dark", background_color="default"))
        elif event.name == "sandbox.file":
            self.console.print(f"[dim]  {escape(str(value.get('type')))} {escape(str(value.get('path')))}[/]")
        elif event.name.startswith("tool_bridge."):
            self.console.print(f"[dim]  host tool {escape(event.name.split('.', 1)[1])}: {escape(str(value))}[/]")
