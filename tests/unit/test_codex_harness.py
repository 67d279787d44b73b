"""The Codex harness: its plan (argv, env, files) and its translator, fed the real CLI's recorded output."""

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
from boxwright.harnesses.codex import BRIDGE_TOKEN_ENV, codex
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

RECORDINGS = FIXTURES / "codex"
THREAD = "00000000-0000-4000-8000-000000000001"
BRIDGE = BridgeConfig(url="http://127.0.0.1:9/mcp/r7", token="tok-secret-123")


def lines(name: str) -> list[str]:
    return recording(RECORDINGS, name)


# -- translation of the recordings ----------------------------------------------------------------


def test_text_recording_is_one_message_and_a_finish_with_usage() -> None:
    events = replay(codex(), lines("text"))
    check_well_formed(events)
    assert kinds(events) == ["RUN_STARTED", "CUSTOM", *TEXT3, "RUN_FINISHED"]
    session = events[1]
    assert isinstance(session, CustomEvent) and session.value == {"sessionId": THREAD}
    assert events[3].delta == "Hello from the fake model."  # type: ignore[union-attr]
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent) and finished.finish_reason == "stop" and finished.usage
    usage = finished.usage[0]
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (24, 7, 31)
    assert usage.cached_input_tokens == 0 and usage.reasoning_tokens == 0


def test_reasoning_recording_is_five_reasoning_events_then_text() -> None:
    events = replay(codex(), lines("thinking"))
    check_well_formed(events)
    assert kinds(events) == ["RUN_STARTED", "CUSTOM", *REASONING5, *TEXT3, "RUN_FINISHED"]
    reasoning = next(e for e in events if isinstance(e, ReasoningMessageContentEvent))
    assert reasoning.delta == "The user wants 2+2. That is 4."


def test_shell_recording_is_a_tool_quadruple_with_the_command_and_its_exit_code() -> None:
    events = replay(codex(), lines("bash"))
    check_well_formed(events)
    assert kinds(events) == ["RUN_STARTED", "CUSTOM", *TOOL_QUAD, *TEXT3, "RUN_FINISHED"]
    start = next(e for e in events if isinstance(e, ToolCallStartEvent))
    assert start.tool_call_name == "command_execution" and start.tool_call_id == "item_0"
    args = next(e for e in events if isinstance(e, ToolCallArgsEvent))
    assert "echo hi > f.txt" in json.loads(args.delta)["command"]
    result = next(e for e in events if isinstance(e, ToolCallResultEvent))
    assert json.loads(str(result.content)) == {"aggregated_output": "", "status": "completed", "exit_code": 0}
    assert result.state is None and result.message_id == "r7-0"


def test_file_edit_recording_is_a_file_change_call_with_its_changes() -> None:
    events = replay(codex(), lines("edit"))
    check_well_formed(events)
    start = next(e for e in events if isinstance(e, ToolCallStartEvent))
    assert start.tool_call_name == "file_change"
    result = next(e for e in events if isinstance(e, ToolCallResultEvent))
    content = json.loads(str(result.content))
    assert content["status"] == "completed" and content["changes"][0]["kind"] == "update"
    assert content["changes"][0]["path"].endswith("README.md")


def test_mcp_recording_strips_the_bridge_server_and_keeps_the_tools_text() -> None:
    events = replay(codex(), lines("mcp"), bridge=BRIDGE)
    check_well_formed(events)
    start = next(e for e in events if isinstance(e, ToolCallStartEvent))
    assert start.tool_call_name == "get_todos"
    result = next(e for e in events if isinstance(e, ToolCallResultEvent))
    assert json.loads(str(result.content)) == [{"id": 1, "title": "write the report"}]


def test_mcp_call_on_another_server_keeps_its_server_in_the_name() -> None:
    other = [line.replace('"server":"boxwright"', '"server":"github"') for line in lines("mcp")]
    events = replay(codex(), other, bridge=BRIDGE)
    assert next(e for e in events if isinstance(e, ToolCallStartEvent)).tool_call_name == "mcp__github__get_todos"


def test_error_recording_is_one_run_error_with_the_apis_message() -> None:
    events = replay(codex(), lines("error"), exit_code=1)
    check_well_formed(events)
    assert kinds(events) == ["RUN_STARTED", "CUSTOM", "RUN_ERROR"]
    error = events[-1]
    assert isinstance(error, RunErrorEvent) and "scripted bad request" in error.message
    assert error.code == "turn_failed"


def test_cancelled_recording_ends_with_an_exit_error_on_finish() -> None:
    events = replay(codex(), lines("cancelled"), exit_code=137)
    check_well_formed(events)
    assert kinds(events) == ["RUN_STARTED", "CUSTOM", "RUN_ERROR"]
    assert events[-1].code == "exit_code_137"  # type: ignore[union-attr]


def test_a_call_cut_off_mid_run_gets_an_interrupted_result() -> None:
    cut = lines("bash")[:3]  # item.started of the command, then the process dies
    events = replay(codex(), cut, exit_code=137)
    check_well_formed(events)
    result = next(e for e in events if isinstance(e, ToolCallResultEvent))
    assert result.content == INTERRUPTED and result.state == "output-error"


def test_retry_notices_are_not_terminal_and_name_the_cause_when_codex_dies() -> None:
    notice = json.dumps({"type": "error", "message": "Reconnecting... 1/5 (Connection failed)"})
    events = replay(codex(), [lines("text")[0], notice], exit_code=1)
    check_well_formed(events)
    assert "Reconnecting" in events[-1].message  # type: ignore[union-attr]


