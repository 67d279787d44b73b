"""The OpenCode harness: its plan (argv, env, config) and its translator, fed the real CLI's recorded output."""

from __future__ import annotations

import json
import shlex

import pytest

from boxwright.events import (
    CustomEvent,
    ReasoningMessageContentEvent,
    RunErrorEvent,
    RunFinishedEvent,
    TextMessageContentEvent,
    ToolCallArgsEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from boxwright.harnesses.base import INTERRUPTED, BridgeConfig
from boxwright.harnesses.opencode import opencode, permission_rules
from boxwright.policy import define_sandbox_policy
from tests.fixtures import FIXTURES
from tests.support.harness_replay import (
    REASONING5,
    TEXT3,
    TOOL_QUAD,
    caps,
    check_well_formed,
    kinds,
    make_ctx,
    recording,
    replay,
)

RECORDINGS = FIXTURES / "opencode"
SESSION = "ses_00000000000000000000000001"
BRIDGE = BridgeConfig(url="http://127.0.0.1:9/mcp/r7", token="tok-secret-123")
POLICY = define_sandbox_policy(allow=["echo *"], deny=["rm *"], default="ask")


def lines(name: str) -> list[str]:
    return recording(RECORDINGS, name)


# -- translation of the recordings ----------------------------------------------------------------


def test_text_recording_is_one_message_and_a_finish_with_usage() -> None:
    events = replay(opencode(), lines("text"))
    check_well_formed(events)
    assert kinds(events) == ["RUN_STARTED", "CUSTOM", *TEXT3, "RUN_FINISHED"]
    session = events[1]
    assert isinstance(session, CustomEvent) and session.name == "opencode.session-id"
    assert session.value == {"sessionId": SESSION}
    assert events[3].delta == "Hello from the fake model."  # type: ignore[union-attr]
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent) and finished.finish_reason == "stop" and finished.usage
    usage = finished.usage[0]
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (24, 7, 31)


def test_reasoning_recording_is_five_reasoning_events_then_text() -> None:
    events = replay(opencode(), lines("thinking"))
    check_well_formed(events)
    assert kinds(events) == ["RUN_STARTED", "CUSTOM", *REASONING5, *TEXT3, "RUN_FINISHED"]
    reasoning = next(e for e in events if isinstance(e, ReasoningMessageContentEvent))
    assert reasoning.delta == "The user wants 2+2. That is 4."


def test_shell_recording_is_a_tool_quadruple_and_usage_sums_the_steps() -> None:
    events = replay(opencode(), lines("bash"))
    check_well_formed(events)
    assert kinds(events) == ["RUN_STARTED", "CUSTOM", *TOOL_QUAD, *TEXT3, "RUN_FINISHED"]
    start = next(e for e in events if isinstance(e, ToolCallStartEvent))
    assert start.tool_call_name == "bash"
    args = json.loads(next(e for e in events if isinstance(e, ToolCallArgsEvent)).delta)
    assert args["command"] == "echo hi > f.txt"
    result = next(e for e in events if isinstance(e, ToolCallResultEvent))
    assert result.content == "(no output)" and result.state is None and result.message_id == "r7-0"
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent) and finished.usage
    assert finished.usage[0].input_tokens == 48  # two steps of 24


def test_file_edit_recording_is_an_edit_call_with_its_file() -> None:
    events = replay(opencode(), lines("edit"))
    check_well_formed(events)
    start = next(e for e in events if isinstance(e, ToolCallStartEvent))
    assert start.tool_call_name == "edit"
    args = json.loads(next(e for e in events if isinstance(e, ToolCallArgsEvent)).delta)
    assert args["filePath"] == "README.md" and args["newString"] == "hello from opencode"
    result = next(e for e in events if isinstance(e, ToolCallResultEvent))
    assert "applied" in str(result.content) and result.state is None


def test_mcp_recording_strips_the_bridge_prefix() -> None:
    events = replay(opencode(), lines("mcp"), bridge=BRIDGE)
    check_well_formed(events)
    start = next(e for e in events if isinstance(e, ToolCallStartEvent))
    assert start.tool_call_name == "get_todos"
    result = next(e for e in events if isinstance(e, ToolCallResultEvent))
    assert json.loads(str(result.content)) == [{"id": 1, "title": "write the report"}]


def test_error_recording_is_one_run_error_with_the_apis_message() -> None:
    events = replay(opencode(), lines("error"), exit_code=1)
    check_well_formed(events)
    assert kinds(events) == ["RUN_STARTED", "CUSTOM", "RUN_ERROR"]
    error = events[-1]
    assert isinstance(error, RunErrorEvent) and error.message == "scripted bad request" and error.code == "APIError"


def test_cancelled_recording_ends_with_an_exit_error_on_finish() -> None:
    events = replay(opencode(), lines("cancelled"), exit_code=137)
    check_well_formed(events)
    assert kinds(events)[-1] == "RUN_ERROR" and events[-1].code == "exit_code_137"  # type: ignore[union-attr]


