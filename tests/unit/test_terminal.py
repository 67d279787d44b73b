"""RunRenderer on a plain (piped) console: every word once, whole lines, nothing as a Python repr."""

from __future__ import annotations

import io

from rich.console import Console

from boxwright.events import (
    CustomEvent,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TextPart,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from boxwright.terminal import RunRenderer


def _render(*events: object, width: int = 60) -> str:
    out = io.StringIO()
    with RunRenderer(Console(file=out, width=width, force_terminal=False, highlight=False)) as renderer:
        for event in events:
            renderer.render(event)  # type: ignore[arg-type]
    return out.getvalue()


def _said(message_id: str, *deltas: str) -> list[object]:
    return [
        TextMessageStartEvent(message_id=message_id, role="assistant"),
        *(TextMessageContentEvent(message_id=message_id, delta=d) for d in deltas),
        TextMessageEndEvent(message_id=message_id),
    ]


def test_a_tool_result_of_content_parts_and_a_failed_host_tool_read_as_text() -> None:
    shown = _render(
        RunStartedEvent(thread_id="t", run_id="r"),
        ToolCallStartEvent(tool_call_id="c", tool_call_name="Read"),
        ToolCallArgsEvent(tool_call_id="c", delta='{"file_path": "a.txt"}'),
        ToolCallEndEvent(tool_call_id="c"),
        ToolCallResultEvent(message_id="m", tool_call_id="c", content=[TextPart(text="line one")]),
        CustomEvent(
            name="tool_bridge.failed", value={"callId": "b", "toolName": "get_todos", "durationMs": 3, "error": "no db"}
        ),
        CustomEvent(name="approval-requested", value={"tool": "Bash", "command": "rm -rf x"}),
        RunFinishedEvent(thread_id="t", run_id="r"),
    )
    assert '▶ Read {"file_path":"a.txt"}' in shown
    assert "line one" in shown and "TextPart(" not in shown
    assert "⚙ host tool get_todos failed in 3 ms: no db" in shown
    assert 'approval requested: {"tool":"Bash","command":"rm -rf x"}' in shown
    assert "{'" not in shown


def test_a_long_unbroken_stream_is_printed_in_whole_words_and_nothing_is_lost() -> None:
    words = [f"word{i}" for i in range(200)]
    shown = _render(*_said("m", *(w + " " for w in words)), width=40)
    assert shown.split() == words, "every word once, in order, none split"
    assert max(len(line) for line in shown.splitlines()) <= 40


def test_an_error_the_agent_already_said_is_not_said_again() -> None:
    shown = _render(
        *_said("m", "API Error: 400 refused"),
        RunErrorEvent(message="API Error: 400 refused", code="400"),
    )
    assert shown.count("API Error: 400 refused") == 1 and "✗ the run failed" in shown
    other = _render(*_said("m", "working on it"), RunErrorEvent(message="agent exited with code 3", code="exit_code_3"))
    assert "✗ agent exited with code 3 (exit_code_3)" in other


def test_a_diff_line_wider_than_the_console_is_printed_whole() -> None:
    added = "+" + "x" * 150
    shown = _render(CustomEvent(name="file.changed", value={"path": ".", "diff": f"--- a/f\n+++ b/f\n{added}\n"}))
    assert added in shown.splitlines()


def test_each_harness_session_id_is_bookkeeping_not_news() -> None:
    for name in ("claude-code.session-id", "codex.session-id", "opencode.session-id"):
        shown = _render(CustomEvent(name=name, value={"sessionId": "s-123-visible?"}))
        assert "s-123-visible?" not in shown and name not in shown, (name, shown)
