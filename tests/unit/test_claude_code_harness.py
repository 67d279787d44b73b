"""The Claude Code harness: its plan (argv, env, files) and its translator, fed the real CLI's recorded output."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from boxwright.events import (
    CustomEvent,
    Event,
    ReasoningMessageContentEvent,
    RunErrorEvent,
    RunFinishedEvent,
    TextMessageContentEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    chunk_fingerprint,
    encode_event,
)
from boxwright.harnesses import claude_code as cc
from boxwright.harnesses.base import INTERRUPTED, BridgeConfig, HarnessContext, LineSplitter
from boxwright.harnesses.claude_code import ClaudeCodeHarness, claude_code
from boxwright.policy import define_sandbox_policy
from tests.fixtures import CLAUDE_RECORDINGS, claude_env, find_claude
from tests.support.harness_replay import OFFICIAL_EVENT, REASONING5, TERMINAL, TEXT3, TOOL_QUAD, caps
from tests.support.harness_replay import make_ctx as replay_ctx
from tests.support.require import missing

SESSION = "00000000-0000-4000-8000-000000000001"
MODEL = "claude-sonnet-4-5"


def make_ctx(**overrides: Any) -> HarnessContext:
    # The Claude Code cases plan for a container by default (where the CLI runs as non-root).
    return replay_ctx(**{"provider": "docker", **overrides})


def recording(name: str) -> list[str]:
    return (CLAUDE_RECORDINGS / f"{name}.ndjson").read_text().splitlines()


def check_well_formed(events: list[Event]) -> None:
    """Every event is valid AG-UI; one RUN_STARTED first, one terminal last; every call answered once."""
    for event in events:
        OFFICIAL_EVENT.validate_json(encode_event(event))
    kinds = [e.type for e in events]
    assert kinds[0] == "RUN_STARTED" and kinds.count("RUN_STARTED") == 1
    assert kinds[-1] in TERMINAL and sum(kinds.count(t) for t in TERMINAL) == 1
    started = [e.tool_call_id for e in events if isinstance(e, ToolCallStartEvent)]
    answered = [e.tool_call_id for e in events if isinstance(e, ToolCallResultEvent)]
    assert sorted(started) == sorted(answered)
    assert kinds.count("TEXT_MESSAGE_START") == kinds.count("TEXT_MESSAGE_END")
    assert kinds.count("REASONING_START") == kinds.count("REASONING_END")
    for event in events:
        if isinstance(event, RunFinishedEvent):
            assert b"tool_calls" not in encode_event(event)  # R7: never a tool_calls finish


def translate(
    lines: list[str],
    harness: ClaudeCodeHarness | None = None,
    exit_code: int = 0,
    stderr: str = "",
    **ctx_fields: Any,
) -> list[Event]:
    ctx = make_ctx(**ctx_fields)
    translator = (harness or claude_code()).translator(ctx)
    events = [event for line in lines for event in translator.feed(line)]
    events += translator.finish(exit_code, stderr)
    check_well_formed(events)
    return events


def types(events: list[Event]) -> list[str]:
    return [e.type for e in events]


def only(events: list[Event], cls: type[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, cls)]


def finished(events: list[Event]) -> RunFinishedEvent:
    assert isinstance(events[-1], RunFinishedEvent)
    return events[-1]


def errored(events: list[Event]) -> RunErrorEvent:
    assert isinstance(events[-1], RunErrorEvent)
    return events[-1]


def session_event(events: list[Event]) -> CustomEvent:
    (event,) = [e for e in events if isinstance(e, CustomEvent) and e.name == "claude-code.session-id"]
    return event


def line(obj: dict[str, Any]) -> str:
    return json.dumps(obj)


INIT = line({"type": "system", "subtype": "init", "session_id": "s-1", "model": "sonnet", "tools": ["Bash"]})


def assistant(*content: dict[str, Any], message_id: str = "msg_1", parent: str | None = None) -> str:
    return line(
        {"type": "assistant", "parent_tool_use_id": parent, "message": {"id": message_id, "content": list(content)}}
    )


def tool_result(call_id: str, content: Any, is_error: bool = False) -> str:
    block = {"type": "tool_result", "tool_use_id": call_id, "content": content, "is_error": is_error}
    return line({"type": "user", "parent_tool_use_id": None, "message": {"role": "user", "content": [block]}})


def result(**fields: Any) -> str:
    return line({"type": "result", "subtype": "success", "is_error": False, **fields})


def stream(event: dict[str, Any]) -> str:
    return line({"type": "stream_event", "parent_tool_use_id": None, "event": event})


# ==================================================================================================
# translator: the recorded runs (T1, T7-T16, T18)


def test_bash_recording_tool_call_then_text_then_finish_with_usage_and_cost() -> None:
    events = translate(recording("bash"))
    assert types(events) == ["RUN_STARTED", "CUSTOM", *TOOL_QUAD, *TEXT3, "RUN_FINISHED"]
    session = session_event(events)
    assert session.value["sessionId"] == SESSION and session.value["model"] == MODEL
    assert "Bash" in session.value["tools"]
    start, args, end, res = events[2:6]
    assert isinstance(start, ToolCallStartEvent) and isinstance(args, ToolCallArgsEvent)
    assert isinstance(end, ToolCallEndEvent) and isinstance(res, ToolCallResultEvent)
    assert (start.tool_call_id, start.tool_call_name, start.tool_name) == ("toolu_fake0002", "Bash", "Bash")
    assert start.parent_message_id == "msg_fake0003"
    assert json.loads(args.delta) == {"command": "echo hi > f.txt", "description": "write f.txt"}
    assert end.input == {"command": "echo hi > f.txt", "description": "write f.txt"}
    assert (res.tool_call_id, res.message_id, res.content) == (
        "toolu_fake0002",
        "r7-0",
        "(Bash completed with no output)",
    )
    assert res.state is None and res.role == "tool"
    assert only(events, TextMessageStartEvent)[0].message_id == "msg_fake0005"
    assert only(events, TextMessageContentEvent)[0].delta == "Created f.txt."
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent)
    assert (finished.thread_id, finished.run_id, finished.finish_reason) == ("t1", "r7", "stop")
    # T8: cache read -> cached_input_tokens, cache creation -> cache_write_input_tokens, cost in result.
    assert finished.usage == [
        TokenUsage(
            model=MODEL,
            input_tokens=48,
            output_tokens=18,
            total_tokens=66,
            cached_input_tokens=32,
            cache_write_input_tokens=16,
            reasoning_tokens=0,
        )
    ]
    assert finished.result == {"totalCostUsd": 0.00048360000000000005}


def test_parallel_recording_matches_results_by_id_though_they_come_back_reversed() -> None:
    events = translate(recording("parallel"))
    assert types(events) == [
        "RUN_STARTED",
        "CUSTOM",
        *TEXT3,
        *TOOL_QUAD[:3],
        *TOOL_QUAD[:3],
        "TOOL_CALL_RESULT",
        "TOOL_CALL_RESULT",
        *TEXT3,
        "RUN_FINISHED",
    ]
    assert [e.tool_call_id for e in only(events, ToolCallStartEvent)] == ["toolu_fake0002", "toolu_fake0003"]
    results = [(e.tool_call_id, e.message_id, e.content) for e in only(events, ToolCallResultEvent)]
    assert results == [("toolu_fake0003", "r7-0", "two"), ("toolu_fake0002", "r7-1", "one")]
    texts = [(e.message_id, e.delta) for e in only(events, TextMessageContentEvent)]
    assert texts == [("msg_fake0004", "Running two commands."), ("msg_fake0006", "Both commands ran.")]


def test_thinking_recording_gives_the_five_reasoning_events_then_text() -> None:
    events = translate(recording("thinking"))
    assert types(events) == ["RUN_STARTED", "CUSTOM", *REASONING5, *TEXT3, "RUN_FINISHED"]
    assert {getattr(e, "message_id", None) for e in events[2:7]} == {"r7-0"}
    assert only(events, ReasoningMessageContentEvent)[0].delta == "The user wants 2+2. That is 4."
    assert only(events, TextMessageContentEvent)[0].delta == "2 + 2 = 4."


def test_write_recording() -> None:
    events = translate(recording("write"))
    assert types(events) == ["RUN_STARTED", "CUSTOM", *TOOL_QUAD, *TEXT3, "RUN_FINISHED"]
    start = only(events, ToolCallStartEvent)[0]
    assert start.tool_call_name == "Write"
    assert only(events, ToolCallEndEvent)[0].input == {
        "file_path": "/tmp/claude-rec/cwd/w.txt",
        "content": "hello from write\n",
    }
    assert only(events, ToolCallResultEvent)[0].content.startswith("File created successfully at:")


def test_denied_recording_marks_the_result_output_error_and_still_finishes() -> None:
    events = translate(recording("denied"))
    # system/permission_denied adds nothing: the tool_result carries the denial (T11).
    assert types(events) == ["RUN_STARTED", "CUSTOM", *TOOL_QUAD, *TEXT3, "RUN_FINISHED"]
    res = only(events, ToolCallResultEvent)[0]
    assert res.state == "output-error"
    assert str(res.content).startswith("Output redirection to '/tmp/claude-rec/cwd/f.txt' needs approval")
    assert finished(events).finish_reason == "stop"


def test_api_error_500_recording_is_a_run_error_with_the_api_message() -> None:
    events = translate(recording("api_error_500"), exit_code=1)
    assert types(events) == ["RUN_STARTED", "CUSTOM", *TEXT3, "RUN_ERROR"]
    error = events[-1]
    assert isinstance(error, RunErrorEvent)
    assert error.message.startswith("API Error: 500 scripted server error.")
    assert (error.code, error.thread_id, error.run_id) == ("api_error", "t1", "r7")


def test_connection_refused_recording_says_success_but_is_an_error() -> None:
    raw_result = json.loads(recording("connection_refused")[-1])
    assert (raw_result["subtype"], raw_result["is_error"]) == ("success", True)  # what makes this case
    events = translate(recording("connection_refused"), exit_code=1)
    assert types(events) == ["RUN_STARTED", "CUSTOM", *TEXT3, "RUN_ERROR"]
    error = events[-1]
    assert isinstance(error, RunErrorEvent)
    assert "ECONNREFUSED" in error.message and error.code == "api_error"


def test_partial_recording_streams_deltas_and_never_repeats_the_full_blocks() -> None:
    events = translate(recording("partial"))
    text_stream = ["TEXT_MESSAGE_START", *["TEXT_MESSAGE_CONTENT"] * 3, "TEXT_MESSAGE_END"]
    reasoning_stream = [
        "REASONING_START",
        "REASONING_MESSAGE_START",
        *["REASONING_MESSAGE_CONTENT"] * 3,
        "REASONING_MESSAGE_END",
        "REASONING_END",
    ]
    assert types(events) == [
        "RUN_STARTED",
        "CUSTOM",
        *text_stream,
        *TOOL_QUAD,
        *reasoning_stream,
        *text_stream,
        "RUN_FINISHED",
    ]
    by_message: dict[str, str] = {}
    for event in only(events, TextMessageContentEvent):
        by_message[event.message_id] = by_message.get(event.message_id, "") + event.delta
    assert by_message == {"msg_fake0003": "Writing the file.", "msg_fake0005": "Created f.txt."}
    thinking = "".join(e.delta for e in only(events, ReasoningMessageContentEvent))
    assert thinking == "The file is written; report it."
    # The tool call is emitted once, from the full assistant line, with the complete input.
    assert only(events, ToolCallEndEvent)[0].input == {"command": "echo hi > f.txt", "description": "write f.txt"}
    assert [e.message_id for e in only(events, ToolCallResultEvent)] == ["r7-0"]
    assert {getattr(e, "message_id", None) for e in events if e.type.startswith("REASONING")} == {"r7-1"}


@pytest.mark.parametrize("with_schema", [True, False])
def test_structured_recording_hides_the_tool_and_emits_structured_output(with_schema: bool) -> None:
    harness = claude_code(output_schema={"type": "object"} if with_schema else None)
    events = translate(recording("structured"), harness)
    assert types(events) == ["RUN_STARTED", "CUSTOM", "CUSTOM", "CUSTOM", "RUN_FINISHED"]
    start, complete = events[2], events[3]
    assert isinstance(start, CustomEvent) and isinstance(complete, CustomEvent)
    assert start.name == "structured-output.start" and start.value == {"messageId": "r7-0"}
    assert complete.name == "structured-output.complete"
    assert complete.value["object"] == {"summary": "ok"} and complete.value["messageId"] == "r7-0"
    assert json.loads(complete.value["raw"]) == {"summary": "ok"}


def test_max_turns_recording_finishes_with_length() -> None:
    events = translate(recording("max_turns"), exit_code=1)
    assert types(events) == ["RUN_STARTED", "CUSTOM", *TOOL_QUAD, "RUN_FINISHED"]
    assert finished(events).finish_reason == "length"
    assert finished(events).usage == [
        TokenUsage(
            model=MODEL,
            input_tokens=24,
            output_tokens=11,
            total_tokens=35,
            cached_input_tokens=16,
            cache_write_input_tokens=8,
            reasoning_tokens=0,
        )
    ]


def test_mcp_recording_strips_the_bridge_prefix_and_keeps_a_foreign_one() -> None:
    bridged = translate(recording("mcp"), bridge=BridgeConfig("http://h/mcp", "tok", name="tanstack"))
    assert types(bridged) == ["RUN_STARTED", "CUSTOM", *TOOL_QUAD, *TEXT3, "RUN_FINISHED"]
    start = only(bridged, ToolCallStartEvent)[0]
    assert (start.tool_call_name, start.tool_name) == ("get_fact", "get_fact")
    # The MCP result is a list of text blocks; its text is what the event carries.
    assert only(bridged, ToolCallResultEvent)[0].content == "FACT about otters: they hold hands while sleeping."
    assert "mcp__tanstack__get_fact" in session_event(bridged).value["tools"]
    # Our bridge is named boxwright; any other server keeps its full name (T10).
    foreign = only(translate(recording("mcp")), ToolCallStartEvent)[0]
    assert (foreign.tool_call_name, foreign.tool_name) == ("mcp__tanstack__get_fact", "mcp__tanstack__get_fact")


@pytest.mark.parametrize("name", sorted(p.stem for p in CLAUDE_RECORDINGS.glob("*.ndjson")))
def test_every_recording_translates_the_same_twice_and_depends_on_the_run_id(name: str) -> None:
    """T22: a takeover re-translates the journal with a fresh run-scoped generator and must match."""
    lines = recording(name)
    first = [chunk_fingerprint(e) for e in translate(lines, run_id="r7")]
    second = [chunk_fingerprint(e) for e in translate(lines, run_id="r7")]
    assert first == second
    other = [chunk_fingerprint(e) for e in translate(lines, run_id="r8")]
    assert other != first  # the run id is in RUN_STARTED and every generated id


# ==================================================================================================
# translator: the spec's worked example and synthetic cases


def test_spec_worked_example() -> None:
    lines = [
        INIT,
        assistant(
            {"type": "thinking", "thinking": "plan"},
            {"type": "tool_use", "id": "tu_1", "name": "mcp__boxwright__get_fact", "input": {"topic": "x"}},
        ),
        tool_result("tu_1", [{"type": "text", "text": "FACT"}]),
        assistant({"type": "text", "text": "Done."}, message_id="msg_2"),
        result(usage={"input_tokens": 100, "output_tokens": 50, "cache_read_input_tokens": 10}, total_cost_usd=0.12),
    ]
    events = translate(lines)
    assert types(events) == ["RUN_STARTED", "CUSTOM", *REASONING5, *TOOL_QUAD, *TEXT3, "RUN_FINISHED"]
    assert session_event(events).value == {"sessionId": "s-1", "model": "sonnet", "tools": ["Bash"]}
    assert {getattr(e, "message_id", None) for e in events[2:7]} == {"r7-0"}
    assert only(events, ReasoningMessageContentEvent)[0].delta == "plan"
    start = only(events, ToolCallStartEvent)[0]
    assert (start.tool_call_id, start.tool_call_name, start.tool_name) == ("tu_1", "get_fact", "get_fact")
    assert only(events, ToolCallArgsEvent)[0].delta == '{"topic":"x"}'
    res = only(events, ToolCallResultEvent)[0]
    assert (res.tool_call_id, res.message_id, res.content) == ("tu_1", "r7-1", "FACT")
    assert [(e.message_id, e.delta) for e in only(events, TextMessageContentEvent)] == [("msg_2", "Done.")]
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent) and finished.finish_reason == "stop"
    assert finished.usage == [
        TokenUsage(model="sonnet", input_tokens=100, output_tokens=50, total_tokens=150, cached_input_tokens=10)
    ]
    assert finished.result == {"totalCostUsd": 0.12}


def test_init_text_success_is_exactly_the_minimal_sequence() -> None:
    """T7."""
    events = translate([INIT, assistant({"type": "text", "text": "hi"}), result()])
    assert types(events) == ["RUN_STARTED", "CUSTOM", *TEXT3, "RUN_FINISHED"]
    assert finished(events).finish_reason == "stop" and finished(events).usage is None


def test_second_text_block_of_one_message_gets_its_own_id() -> None:
    lines = [
        INIT,
        assistant({"type": "text", "text": "one"}),
        assistant({"type": "tool_use", "id": "tu_1", "name": "Bash", "input": {}}),
        assistant({"type": "text", "text": "two"}),
        tool_result("tu_1", "ok"),
        result(),
    ]
    events = translate(lines)
    assert [e.message_id for e in only(events, TextMessageStartEvent)] == ["msg_1", "r7-0"]


def test_first_line_of_any_kind_starts_the_run_and_a_repeated_init_adds_nothing() -> None:
    events = translate([assistant({"type": "text", "text": "hi"}), INIT, INIT, result()])
    assert types(events) == ["RUN_STARTED", *TEXT3, "CUSTOM", "RUN_FINISHED"]


def test_sub_agent_lines_and_unknown_types_and_system_noise_are_ignored() -> None:
    """T15."""
    lines = [
        INIT,
        assistant({"type": "text", "text": "from the sub-agent"}, message_id="sub", parent="tu_task"),
        line({"type": "telemetry", "data": 1}),
        line({"type": "system", "subtype": "api_retry", "attempt": 1, "error_status": 500}),
        line({"type": "system", "subtype": "permission_denied", "tool_name": "Bash", "tool_use_id": "x"}),
        line({"type": "system", "subtype": "status", "status": "requesting"}),
        line({"type": "rate_limit_event", "x": 1}),
        assistant({"type": "text", "text": "main"}),
        result(),
    ]
    events = translate(lines)
    assert types(events) == ["RUN_STARTED", "CUSTOM", *TEXT3, "RUN_FINISHED"]
    assert only(events, TextMessageContentEvent)[0].delta == "main"


def test_a_result_for_an_unknown_or_answered_call_is_dropped() -> None:
    lines = [
        INIT,
        assistant({"type": "tool_use", "id": "tu_1", "name": "Bash", "input": {}}),
        tool_result("tu_1", "first"),
        tool_result("tu_1", "again"),
        tool_result("tu_never", "orphan"),
        result(),
    ]
    events = translate(lines)
    assert [e.content for e in only(events, ToolCallResultEvent)] == ["first"]


def test_unresolved_call_gets_an_interrupted_result_before_the_finish() -> None:
    """T12 / R8: at a normal end."""
    events = translate([INIT, assistant({"type": "tool_use", "id": "tu_1", "name": "Bash", "input": {}}), result()])
    assert types(events) == ["RUN_STARTED", "CUSTOM", *TOOL_QUAD, "RUN_FINISHED"]
    res = only(events, ToolCallResultEvent)[0]
    assert (res.content, res.state, res.message_id) == (INTERRUPTED, "output-error", "r7-0")


@pytest.mark.parametrize(
    ("fields", "message", "code"),
    [
        ({"subtype": "error_during_execution", "is_error": True, "errors": ["boom", "bust"]}, "boom; bust", None),
        (
            {"subtype": "error_during_execution", "is_error": True, "terminal_reason": "aborted"},
            "Claude Code run failed: error_during_execution",
            "aborted",
        ),
        (
            {"subtype": "success", "is_error": True, "api_error_status": 400, "result": "API Error: 400 bad"},
            None,
            "400",
        ),
        ({"subtype": "error_max_budget_usd", "is_error": False}, "Claude Code run failed: error_max_budget_usd", None),
    ],
)
def test_error_results_become_run_error_with_message_and_code(
    fields: dict[str, Any], message: str | None, code: str | None
) -> None:
    """T14 (other error subtypes -> RUN_ERROR + code)."""
    events = translate([INIT, line({"type": "result", **fields})], exit_code=1, stderr="ignored: a result was seen")
    error = events[-1]
    assert isinstance(error, RunErrorEvent)
    assert error.message == (message or fields["result"])
    assert error.code == (code or fields["subtype"])


def test_lines_after_the_result_are_ignored_and_finish_adds_nothing() -> None:
    ctx = make_ctx()
    translator = claude_code().translator(ctx)
    events = [e for raw in [INIT, result()] for e in translator.feed(raw)]
    assert translator.feed(assistant({"type": "text", "text": "late"})) == []
    assert translator.finish(1, "late failure") == []
    assert types(events)[-1] == "RUN_FINISHED"


# -- partial streams cut short, and finish() --------------------------------------------------------


def test_text_open_when_the_process_dies_is_closed_before_the_error() -> None:
    lines = recording("partial")[:8]  # init, status, message_start, block start, 3 deltas, the full line
    events = translate(lines, exit_code=137, stderr="Killed")
    text_stream = ["TEXT_MESSAGE_START", *["TEXT_MESSAGE_CONTENT"] * 3, "TEXT_MESSAGE_END"]
    assert types(events) == ["RUN_STARTED", "CUSTOM", *text_stream, "RUN_ERROR"]
    assert errored(events).message == "claude exited with code 137: Killed"
    assert errored(events).code == "exit_code_137"


def test_reasoning_and_tool_call_open_at_the_end_are_closed_and_interrupted() -> None:
    lines = [
        INIT,
        assistant({"type": "tool_use", "id": "tu_1", "name": "Bash", "input": {"command": "sleep 100"}}),
        stream({"type": "message_start", "message": {"id": "msg_2"}}),
        stream({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        stream({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}}),
    ]
    events = translate(lines, exit_code=143, stderr="")
    assert types(events) == [
        "RUN_STARTED",
        "CUSTOM",
        *TOOL_QUAD[:3],
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
        "REASONING_END",
        "TOOL_CALL_RESULT",
        "RUN_ERROR",
    ]
    assert only(events, ToolCallResultEvent)[0].content == INTERRUPTED
    assert errored(events).message == "claude exited with code 143"


def test_exit_zero_without_a_result() -> None:
    events = translate([INIT, assistant({"type": "text", "text": "hi"})], exit_code=0)
    assert types(events) == ["RUN_STARTED", "CUSTOM", *TEXT3, "RUN_ERROR"]
    assert errored(events).message == "claude ended without a result"
    assert errored(events).code == "no_result"


def test_nothing_at_all_then_exit_still_gives_started_and_error() -> None:
    events = translate([], exit_code=1, stderr="")
    assert types(events) == ["RUN_STARTED", "RUN_ERROR"]


@pytest.mark.parametrize(
    "stderr", ["sh: 1: exec: claude: not found\n", "bash: /opt/claude: No such file or directory\n"]
)
def test_command_not_found_says_how_to_install_claude(stderr: str) -> None:
    events = translate([], exit_code=127, stderr=stderr)
    error = events[-1]
    assert isinstance(error, RunErrorEvent)
    assert "was not found" in error.message and "npm install @anthropic-ai/claude-code" in error.message
    assert stderr.strip() in error.message and error.code == "executable_not_found"


def test_stderr_tail_is_bounded_to_its_last_1000_chars() -> None:
    stderr = "HEAD" + "x" * 5000 + "TAIL"
    error = translate([INIT], exit_code=2, stderr=stderr)[-1]
    assert isinstance(error, RunErrorEvent)
    assert error.message.endswith("TAIL") and "HEAD" not in error.message
    assert len(error.message) <= len("claude exited with code 2: ") + 1000


# -- malformed input -------------------------------------------------------------------------------


def test_non_json_lines_are_skipped_and_counted() -> None:
    lines = recording("bash")
    noisy = [lines[0], "not json {", "[1, 2]", "", "null", *lines[1:]]
    ctx = make_ctx()
    translator = claude_code().translator(ctx)
    events = [e for raw in noisy for e in translator.feed(raw)] + translator.finish(0, "")
    assert types(events) == types(translate(lines))
    assert translator.skipped_lines == 3  # the blank line is not counted


def test_garbage_then_exit_1_is_one_run_error_naming_code_and_stderr() -> None:
    ctx = make_ctx()
    translator = claude_code().translator(ctx)
    events = [e for raw in ["Error: something", "\x1b[31mred\x1b[0m"] for e in translator.feed(raw)]
    assert events == []
    events += translator.finish(1, "Error: boom\n")
    check_well_formed(events)
    assert types(events) == ["RUN_STARTED", "RUN_ERROR"]
    assert errored(events).message == "claude exited with code 1: Error: boom (2 unreadable output line(s) skipped)"


def test_oversized_line_is_dropped_by_the_splitter_and_the_run_goes_on() -> None:
    lines = recording("bash")
    huge = line({"type": "assistant", "message": {"id": "big", "content": [{"type": "text", "text": "x" * (1 << 21)}]}})
    text = "\n".join([lines[0], huge, *lines[1:]]) + "\n"
    splitter = LineSplitter()
    out: list[str] = []
    for offset in range(0, len(text), 65536):
        out += splitter.feed(text[offset : offset + 65536])
    out += splitter.flush()
    assert splitter.dropped == 1 and out == lines
    assert types(translate(out)) == types(translate(lines))


def test_truncated_last_line_is_flushed_then_skipped_and_the_exit_decides() -> None:
    lines = recording("bash")
    cut = lines[-1][: len(lines[-1]) // 2]
    splitter = LineSplitter()
    out = splitter.feed("\n".join([*lines[:-1], cut])) + splitter.flush()
    assert out[-1] == cut
    ctx = make_ctx()
    translator = claude_code().translator(ctx)
    events = [e for raw in out for e in translator.feed(raw)] + translator.finish(137, "")
    check_well_formed(events)
    assert translator.skipped_lines == 1
    assert types(events) == ["RUN_STARTED", "CUSTOM", *TOOL_QUAD, *TEXT3, "RUN_ERROR"]


@pytest.mark.parametrize(
    "raw",
    [
        '{"type":"assistant","message":"x"}',
        '{"type":"assistant","message":{"content":"plain"}}',
        '{"type":"assistant","message":{"id":7,"content":[1,null,{"type":"tool_use"},{"type":"text","text":5}]}}',
        '{"type":"user","message":{"content":[{"type":"tool_result"},{"type":"tool_result","tool_use_id":3}]}}',
        '{"type":"stream_event","event":null}',
        '{"type":"stream_event","event":{"type":"content_block_delta","index":5,"delta":{}}}',
        '{"type":"stream_event","event":{"type":"content_block_start","index":"0","content_block":[]}}',
        '{"type":"system","subtype":"init","session_id":["x"],"tools":"Bash"}',
        '{"type":"result","usage":"x","total_cost_usd":true,"subtype":7,"errors":"e"}',
        '"a string"',
        "\udcff\x00",
        "{" * 10_000,
    ],
)
def test_odd_shapes_never_raise(raw: str) -> None:
    events = translate([INIT, raw, assistant({"type": "text", "text": "ok"}), result()], exit_code=0)
    assert types(events)[0] == "RUN_STARTED" and types(events)[-1] in TERMINAL


# -- structured output (R21, T18) -------------------------------------------------------------------


def structured_values(events: list[Event]) -> list[Any]:
    return [e.value for e in events if isinstance(e, CustomEvent) and e.name == "structured-output.complete"]


def test_structured_from_the_tool_input_when_the_result_has_no_field() -> None:
    lines = [
        INIT,
        assistant({"type": "tool_use", "id": "tu_s", "name": "StructuredOutput", "input": {"summary": "ok"}}),
        tool_result("tu_s", "Structured output provided successfully"),
        assistant({"type": "tool_use", "id": "tu_e", "name": "StructuredOutput", "input": {}}),  # empty: ignored
        result(),
    ]
    events = translate(lines)
    assert not only(events, ToolCallStartEvent) and not only(events, ToolCallResultEvent)
    (value,) = structured_values(events)
    assert value["object"] == {"summary": "ok"} and json.loads(value["raw"]) == {"summary": "ok"}


def test_structured_from_streamed_input_json_deltas() -> None:
    block = {"type": "tool_use", "id": "tu_s", "name": "StructuredOutput", "input": {}}
    lines = [
        INIT,
        stream({"type": "message_start", "message": {"id": "msg_s"}}),
        stream({"type": "content_block_start", "index": 0, "content_block": block}),
        stream(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": '{"a"'}}
        ),
        stream(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": ":1}"}}
        ),
        stream({"type": "content_block_stop", "index": 0}),
        result(),
    ]
    (value,) = structured_values(translate(lines))
    assert value["object"] == {"a": 1}


def test_structured_from_assistant_text_only_when_a_schema_was_asked_for() -> None:
    lines = [INIT, assistant({"type": "text", "text": 'Here:\n```json\n{"a": 1}\n```'}), result(result="x")]
    (value,) = structured_values(translate(lines, claude_code(output_schema={"type": "object"})))
    assert value["object"] == {"a": 1} and value["raw"] == 'Here:\n```json\n{"a": 1}\n```'
    assert structured_values(translate(lines)) == []
    from_result = [INIT, result(result='{"b": 2}')]
    (value,) = structured_values(translate(from_result, claude_code(output_schema={"type": "object"})))
    assert value["object"] == {"b": 2}


def test_structured_field_wins_and_nothing_without_any_object() -> None:
    lines = [INIT, assistant({"type": "text", "text": '{"text": 1}'}), result(structured_output={"field": 1})]
    (value,) = structured_values(translate(lines, claude_code(output_schema={"type": "object"})))
    assert value["object"] == {"field": 1}
    none = [INIT, assistant({"type": "text", "text": "no json here"}), result(result="no json")]
    assert structured_values(translate(none, claude_code(output_schema={"type": "object"}))) == []


# ==================================================================================================
# plan


def argv(command: str) -> list[str]:
    return shlex.split(command)


def test_default_argv_shape_and_prompt_on_stdin() -> None:
    plan = claude_code().plan(make_ctx(prompt="do it"))
    assert argv(plan.command) == [
        "exec",
        "claude",
        "--setting-sources",
        "user,project",
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--include-partial-messages",
        "--permission-mode",
        "bypassPermissions",
    ]
    assert plan.stdin == "do it" and plan.files == {} and list(plan.secrets) == []
    assert "--bare" not in plan.command


def test_every_option_in_order() -> None:
    harness = claude_code(
        "claude-sonnet-4-5",
        executable="npx -y @anthropic-ai/claude-code",
        permission_mode="acceptEdits",
        allowed_tools=["Bash", "Read"],
        disallowed_tools=["WebFetch"],
        max_turns=3,
        add_dirs=["/data", "/more"],
        output_schema={"type": "object", "properties": {"summary": {"type": "string"}}},
    )
    ctx = make_ctx(
        session_id="sess-1",
        system_prompt="Be brief.",
        bridge=BridgeConfig("http://10.0.0.1:9000/mcp", "secret-token"),
        policy=define_sandbox_policy(allow=["Read", "Grep"], deny=["Task"]),
    )
    plan = harness.plan(ctx)
    schema = '{"type":"object","properties":{"summary":{"type":"string"}}}'
    assert argv(plan.command) == [
        "exec",
        "npx",
        "-y",
        "@anthropic-ai/claude-code",
        "--setting-sources",
        "user,project",
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--model",
        "claude-sonnet-4-5",
        "--include-partial-messages",
        "--resume",
        "sess-1",
        "--permission-mode",
        "acceptEdits",
        "--max-turns",
        "3",
        "--add-dir",
        "/data",
        "--add-dir",
        "/more",
        "--allowedTools",
        "Bash,Read,Grep,mcp__boxwright",
        "--disallowedTools",
        "WebFetch,Task",
        "--append-system-prompt",
        "Be brief.",
        "--mcp-config",
        "/tmp/boxwright-mcp-r7.json",
        "--permission-prompt-tool",
        "mcp__boxwright__approval_prompt",
        "--json-schema",
        schema,
    ]
    # T4: inline schema, no schema file; the prompt carries the instruction and the schema too.
    assert list(plan.files) == ["/tmp/boxwright-mcp-r7.json"]
    assert plan.stdin is not None and plan.stdin.startswith("hello\n\n") and plan.stdin.endswith(schema)
    assert "JSON" in plan.stdin


def test_replace_mode_partials_off_and_blank_system_prompt() -> None:
    plan = claude_code(system_prompt_mode="replace", include_partial_messages=False).plan(
        make_ctx(system_prompt="You are X.")
    )
    args = argv(plan.command)
    assert args[args.index("--system-prompt") + 1] == "You are X."
    assert "--append-system-prompt" not in args and "--include-partial-messages" not in args
    blank = argv(claude_code().plan(make_ctx(system_prompt="  \n ")).command)
    assert "--append-system-prompt" not in blank and "--system-prompt" not in blank


def test_bridge_config_file_secret_and_whole_server_allowed() -> None:
    bridge = BridgeConfig("http://host.docker.internal:4567/mcp", "tok-" + "z" * 40)
    plan = claude_code().plan(make_ctx(bridge=bridge, file_suffix="run-enc"))
    path = "/tmp/boxwright-mcp-run-enc.json"
    assert json.loads(plan.files[path]) == {
        "mcpServers": {
            "boxwright": {
                "type": "http",
                "url": "http://host.docker.internal:4567/mcp",
                "headers": {"Authorization": f"Bearer {bridge.token}"},
            }
        }
    }
    assert bridge.token in plan.secrets and bridge.token not in plan.command
    args = argv(plan.command)
    assert args[args.index("--mcp-config") + 1] == path
    assert args[args.index("--allowedTools") + 1] == "mcp__boxwright"


HOSTILE = [
    "it's a 'test'",
    '"; rm -rf / #',
    "$(touch pwned) `touch pwned2` ${HOME}",
    "line one\nline two\n\ttab \\ backslash",
    "-p --dangerously-skip-permissions",
]

ECHO_ARGS = """
import json, sys
with open(sys.argv[1], "w") as out:
    json.dump({"argv": sys.argv[2:], "stdin": sys.stdin.read()}, out)
