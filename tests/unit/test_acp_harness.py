"""The ACP harness: translation of recorded agent output, the policy's permission answers, and the client
side of the conversation against a small stdio agent (tests/fixtures/fake_acp_agent.py) in a real sandbox."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from boxwright.agent import run_agent
from boxwright.definition import EnsureContext, Lifecycle, define_sandbox
from boxwright.events import (
    CustomEvent,
    Event,
    RunErrorEvent,
    RunFinishedEvent,
    TextMessageContentEvent,
    ToolCallArgsEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    create_run_scoped_id_gen,
)
from boxwright.harnesses.acp import PermissionRequest, SelectedOutcome, acp
from boxwright.harnesses.base import BridgeConfig, HarnessContext
from boxwright.policy import define_sandbox_policy
from boxwright.providers import local_process_sandbox
from boxwright.sandbox import Capabilities
from boxwright.stores.memory import MemoryInstanceStore
from boxwright.workspace import define_workspace

RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "acp"
FAKE_AGENT = Path(__file__).resolve().parents[1] / "fixtures" / "fake_acp_agent.py"
POLICY = define_sandbox_policy(default="ask", allow=["echo *"], deny=["rm *"])


def _ctx(**extra: object) -> HarnessContext:
    return HarnessContext(
        run_id="r7",
        thread_id="t1",
        prompt="hi",
        system_prompt=None,
        capabilities=Capabilities(
            fs=True,
            exec=True,
            env=True,
            ports=True,
            background_processes=True,
            writable_stdin=True,
            killable_processes=True,
            snapshots=False,
            network_policy=False,
            durable_filesystem=True,
            fork=False,
        ),
        provider="local-process",
        gen_id=create_run_scoped_id_gen("r7"),
        **extra,  # type: ignore[arg-type]
    )


def _replay(name: str, agent: str, **extra: object) -> list[Event]:
    translator = acp(["x"], name=agent).translator(_ctx(**extra))
    events: list[Event] = []
    for line in (RECORDINGS / name).read_text().splitlines():
        events += translator.feed(line)
    return events


@pytest.mark.parametrize("agent", ["claude-agent-acp", "codex-acp"])
def test_a_recorded_shell_call_becomes_one_resolved_tool_call_then_text(agent: str) -> None:
    events = _replay(f"{agent}-bash.ndjson", agent)
    types = [e.type for e in events]
    assert types.count("TOOL_CALL_START") == 1 and types.count("TOOL_CALL_END") == 1, types
    order = [types.index(t) for t in ("TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT")]
    assert order == sorted(order)
    start = next(e for e in events if isinstance(e, ToolCallStartEvent))
    assert start.tool_call_name == "execute"
    args = next(e for e in events if isinstance(e, ToolCallArgsEvent)).delta
    assert "echo hi > f.txt" in args
    result = next(e for e in events if isinstance(e, ToolCallResultEvent))
    assert result.tool_call_id == start.tool_call_id and result.state is None and result.message_id == "r7-0"
    text = "".join(e.delta for e in events if isinstance(e, TextMessageContentEvent))
    assert text == "Created f.txt."
    assert types.index("TOOL_CALL_RESULT") < types.index("TEXT_MESSAGE_START")
    # The prompt's response came before our session existed in this replay: no terminal event from feed alone.
    assert "RUN_FINISHED" not in types and "RUN_ERROR" not in types


@pytest.mark.parametrize("agent", ["claude-agent-acp", "codex-acp"])
def test_a_recorded_bridge_call_is_named_by_the_bare_tool(agent: str) -> None:
    bridge = BridgeConfig(url="http://127.0.0.1:18310/mcp", token="tok")
    events = _replay(f"{agent}-mcp.ndjson", agent, bridge=bridge)
    start = next(e for e in events if isinstance(e, ToolCallStartEvent))
    assert start.tool_name == "get_todos"
    result = next(e for e in events if isinstance(e, ToolCallResultEvent))
    assert "write the spec [open]" in result.content and not result.content.startswith("[{")


def test_without_a_bridge_a_foreign_mcp_tool_keeps_its_kind_name() -> None:
    events = _replay("codex-acp-mcp.ndjson", "codex-acp")
    assert next(e for e in events if isinstance(e, ToolCallStartEvent)).tool_name == "tool"


def _requests(name: str) -> list[PermissionRequest]:
    out = []
    for line in (RECORDINGS / name).read_text().splitlines():
        data = json.loads(line)
        if data.get("method") == "session/request_permission":
            out.append(msgspec.convert(data["params"], PermissionRequest))
    return out


@pytest.mark.parametrize("agent", ["claude-agent-acp", "codex-acp"])
def test_the_policy_answers_recorded_permission_requests(agent: str) -> None:
    name = f"{agent}-policy.ndjson"
    translator = acp(["x"], name=agent).translator(_ctx(policy=POLICY))
    lines = (RECORDINGS / name).read_text().splitlines()
    answers = []
    for line in lines:  # the tool_call updates before each request tell its kind (claude-agent-acp omits it there)
        data = json.loads(line)
        if data.get("method") == "session/request_permission":
            events: list[Event] = []
            answers.append(
                (translator.answer_permission(msgspec.convert(data["params"], PermissionRequest), events), events)
            )
        else:
            translator.feed(line)
    assert len(answers) == 2
    (allow, none), (deny, also_none) = answers
    assert isinstance(allow.outcome, SelectedOutcome) and isinstance(deny.outcome, SelectedOutcome)
    options = {o.option_id: o.kind for o in _requests(name)[0].options}
    assert options[allow.outcome.option_id] == "allow_once"
    assert options[deny.outcome.option_id] == "reject_once"
    assert none == [] and also_none == []


def test_an_undecided_ask_is_rejected_and_announced() -> None:
    request = _requests("claude-agent-acp-policy.ndjson")[0]
    request = msgspec.structs.replace(
        request,
        tool_call=msgspec.structs.replace(request.tool_call, kind="execute", raw_input={"command": "touch x"}),
    )
    translator = acp(["x"], name="claude-agent-acp").translator(_ctx(policy=POLICY))
    events: list[Event] = []
    answer = translator.answer_permission(request, events)
    assert isinstance(answer.outcome, SelectedOutcome) and answer.outcome.option_id == "reject"
    assert len(events) == 1 and isinstance(events[0], CustomEvent) and events[0].name == "approval-requested"
    assert events[0].value["approvalId"] == "claude-agent-acp:command:touch x"


def test_no_policy_allows_and_no_matching_option_is_cancelled() -> None:
    request = _requests("claude-agent-acp-policy.ndjson")[0]
    translator = acp(["x"], name="a").translator(_ctx())
    answer = translator.answer_permission(request, [])
    assert isinstance(answer.outcome, SelectedOutcome) and answer.outcome.option_id == "allow"
    only_allow = msgspec.structs.replace(request, options=[o for o in request.options if o.kind.startswith("allow")])
    strict = acp(["x"], name="a").translator(_ctx(policy=define_sandbox_policy(default="deny")))
    assert msgspec.json.encode(strict.answer_permission(only_allow, [])) == b'{"outcome":{"outcome":"cancelled"}}'


def test_unreadable_lines_are_counted_not_fatal() -> None:
    translator = acp(["x"], name="a").translator(_ctx())
    assert translator.feed("not json") == [] and translator.feed("[1,2]") == []
    assert translator.skipped_lines == 2


# -- the conversation, against a real process in a real sandbox -------------------------------------


def _run(
    tmp_path: Path, *flags: str, policy: object = None, session_id: str | None = None
) -> tuple[list[Event], list[dict[str, object]], dict[str, str]]:
    log = tmp_path / "client.ndjson"
    harness = acp([sys.executable, str(FAKE_AGENT), str(log), *flags], name="fake-acp")
    sandbox = define_sandbox(
        "acp",
        local_process_sandbox(base_dir=tmp_path / "sb"),
        define_workspace(setup=["echo hello > README.md"]),
        policy=policy,  # type: ignore[arg-type]
    )
    store = MemoryInstanceStore()

    async def main() -> tuple[list[Event], dict[str, str]]:
        events = [
            e
            async for e in run_agent(
                sandbox, harness, "do the thing", thread_id="t", run_id="r", store=store, session_id=session_id
            )
        ]
        again = await sandbox.ensure_existing(EnsureContext(thread_id="t", run_id="check", store=store))
        files: dict[str, str] = {}
        if again is not None:
            if await again.handle.fs.exists("NOTES.md"):
                files["NOTES.md"] = await again.handle.fs.read("NOTES.md")
            await again.handle.destroy()
        return events, files

    events, files = asyncio.run(asyncio.wait_for(main(), 60))
    sent = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return events, sent, files


def _said(events: list[Event]) -> dict[str, object]:
    text = "".join(e.delta for e in events if isinstance(e, TextMessageContentEvent))
    return json.loads(text)  # type: ignore[no-any-return]


def test_the_client_handshakes_serves_fs_in_the_workspace_and_answers_permissions(tmp_path: Path) -> None:
    events, sent, files = _run(tmp_path, policy=POLICY)
    methods = [m.get("method") for m in sent if "method" in m]
    assert methods == ["initialize", "session/new", "session/prompt"], methods
    init = sent[0]["params"]
    assert init["protocolVersion"] == 1 and init["clientInfo"]["name"] == "boxwright"  # type: ignore[index]
    assert init["clientCapabilities"]["fs"] == {"readTextFile": True, "writeTextFile": True}  # type: ignore[index]
    new = sent[1]["params"]
    assert new["cwd"].startswith(str(tmp_path / "sb")) and new["mcpServers"] == []  # type: ignore[index,union-attr]
    said = _said(events)
    assert said["read"] == {"content": "hello\n"}, "fs/read_text_file read the workspace file"
    assert said["wrote"] is True and files == {"NOTES.md": "noted\n"}, "fs/write_text_file wrote inside the sandbox"
    assert said["outside"] is True, "a path outside the workspace is refused"
    assert said["permission"] == {"outcome": "selected", "optionId": "reject"}, "rm * is denied by the policy"
    result = next(e for e in events if isinstance(e, ToolCallResultEvent))
    assert result.state == "output-error"
    types = [e.type for e in events]
    assert types[-1] == "RUN_FINISHED" and "REASONING_START" in types
    session = [e for e in events if isinstance(e, CustomEvent) and e.name == "fake-acp.session-id"]
    assert session[0].value == {"sessionId": "sess-fake-1"}
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent) and finished.usage and finished.usage[0].total_tokens == 10


def test_a_newer_protocol_is_refused_with_one_run_error(tmp_path: Path) -> None:
    events, _, _ = _run(tmp_path, "--protocol", "2")
    error = events[-1]
    assert isinstance(error, RunErrorEvent) and error.code == "acp_protocol_version", error
    assert [e.type for e in events].count("RUN_ERROR") == 1


def test_resume_loads_the_session_and_suppresses_the_replay(tmp_path: Path) -> None:
    events, sent, _ = _run(tmp_path, "--load", session_id="sess-fake-1")
    methods = [m.get("method") for m in sent if "method" in m]
    assert methods == ["initialize", "session/load", "session/prompt"], methods
    text = "".join(e.delta for e in events if isinstance(e, TextMessageContentEvent))
    assert "OLD ANSWER" not in text and '"read"' in text
    assert events[-1].type == "RUN_FINISHED"


def test_a_missing_agent_binary_is_one_run_error_naming_it(tmp_path: Path) -> None:
    harness = acp([str(tmp_path / "no-such-agent")], name="gone")
    sandbox = define_sandbox(
        "acp", local_process_sandbox(base_dir=tmp_path / "sb"), lifecycle=Lifecycle(destroy_on_complete=True)
    )

    async def main() -> list[Event]:
        return [e async for e in run_agent(sandbox, harness, "hi", thread_id="t", store=MemoryInstanceStore())]

    events = asyncio.run(asyncio.wait_for(main(), 30))
    error = events[-1]
    assert isinstance(error, RunErrorEvent) and error.code == "executable_not_found", error
    assert "no-such-agent" in error.message


def test_a_journaled_acp_run_talks_through_the_relay_and_stops_the_agent(tmp_path: Path) -> None:
    from boxwright.agent import JournalOptions

    log = tmp_path / "client.ndjson"
    harness = acp([sys.executable, str(FAKE_AGENT), str(log)], name="fake-acp")
    sandbox = define_sandbox(
        "acp",
        local_process_sandbox(base_dir=tmp_path / "sb"),
        define_workspace(setup=["echo hello > README.md"]),
        policy=POLICY,  # type: ignore[arg-type]
        lifecycle=Lifecycle(destroy_on_complete=True),
    )

    async def main() -> list[Event]:
        run = run_agent(
            sandbox, harness, "hi", thread_id="t", run_id="r-j", store=MemoryInstanceStore(), journal=JournalOptions()
        )
        return [e async for e in run]

    events = asyncio.run(asyncio.wait_for(main(), 30))
    assert events[-1].type == "RUN_FINISHED", events[-1]
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    methods = [m.get("method") for m in sent if "method" in m]
    assert methods == ["initialize", "session/new", "session/prompt"], "each request once, through the inbox"
    said = _said(events)
    assert said["read"] == {"content": "hello\n"}
    assert said["permission"] == {"outcome": "selected", "optionId": "reject"}
    alive = subprocess.run(["pgrep", "-f", str(log)], capture_output=True, text=True).stdout.split()
    assert alive == [], "the relay stopped the agent (it never exits by itself)"


def test_an_abort_sends_session_cancel_and_stops_the_agent(tmp_path: Path) -> None:
    from boxwright.abort import AbortController

    log = tmp_path / "client.ndjson"
    harness = acp([sys.executable, str(FAKE_AGENT), str(log), "--hang"], name="fake-acp")
    sandbox = define_sandbox(
        "acp", local_process_sandbox(base_dir=tmp_path / "sb"), lifecycle=Lifecycle(destroy_on_complete=True)
    )
    controller = AbortController()

    async def main() -> list[Event]:
        events: list[Event] = []
        async for event in run_agent(
            sandbox, harness, "hi", thread_id="t", store=MemoryInstanceStore(), signal=controller.signal
        ):
            events.append(event)
            if event.type == "REASONING_MESSAGE_CONTENT":
                controller.abort("boxwright:cancel-requested")
        return events

    events = asyncio.run(asyncio.wait_for(main(), 30))
    error = events[-1]
    assert isinstance(error, RunErrorEvent) and error.code == "cancelled", error
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    cancel = [m for m in sent if m.get("method") == "session/cancel"]
    assert cancel == [{"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "sess-fake-1"}}]
    alive = subprocess.run(["pgrep", "-f", str(log)], capture_output=True, text=True).stdout.split()
    assert alive == [], "the agent was stopped (it never exits by itself)"


def test_a_cancelled_journaled_acp_run_stops_its_relayed_agent(tmp_path: Path) -> None:
    from boxwright.abort import AbortController
    from boxwright.agent import JournalOptions

    log = tmp_path / "client.ndjson"
    harness = acp([sys.executable, str(FAKE_AGENT), str(log), "--hang"], name="fake-acp")
    sandbox = define_sandbox(
        "acp", local_process_sandbox(base_dir=tmp_path / "sb"), lifecycle=Lifecycle(destroy_on_complete=True)
    )
    controller = AbortController()

    async def main() -> list[Event]:
        events: list[Event] = []
        async for event in run_agent(
            sandbox,
            harness,
            "hi",
            thread_id="t",
            run_id="r-jc",
            store=MemoryInstanceStore(),
            signal=controller.signal,
            journal=JournalOptions(),
        ):
            events.append(event)
            if event.type == "REASONING_MESSAGE_CONTENT":
                controller.abort("boxwright:cancel-requested")
        return events

    events = asyncio.run(asyncio.wait_for(main(), 30))
    error = events[-1]
    assert isinstance(error, RunErrorEvent) and error.code == "cancelled", error
    deadline = time.monotonic() + 10
    while (alive := subprocess.run(["pgrep", "-f", str(log)], capture_output=True, text=True).stdout.split()) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert alive == [], "the relay stopped the agent on the cancel"