def test_updated_messages_stream_their_new_suffix_once() -> None:
    stream = [
        '{"type":"thread.started","thread_id":"th-1"}',
        '{"type":"item.updated","item":{"id":"m1","type":"agent_message","text":"Hel"}}',
        '{"type":"item.completed","item":{"id":"m1","type":"agent_message","text":"Hello"}}',
        '{"type":"turn.completed","usage":{"input_tokens":10,"cached_input_tokens":4,"output_tokens":3}}',
    ]
    events = replay(codex(), stream)
    check_well_formed(events)
    assert [e.delta for e in events if isinstance(e, TextMessageContentEvent)] == ["Hel", "lo"]
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent) and finished.usage
    assert finished.usage[0].cached_input_tokens == 4 and finished.usage[0].total_tokens == 13


def test_garbage_lines_are_skipped_and_counted() -> None:
    translator = codex().translator(make_ctx())
    assert translator.feed("not json") == [] and translator.feed("[1]") == []
    assert translator.skipped_lines == 2


# -- the plan ----------------------------------------------------------------------------------------


def argv(command: str) -> list[str]:
    return shlex.split(command)


def test_plan_runs_exec_json_with_the_prompt_on_stdin_and_no_token_in_argv() -> None:
    plan = codex("gpt-5.5", base_url="http://127.0.0.1:1/v1", max_retries=0).plan(
        make_ctx(bridge=BRIDGE, prompt="do it", system_prompt="be brief")
    )
    words = argv(plan.command)
    assert words[:4] == ["exec", "codex", "exec", "--json"] and words[-1] == "-"
    assert words[words.index("--model") + 1] == "gpt-5.5"
    assert words[words.index("--sandbox") + 1] == "workspace-write"  # local-process: codex's own sandbox holds
    configs = [words[i + 1] for i, w in enumerate(words) if w == "-c"]
    assert 'approval_policy="never"' in configs
    assert 'mcp_servers.boxwright.url="http://127.0.0.1:9/mcp/r7"' in configs
    assert f'mcp_servers.boxwright.bearer_token_env_var="{BRIDGE_TOKEN_ENV}"' in configs
    assert 'mcp_servers.boxwright.default_tools_approval_mode="approve"' in configs  # decision 10
    assert 'model_provider="boxwright"' in configs
    provider = next(c for c in configs if c.startswith("model_providers.boxwright="))
    assert '"wire_api" = "responses"' in provider and '"request_max_retries" = 0' in provider
    assert "tok-secret-123" not in plan.command and plan.env[BRIDGE_TOKEN_ENV] == "tok-secret-123"
    assert "tok-secret-123" in plan.secrets
    assert plan.stdin == "be brief\n\ndo it" and plan.files == {}


def test_inner_sandbox_gives_way_to_ours_outside_local_process() -> None:
    for provider in ("bubblewrap", "docker"):
        words = argv(codex().plan(make_ctx(provider=provider)).command)
        assert words[words.index("--sandbox") + 1] == "danger-full-access"
    words = argv(codex(sandbox_mode="read-only").plan(make_ctx(provider="docker")).command)
    assert words[words.index("--sandbox") + 1] == "read-only"


def test_policy_maps_to_sandbox_and_approval() -> None:
    policy = define_sandbox_policy(file_write="deny", network="deny", default="ask")
    words = argv(codex().plan(make_ctx(policy=policy)).command)
    assert words[words.index("--sandbox") + 1] == "read-only"
    configs = [words[i + 1] for i, w in enumerate(words) if w == "-c"]
    assert "sandbox_workspace_write.network_access=false" in configs
    assert 'approval_policy="on-request"' in configs  # an ask default


def test_a_deny_default_asks_for_on_request_as_codex_refuses_untrusted() -> None:
    words = argv(codex().plan(make_ctx(policy=define_sandbox_policy(default="deny"))).command)
    assert 'approval_policy="on-request"' in words and 'approval_policy="untrusted"' not in words
    words = argv(codex(approval_policy="untrusted").plan(make_ctx()).command)
    assert 'approval_policy="untrusted"' in words  # explicit wins, even where codex will refuse it


def test_resume_names_the_thread_before_the_stdin_prompt() -> None:
    words = argv(codex().plan(make_ctx(session_id="th-9")).command)
    assert words[-3:] == ["resume", "th-9", "-"]


def test_without_writable_stdin_the_prompt_goes_through_a_file() -> None:
    plan = codex().plan(make_ctx(capabilities=caps(writable_stdin=False), file_suffix="abc"))
    assert plan.stdin is None and plan.files == {"/tmp/boxwright-codex-prompt-abc": "hello"}
    assert argv(plan.command)[-3:] == ["-", "<", "/tmp/boxwright-codex-prompt-abc"]


def test_api_key_mode_passes_codex_api_key_and_host_mode_scrubs_it() -> None:
    plan = codex().plan(make_ctx(host_env={"CODEX_API_KEY": "sk-1", "OPENAI_BASE_URL": "http://x/v1"}))
    assert plan.env["CODEX_API_KEY"] == "sk-1" and "sk-1" in plan.secrets
    assert "model_providers.boxwright=" in plan.command  # the host's OPENAI_BASE_URL, which codex ignores
    host = codex(auth_mode="host").plan(make_ctx(host_env={"CODEX_API_KEY": "sk-1"}))
    assert "CODEX_API_KEY" not in host.env and host.command.startswith("unset CODEX_API_KEY; ")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"executable": " "}, "executable"),
        ({"sandbox_mode": "yolo"}, "sandbox_mode"),
        ({"max_retries": -1}, "max_retries"),
        ({"add_dirs": "/x"}, "add_dirs"),
    ],
)
def test_bad_options_are_refused_when_built(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        codex(**kwargs)  # type: ignore[arg-type]