"""


def run_plan(tmp_path: Path, harness_args: dict[str, Any], **ctx_fields: Any) -> tuple[dict[str, Any], Any]:
    """Run the planned command in a real ``sh -c`` with a stand-in executable that records argv and stdin."""
    script = tmp_path / "echo_args.py"
    script.write_text(ECHO_ARGS)
    report = tmp_path / "report.json"
    harness = claude_code(executable=f"{sys.executable} {script} {report}", **harness_args)
    plan = harness.plan(make_ctx(cwd=str(tmp_path), file_suffix=f"test-{os.getpid()}-{tmp_path.name}", **ctx_fields))
    written = []
    try:
        for path, content in plan.files.items():
            Path(path).write_text(content)
            written.append(path)
        subprocess.run(["sh", "-c", plan.command], cwd=tmp_path, input=plan.stdin or "", text=True, check=True)
    finally:
        for path in written:
            os.unlink(path)
    return json.loads(report.read_text()), plan


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_values_reach_the_cli_verbatim_through_a_real_shell(tmp_path: Path, hostile: str) -> None:
    seen, _ = run_plan(
        tmp_path,
        {"model": hostile, "add_dirs": [hostile], "allowed_tools": [hostile]},
        prompt=hostile,
        system_prompt=hostile,
        session_id=hostile,
    )
    args = seen["argv"]
    for flag in ("--model", "--resume", "--add-dir", "--allowedTools"):
        assert args[args.index(flag) + 1] == hostile
    assert args[args.index("--append-system-prompt") + 1] == hostile.strip()
    assert seen["stdin"] == hostile
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


def test_prompt_goes_through_a_file_without_writable_stdin(tmp_path: Path) -> None:
    prompt = HOSTILE[2] + "\n" + HOSTILE[0]
    schema = {"type": "object", "required": ["a"]}
    seen, plan = run_plan(tmp_path, {"output_schema": schema}, prompt=prompt, capabilities=caps(writable_stdin=False))
    assert plan.stdin is None
    (prompt_path,) = [p for p in plan.files if p.startswith("/tmp/boxwright-claude-prompt-")]
    assert plan.command.endswith(f"< '{prompt_path}'")
    assert seen["stdin"] == plan.files[prompt_path]
    assert seen["stdin"].startswith(prompt + "\n\n") and seen["stdin"].endswith(
        json.dumps(schema, separators=(",", ":"))
    )
    assert not (tmp_path / "pwned").exists()


HOST_ENV = {
    "ANTHROPIC_API_KEY": "sk-host",
    "ANTHROPIC_AUTH_TOKEN": "tok-host",
    "ANTHROPIC_BASE_URL": "http://127.0.0.1:18100",
    "OPENAI_API_KEY": "not-for-claude",
    "PATH": "/usr/bin",
}


def test_env_in_api_key_mode() -> None:
    """T5: the host key reaches the CLI in api-key mode."""
    plan = claude_code().plan(make_ctx(host_env=HOST_ENV))
    assert plan.env == {
        "ANTHROPIC_API_KEY": "sk-host",
        "ANTHROPIC_AUTH_TOKEN": "tok-host",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:18100",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "IS_SANDBOX": "1",
        "CLAUDE_CODE_SANDBOXED": "1",
    }
    assert {"sk-host", "tok-host"} <= set(plan.secrets)


def test_env_in_host_mode_and_mode_precedence() -> None:
    """T5: host mode injects no key; the per-call mode beats the config."""
    host = claude_code(auth_mode="host").plan(make_ctx(host_env=HOST_ENV)).env
    assert "ANTHROPIC_API_KEY" not in host and "ANTHROPIC_AUTH_TOKEN" not in host
    assert host["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:18100"
    per_call = claude_code(auth_mode="host").plan(make_ctx(host_env=HOST_ENV, auth_mode="api-key")).env
    assert per_call["ANTHROPIC_API_KEY"] == "sk-host"
    assert "ANTHROPIC_API_KEY" not in claude_code().plan(make_ctx(host_env=HOST_ENV, auth_mode="host")).env


def test_config_env_comes_last_and_empty_host_values_are_not_passed() -> None:
    harness = claude_code(env={"DISABLE_TELEMETRY": "0", "CLAUDE_CODE_MAX_RETRIES": "0"})
    env = harness.plan(make_ctx(host_env={"ANTHROPIC_API_KEY": "", "ANTHROPIC_BASE_URL": ""})).env
    assert env["DISABLE_TELEMETRY"] == "0" and env["CLAUDE_CODE_MAX_RETRIES"] == "0"
    assert "ANTHROPIC_API_KEY" not in env and "ANTHROPIC_BASE_URL" not in env


def test_is_sandbox_everywhere_but_local_process_unless_root_bypass(monkeypatch: pytest.MonkeyPatch) -> None:
    """T6, narrowed: local-process gets IS_SANDBOX only when bypassPermissions as root needs it."""
    for provider in ("docker", "bubblewrap", "e2b"):
        env = claude_code(permission_mode="acceptEdits").plan(make_ctx(provider=provider)).env
        assert env["IS_SANDBOX"] == "1" and env["CLAUDE_CODE_SANDBOXED"] == "1"
    local = claude_code(permission_mode="acceptEdits").plan(make_ctx(provider="local-process")).env
    assert "IS_SANDBOX" not in local and "CLAUDE_CODE_SANDBOXED" not in local
    monkeypatch.setattr(cc, "_host_is_root", lambda: True)
    root = claude_code().plan(make_ctx(provider="local-process")).env
    assert root["IS_SANDBOX"] == "1" and root["CLAUDE_CODE_SANDBOXED"] == "1"
    monkeypatch.setattr(cc, "_host_is_root", lambda: False)
    assert "IS_SANDBOX" not in claude_code().plan(make_ctx(provider="local-process")).env


def test_host_is_root_reads_the_real_euid() -> None:
    assert cc._host_is_root() is (os.geteuid() == 0)


def test_local_process_without_home_uses_userprofile() -> None:
    env = claude_code().plan(make_ctx(provider="local-process", host_env={"USERPROFILE": "C:/Users/me"})).env
    assert env["HOME"] == "C:/Users/me"
    assert "HOME" not in claude_code().plan(make_ctx(provider="local-process", host_env={"HOME": "/root"})).env
    assert "HOME" not in claude_code().plan(make_ctx(provider="docker", host_env={"USERPROFILE": "x"})).env


@pytest.mark.parametrize(
    ("policy_args", "mode", "allowed", "disallowed"),
    [
        ({"default": "allow"}, "bypassPermissions", None, None),
        ({"default": "ask"}, "acceptEdits", None, None),
        ({"default": "deny"}, "default", None, None),
        ({"file_write": "deny"}, "bypassPermissions", None, "Write,Edit,MultiEdit"),
        ({"network": "deny"}, "bypassPermissions", None, "WebFetch,WebSearch"),
        (
            {"default": "ask", "allow": ["Read", "git *"], "deny": ["Bash", "rm -rf *"], "file_write": "deny"},
            "acceptEdits",
            "Read",
            "Write,Edit,MultiEdit,Bash",
        ),
    ],
)
def test_policy_maps_to_mode_and_tool_lists(
    policy_args: dict[str, Any], mode: str, allowed: str | None, disallowed: str | None
) -> None:
    """T19."""
    args = argv(claude_code().plan(make_ctx(policy=define_sandbox_policy(**policy_args))).command)
    assert args[args.index("--permission-mode") + 1] == mode
    assert (args[args.index("--allowedTools") + 1] if "--allowedTools" in args else None) == allowed
    assert (args[args.index("--disallowedTools") + 1] if "--disallowedTools" in args else None) == disallowed


def test_config_mode_beats_policy_and_lists_are_a_deduplicated_union() -> None:
    harness = claude_code(permission_mode="plan", allowed_tools=["Read", "Bash"], disallowed_tools=["Write"])
    policy = define_sandbox_policy(default="deny", allow=["Read"], file_write="deny")
    args = argv(harness.plan(make_ctx(policy=policy)).command)
    assert args[args.index("--permission-mode") + 1] == "plan"
    assert args[args.index("--allowedTools") + 1] == "Read,Bash"
    assert args[args.index("--disallowedTools") + 1] == "Write,Edit,MultiEdit"


def test_file_suffix_falls_back_to_a_safe_hash_of_the_run_id() -> None:
    """T20: hostile run ids give one bounded, distinct, consistent name segment."""
    names = []
    for run_id in ("../../etc/passwd", "a b'c", "x" * 5000, "r\udcff"):
        plan = claude_code().plan(
            make_ctx(run_id=run_id, file_suffix="", capabilities=caps(writable_stdin=False), gen_id=lambda: "x")
        )
        (path,) = plan.files
        again = claude_code().plan(
            make_ctx(run_id=run_id, file_suffix="", capabilities=caps(writable_stdin=False), gen_id=lambda: "x")
        )
        assert list(again.files) == [path]
        segment = path.removeprefix("/tmp/boxwright-claude-prompt-")
        assert segment.isalnum() and len(segment) <= 32
        names.append(path)
    assert len(set(names)) == len(names)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"executable": "  "},
        {"max_turns": 0},
        {"max_turns": True},
        {"system_prompt_mode": "prepend"},
        {"allowed_tools": "Bash"},
        {"add_dirs": "/data"},
        {"output_schema": "{}"},
        {"auth_mode": "oauth"},
    ],
)
def test_bad_config_is_refused_at_construction(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        claude_code(**kwargs)


def test_name() -> None:
    assert claude_code().name == "claude-code"


# ==================================================================================================
# file.changed after the run (R20)


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True)


def test_diff_events_from_a_real_repository(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@example.com")
    git(tmp_path, "config", "user.name", "t")
    (tmp_path / "a.txt").write_text("one\n")
    git(tmp_path, "add", "a.txt")
    git(tmp_path, "commit", "-q", "-m", "init")
    harness = claude_code()
    ctx = make_ctx(cwd=str(tmp_path))
    command = harness.diff_command(ctx)
    assert command is not None

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-c", command], capture_output=True, text=True)

    clean = run()
    assert harness.diff_events(ctx, clean.returncode, clean.stdout) == []
    (tmp_path / "a.txt").write_text("two\n")
    dirty = run()
    (event,) = harness.diff_events(ctx, dirty.returncode, dirty.stdout)
    assert isinstance(event, CustomEvent) and event.name == "file.changed"
    assert event.value["path"] == "." and "+two" in event.value["diff"] and "-one" in event.value["diff"]
    assert (event.value["threadId"], event.value["runId"]) == ("t1", "r7")
    assert harness.diff_events(ctx, 128, "fatal: not a git repository") == []
    assert claude_code(emit_diff=False).diff_command(ctx) is None


# ==================================================================================================
# the real CLI, when this machine has it


def test_real_claude_runs_the_plan_and_the_translator_reads_it(tmp_path: Path) -> None:
    """The plan against the real binary: settings sources, bypassPermissions as root, MCP bridge, prompt file."""
    claude = find_claude()
    if claude is None:
        missing("the claude CLI is not installed (set BOXWRIGHT_CLAUDE_BIN or install @anthropic-ai/claude-code)")
    from tests.fixtures.fake_model import FakeModelServer, Step, Text, ToolCall
    from tests.fixtures.record_claude import McpToolServer

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    script: list[Step] = [
        ToolCall("Bash", {"command": "echo hi > f.txt", "description": "write f.txt"}),
        ToolCall("mcp__boxwright__get_fact", {"topic": "otters"}),
        Text("Done."),
    ]
    with McpToolServer("tok-unit") as mcp, FakeModelServer({"e2e": script}) as server:
        host_env = claude_env(home, server.base_url)
        ctx = make_ctx(
            prompt="[[script:e2e]] go",
            system_prompt="Be terse.",
            capabilities=caps(writable_stdin=False),
            provider="local-process",
            cwd=str(cwd),
            bridge=BridgeConfig(mcp.url, "tok-unit"),
            host_env=host_env,
            file_suffix=f"unit-{os.getpid()}-{tmp_path.name}",
        )
        harness = claude_code("claude-sonnet-4-5", executable=claude)
        plan = harness.plan(ctx)
        for path, content in plan.files.items():
            Path(path).write_text(content)
        try:
            proc = subprocess.run(
                ["sh", "-c", plan.command],
                cwd=cwd,
                env={**host_env, **plan.env},
                input=plan.stdin,
                capture_output=True,
                text=True,
                timeout=60,
            )
        finally:
            for path in plan.files:
                os.unlink(path)
        translator = harness.translator(ctx)
        events = [e for raw in proc.stdout.splitlines() for e in translator.feed(raw)]
        events += translator.finish(proc.returncode, proc.stderr)
    check_well_formed(events)
    assert proc.returncode == 0, proc.stderr
    assert (cwd / "f.txt").read_text() == "hi\n"
    assert [c["name"] for c in mcp.calls] == ["get_fact"] and "Bearer tok-unit" in mcp.auth_headers
    assert [e.tool_call_name for e in only(events, ToolCallStartEvent)] == ["Bash", "get_fact"]
    assert "otters" in str(only(events, ToolCallResultEvent)[1].content)
    assert "".join(e.delta for e in only(events, TextMessageContentEvent)) == "Done."
    assert events[-1].type == "RUN_FINISHED" and translator.skipped_lines == 0


def test_host_auth_unsets_inherited_keys_so_the_cli_login_wins() -> None:
    import subprocess

    from boxwright.providers.local_process import CAPABILITIES as LOCAL

    ctx = HarnessContext(
        run_id="r",
        thread_id="t",
        prompt="hi",
        system_prompt=None,
        capabilities=LOCAL,
        provider="local-process",
        gen_id=lambda: "x",
        host_env={"ANTHROPIC_API_KEY": "sk-host"},
    )
    host = claude_code(executable="env", auth_mode="host").plan(ctx)
    assert "ANTHROPIC_API_KEY" not in host.env
    # Run the planned command line for real (`env` stands in for claude): the inherited key is gone.
    out = subprocess.run(
        ["sh", "-c", host.command.replace(" -p ", " ").split(" --setting-sources")[0]],
        env={"ANTHROPIC_API_KEY": "sk-host", "ANTHROPIC_AUTH_TOKEN": "tok", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    ).stdout
    assert "ANTHROPIC_API_KEY" not in out and "ANTHROPIC_AUTH_TOKEN" not in out and "PATH=" in out
    api = claude_code(executable="env").plan(ctx)
    assert api.env["ANTHROPIC_API_KEY"] == "sk-host" and not api.command.startswith("unset")


def test_the_policy_prompt_tool_allows_denies_and_asks() -> None:
    import json as _json

    from boxwright.harnesses.claude_code import approval_prompt_tool

    asked: list[tuple[str, object]] = []
    policy = define_sandbox_policy(default="ask", allow=["echo *"], deny=["rm *"], file_write="allow")
    decide = approval_prompt_tool(policy, emit=lambda name, value: asked.append((name, value))).execute

    def verdict(tool_name: str, tool_input: dict[str, object]) -> dict[str, object]:
        return _json.loads(decide({"tool_name": tool_name, "input": tool_input, "tool_use_id": "t"}, None))

    assert verdict("Bash", {"command": "echo hi"}) == {"behavior": "allow", "updatedInput": {"command": "echo hi"}}
    denied = verdict("Bash", {"command": "rm -rf /"})
    assert denied["behavior"] == "deny" and "denied by the sandbox policy" in str(denied["message"])
    assert verdict("Write", {"file_path": "a"})["behavior"] == "allow"  # fileWrite capability rule
    waiting = verdict("Bash", {"command": "make deploy"})
    assert waiting["behavior"] == "deny" and "needs approval" in str(waiting["message"])
    assert asked == [
        (
            "approval-requested",
            {
                "approvalId": "claude-code:command:make deploy",
                "title": "Approve Bash: make deploy",
                "provider": "claude-code",
                "toolName": "Bash",
            },
        )
    ]
    granted = approval_prompt_tool(policy, approvals={"claude-code:command:make deploy": True}).execute
    assert _json.loads(granted({"tool_name": "Bash", "input": {"command": "make deploy"}}, None))["behavior"] == "allow"


def test_no_prompt_tool_without_rules_or_under_bypass() -> None:
    harness = claude_code()
    assert harness.permission_tool(None) is None
    assert harness.permission_tool(define_sandbox_policy(default="allow")) is None
    assert harness.permission_tool(define_sandbox_policy(deny=["rm *"]), "bypassPermissions") is None
    assert harness.permission_tool(define_sandbox_policy(deny=["rm *"])) is not None