def test_policy_recording_gives_allow_deny_and_an_approval_request() -> None:
    events = replay(opencode(), lines("policy"), policy=POLICY)
    check_well_formed(events)
    results = {
        json.loads(
            next(a.delta for a in events if isinstance(a, ToolCallArgsEvent) and a.tool_call_id == r.tool_call_id)
        )["command"]: r
        for r in events
        if isinstance(r, ToolCallResultEvent)
    }
    assert results["echo allowed"].state is None and results["echo allowed"].content == "allowed\n"
    assert results["rm -f nothing"].state == "output-error" and "rule" in str(results["rm -f nothing"].content)
    assert results["ls"].state == "output-error"
    approvals = [e for e in events if isinstance(e, CustomEvent) and e.name == "approval-requested"]
    assert [a.value["approvalId"] for a in approvals] == ["opencode:command:ls"]
    assert approvals[0].value["title"] == "Approve bash: ls"


def test_a_call_cut_off_mid_run_gets_an_interrupted_result() -> None:
    pending = {
        "type": "tool_use",
        "sessionID": "s",
        "part": {"type": "tool", "tool": "bash", "callID": "c1", "state": {"status": "running", "input": {}}},
    }
    events = replay(opencode(), [json.dumps(pending)], exit_code=137)
    check_well_formed(events)
    result = next(e for e in events if isinstance(e, ToolCallResultEvent))
    assert result.content == INTERRUPTED and result.state == "output-error"


def test_a_repeated_text_part_is_not_repeated() -> None:
    text = lines("text")
    events = replay(opencode(), [text[0], text[1], text[1], text[2]])
    assert [e.delta for e in events if isinstance(e, TextMessageContentEvent)] == ["Hello from the fake model."]


def test_length_finish_is_reported() -> None:
    text = lines("text")
    events = replay(opencode(), [*text[:2], text[2].replace('"reason":"stop"', '"reason":"length"')])
    assert isinstance(events[-1], RunFinishedEvent) and events[-1].finish_reason == "length"


# -- the plan ----------------------------------------------------------------------------------------


def test_plan_runs_run_format_json_with_the_prompt_on_stdin_and_the_token_only_in_env() -> None:
    plan = opencode("fake/fake-model", config={"model": "fake/fake-model"}).plan(
        make_ctx(bridge=BRIDGE, prompt="do it", system_prompt="be brief", policy=POLICY)
    )
    words = shlex.split(plan.command)
    assert words[:6] == ["exec", "opencode", "run", "--format", "json", "--thinking"]
    assert words[words.index("--model") + 1] == "fake/fake-model"
    assert "tok-secret-123" not in plan.command and "tok-secret-123" in plan.secrets
    content = json.loads(plan.env["OPENCODE_CONFIG_CONTENT"])
    assert content["model"] == "fake/fake-model"
    assert content["mcp"]["boxwright"] == {
        "type": "remote",
        "url": BRIDGE.url,
        "enabled": True,
        "headers": {"Authorization": "Bearer tok-secret-123"},
        "timeout": 60_000,  # the tool list's fetch: OpenCode's own 5 s drops the bridge on a loaded host
    }
    assert list(content["permission"]["bash"].items()) == [("*", "ask"), ("echo *", "allow"), ("rm *", "deny")]
    assert plan.stdin == "be brief\n\ndo it" and plan.env["OPENCODE_DISABLE_AUTOUPDATE"] == "1"


def test_permission_rules_put_the_default_first_and_deny_last() -> None:
    policy = define_sandbox_policy(allow=["git *"], ask=["npm *"], deny=["git push *"], file_write="deny")
    rules = permission_rules(policy)
    assert list(rules["bash"].items()) == [("*", "allow"), ("git *", "allow"), ("npm *", "ask"), ("git push *", "deny")]
    assert rules["edit"] == "deny" and "webfetch" not in rules
    assert permission_rules(None) == {}


def test_resume_passes_the_session_id() -> None:
    words = shlex.split(opencode().plan(make_ctx(session_id="ses_9")).command)
    assert words[words.index("--session") + 1] == "ses_9"


def test_without_writable_stdin_the_prompt_goes_through_a_file() -> None:
    plan = opencode().plan(make_ctx(capabilities=caps(writable_stdin=False), file_suffix="abc"))
    assert plan.stdin is None and plan.files == {"/tmp/boxwright-opencode-prompt-abc": "hello"}
    assert shlex.split(plan.command)[-2:] == ["<", "/tmp/boxwright-opencode-prompt-abc"]


def test_openai_key_is_passed_whatever_the_mode() -> None:
    plan = opencode().plan(make_ctx(host_env={"OPENAI_API_KEY": "sk-1"}, auth_mode="host"))
    assert plan.env["OPENAI_API_KEY"] == "sk-1" and "sk-1" in plan.secrets


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {"executable": " "}, "executable"),
        (("gpt-5",), {}, "provider/model"),
        (("/gpt-5",), {}, "provider/model"),
        ((), {"config": {"x": object()}}, "JSON"),
    ],
)
def test_bad_options_are_refused_when_built(args: tuple[str, ...], kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        opencode(*args, **kwargs)  # type: ignore[arg-type]
