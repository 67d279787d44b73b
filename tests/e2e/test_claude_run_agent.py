"""The whole mission once: the REAL `claude` CLI runs in a sandbox through run_agent, against a fake model API.

The fake model scripts a Bash tool call that edits a file of a cloned test repository; the test checks the
event sequence, the file in the sandbox, and the diff in `file.changed`. Also: a model API failure, a missing
binary and a cancelled run each end with one RUN_ERROR naming the cause and leave no process behind.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from boxwright.abort import AbortController
from boxwright.agent import run_agent
from boxwright.definition import EnsureContext, Lifecycle, define_sandbox
from boxwright.events import (
    CustomEvent,
    Event,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    TextMessageContentEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    encode_event,
)
from boxwright.harnesses.claude_code import claude_code
from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.stores.memory import MemoryInstanceStore
from boxwright.workspace import define_workspace, git_source
from tests.fixtures import find_claude
from tests.fixtures.fake_model import FakeModelServer, Hang, HttpError, Text, ToolCall
from tests.support.require import missing

AGENTS = "/opt/boxwright-agents"
EDIT = "sed -i 's/hello/hello from claude/' README.md"


@pytest.fixture
def claude_bin() -> str:
    found = find_claude()
    if found is None:
        missing("the `claude` CLI is not installed (npm install @anthropic-ai/claude-code)")
    return found


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    repo = tmp_path / "origin"
    repo.mkdir()
    for args in (
        ["init", "-q", "-b", "main"],
        ["config", "user.email", "t@example.com"],
        ["config", "user.name", "t"],
    ):
        subprocess.run(["git", *args], cwd=repo, check=True)
    (repo / "README.md").write_text("hello\n")
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "init"], cwd=repo, check=True)
    return repo


@pytest.fixture
def model() -> Iterator[FakeModelServer]:
    server = FakeModelServer(
        {
            "edit": [ToolCall("Bash", {"command": EDIT, "description": "edit the readme"}), Text("I edited it.")],
            "broken": [HttpError(500, "scripted server error")],
            "slow": [ToolCall("Bash", {"command": "sleep 600", "description": "wait"}), Text("never")],
            "hang": [Hang(max_seconds=60)],
        }
    )
    server.start()
    yield server
    server.stop()


def _provider(kind: str, tmp_path: Path, origin: Path, claude_bin: str) -> object:
    if kind == "local-process":
        return local_process_sandbox(base_dir=tmp_path / "sandboxes")
    if not probe().available:
        missing(f"bubblewrap: {probe().reason}")
    # The CLI lives outside /usr: show its install (and the origin repo) read-only inside the sandbox.
    binds = [str(origin), os.path.dirname(os.path.dirname(os.path.realpath(claude_bin))), AGENTS]
    return bubblewrap_sandbox(base_dir=tmp_path / "sandboxes", ro_binds=[b for b in binds if os.path.isdir(b)])


def _harness(claude_bin: str, model: FakeModelServer, home: Path) -> object:
    return claude_code(
        "claude-sonnet-4-5",
        executable=claude_bin,
        env={"HOME": str(home), "CLAUDE_CODE_MAX_RETRIES": "0"},
    )


def _host_env(model: FakeModelServer) -> dict[str, str]:
    return {"ANTHROPIC_BASE_URL": model.base_url, "ANTHROPIC_API_KEY": "sk-test"}


async def _collect(events: object) -> list[Event]:
    return [event async for event in events]  # type: ignore[attr-defined]


def _types(events: list[Event]) -> list[str]:
    return [e.type for e in events]


def _no_agent_left(claude_bin: str, home: Path, settle: float = 10.0) -> list[str]:
    """This test's claude processes still running, after up to ``settle`` s for exits under way."""
    deadline = time.monotonic() + settle
    while (found := _agent_pids(claude_bin, home)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def _agent_pids(claude_bin: str, home: Path) -> list[str]:
    """Host processes running the claude binary with this test's HOME.

    Other xdist workers run claude at the same time: only the HOME each test gives its agent tells them apart.
    """
    real = os.path.realpath(claude_bin)
    mark = b"\0HOME=" + os.fsencode(home) + b"\0"
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                exe = os.path.realpath(f"/proc/{pid}/exe")
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                environ = b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            if exe == real and state != "Z" and mark in environ:
                found.append(pid)
    return found


PROVIDERS = ["local-process", "bubblewrap"]


@pytest.mark.parametrize("kind", PROVIDERS)
def test_real_claude_edits_a_cloned_repo_and_the_run_streams_back(
    kind: str, tmp_path: Path, origin: Path, model: FakeModelServer, claude_bin: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    sandbox = define_sandbox(
        "e2e", _provider(kind, tmp_path, origin, claude_bin), define_workspace(source=git_source(f"file://{origin}"))
    )  # type: ignore[arg-type]
    store = MemoryInstanceStore()

    async def main() -> tuple[list[Event], str]:
        events = await _collect(
            run_agent(
                sandbox,
                _harness(claude_bin, model, home),  # type: ignore[arg-type]
                "[[script:edit]] please change the greeting in README.md",
                thread_id="t-e2e",
                run_id="r-e2e",
                store=store,
                host_env=_host_env(model),
            )
        )
        again = await sandbox.ensure_existing(EnsureContext(thread_id="t-e2e", run_id="r-check", store=store))
        assert again is not None
        readme = await again.handle.fs.read("/workspace/README.md")
        await again.handle.destroy()
        return events, readme

    events, readme = asyncio.run(main())
    types = _types(events)
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED", types
    assert types.count("RUN_STARTED") == 1 and types.count("RUN_FINISHED") == 1 and "RUN_ERROR" not in types
    session = [e for e in events if isinstance(e, CustomEvent) and e.name == "claude-code.session-id"]
    assert len(session) == 1 and session[0].value["sessionId"]
    start = next(e for e in events if isinstance(e, ToolCallStartEvent))
    assert start.tool_call_name == "Bash"
    args = "".join(e.delta for e in events if isinstance(e, ToolCallArgsEvent) and e.tool_call_id == start.tool_call_id)
    assert EDIT in args
    end = next(e for e in events if isinstance(e, ToolCallEndEvent))
    result = next(e for e in events if isinstance(e, ToolCallResultEvent))
    assert end.tool_call_id == result.tool_call_id == start.tool_call_id and result.state != "output-error"
    order = [types.index(t) for t in ("TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT")]
    assert order == sorted(order)
    text = "".join(e.delta for e in events if isinstance(e, TextMessageContentEvent))
    assert "I edited it." in text
    assert types.index("TOOL_CALL_RESULT") < types.index("TEXT_MESSAGE_START")
    assert readme == "hello from claude\n"
    changed = [e for e in events if isinstance(e, CustomEvent) and e.name == "file.changed"]
    assert len(changed) == 1 and types.index("CUSTOM", types.index("TEXT_MESSAGE_END")) < len(types) - 1
    diff = changed[0].value["diff"]
    assert "-hello" in diff and "+hello from claude" in diff and "README.md" in diff
    files = [e for e in events if isinstance(e, CustomEvent) and e.name == "sandbox.file"]
    assert any(e.value["path"] == "README.md" and e.value["type"] == "change" for e in files)
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent) and finished.finish_reason == "stop" and finished.usage
    # The model got the tool's result back.
    second = model.model_requests()[-1].body
    assert "tool_result" in str(second["messages"])
    assert _no_agent_left(claude_bin, home) == []


@pytest.mark.parametrize("kind", PROVIDERS)
def test_model_api_failure_ends_with_one_run_error(
    kind: str, tmp_path: Path, origin: Path, model: FakeModelServer, claude_bin: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    sandbox = define_sandbox(
        "e2e", _provider(kind, tmp_path, origin, claude_bin), lifecycle=Lifecycle(destroy_on_complete=True)
    )  # type: ignore[arg-type]
    events = asyncio.run(
        _collect(
            run_agent(
                sandbox,
                _harness(claude_bin, model, home),  # type: ignore[arg-type]
                "[[script:broken]] hi",
                thread_id="t",
                store=MemoryInstanceStore(),
                host_env=_host_env(model),
            )
        )
    )
    errors = [e for e in events if isinstance(e, RunErrorEvent)]
    assert len(errors) == 1 and events[-1] is errors[0], _types(events)
    assert "500" in errors[0].message and "RUN_FINISHED" not in _types(events)
    assert _no_agent_left(claude_bin, home) == []


def test_missing_claude_binary_ends_with_one_run_error(tmp_path: Path, model: FakeModelServer) -> None:
    sandbox = define_sandbox("e2e", local_process_sandbox(base_dir=tmp_path / "sb"))
    harness = claude_code(executable=str(tmp_path / "no-such-claude"))
    events = asyncio.run(
        _collect(run_agent(sandbox, harness, "hi", thread_id="t", store=MemoryInstanceStore(), host_env={}))
    )
    assert _types(events) == ["RUN_STARTED", "RUN_ERROR"]
    error = events[-1]
    assert isinstance(error, RunErrorEvent) and error.code == "executable_not_found"
    assert "not found" in error.message and "npm install @anthropic-ai/claude-code" in error.message


@pytest.mark.parametrize("kind", PROVIDERS)
def test_cancelled_run_ends_with_one_run_error_and_kills_the_agent(
    kind: str, tmp_path: Path, origin: Path, model: FakeModelServer, claude_bin: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    base = tmp_path / "sandboxes"
    sandbox = define_sandbox("e2e", _provider(kind, tmp_path, origin, claude_bin))  # type: ignore[arg-type]
    controller = AbortController()

    async def main() -> list[Event]:
        events: list[Event] = []
        async for event in run_agent(
            sandbox,
            _harness(claude_bin, model, home),  # type: ignore[arg-type]
            "[[script:slow]] wait a long time",
            thread_id="t",
            store=MemoryInstanceStore(),
            signal=controller.signal,
            host_env=_host_env(model),
        ):
            events.append(event)
            if isinstance(event, ToolCallStartEvent):
                await asyncio.sleep(0.5)  # the agent is inside `sleep 600` now
                controller.abort("boxwright:cancel-requested")
        return events

    events = asyncio.run(main())
    types = _types(events)
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_ERROR" and types.count("RUN_ERROR") == 1, types
    error = events[-1]
    assert isinstance(error, RunErrorEvent) and error.code == "cancelled" and "cancel" in error.message
    assert _no_agent_left(claude_bin, home) == []
    leftover = [p for p in os.listdir(base)] if base.exists() else []
    assert leftover == [], "a cancelled run destroys its sandbox"
    sleeps = subprocess.run(["pgrep", "-f", "^sleep 600$"], capture_output=True, text=True).stdout.split()
    assert sleeps == []


def test_a_consumer_that_stops_reading_kills_the_agent_and_destroys_the_sandbox(
    tmp_path: Path, origin: Path, model: FakeModelServer, claude_bin: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    base = tmp_path / "sandboxes"
    sandbox = define_sandbox("e2e", local_process_sandbox(base_dir=base))

    async def main() -> None:
        seen: list[Event] = []

        async def consume() -> None:
            async for event in run_agent(
                sandbox,
                _harness(claude_bin, model, home),  # type: ignore[arg-type]
                "[[script:hang]] the model never answers",
                thread_id="t",
                store=MemoryInstanceStore(),
                host_env=_host_env(model),
            ):
                seen.append(event)

        task = asyncio.ensure_future(consume())
        await asyncio.to_thread(model.wait_for_request, None, 30)  # the agent is up and waiting on the model
        assert _agent_pids(claude_bin, home) != []
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert isinstance(seen[0], RunStartedEvent)

    asyncio.run(main())
    assert _no_agent_left(claude_bin, home) == []
    assert not base.exists() or os.listdir(base) == []


# -- issue 6: the app's Python tools, called by the real agent over the authenticated MCP bridge -------


@pytest.mark.parametrize("kind", PROVIDERS)
def test_real_claude_calls_a_host_python_tool_through_the_bridge(
    kind: str, tmp_path: Path, origin: Path, claude_bin: str
) -> None:
    from boxwright.tool_bridge import tool

    todos = ["write the spec", "ship it"]
    calls: list[str] = []

    @tool(read_only=True)
    def get_todos(status: str = "open") -> str:
        """List the todos of the app (closure state on the host)."""
        calls.append(status)
        return "\n".join(f"- {t} [{status}]" for t in todos)

    model = FakeModelServer(
        {"todos": [ToolCall("mcp__boxwright__get_todos", {"status": "open"}), Text("You have two todos.")]}
    )
    model.start()
    home = tmp_path / "home"
    home.mkdir()
    sandbox = define_sandbox(
        "e2e", _provider(kind, tmp_path, origin, claude_bin), lifecycle=Lifecycle(destroy_on_complete=True)
    )  # type: ignore[arg-type]
    try:
        events = asyncio.run(
            _collect(
                run_agent(
                    sandbox,
                    _harness(claude_bin, model, home),  # type: ignore[arg-type]
                    "[[script:todos]] what is on my list?",
                    thread_id="t-tools",
                    run_id="r-tools",
                    tools=[get_todos],
                    store=MemoryInstanceStore(),
                    host_env=_host_env(model),
                )
            )
        )
        requests = model.model_requests()
    finally:
        model.stop()
    types = _types(events)
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED", types
    assert calls == ["open"], "the host tool ran once, in this process, with the agent's arguments"
    start = next(e for e in events if isinstance(e, ToolCallStartEvent))
    assert start.tool_name == "get_todos"
    result = next(e for e in events if isinstance(e, ToolCallResultEvent))
    assert "write the spec" in str(result.content) and result.state != "output-error"
    bridge = [e.name for e in events if isinstance(e, CustomEvent) and e.name.startswith("tool_bridge.")]
    assert bridge == ["tool_bridge.started", "tool_bridge.finished"]
    # The result went back into the agent's conversation with the model.
    assert "write the spec" in str(requests[-1].body["messages"])
    # The bearer token reached neither the events nor the workspace.
    wire = b"".join(encode_event(e) for e in events)
    assert b"Bearer" not in wire


# -- the policy answers Claude's permission prompts (harness-bridge R18) ------------------------------


def test_the_policy_decides_each_bash_command_of_the_real_claude(tmp_path: Path, claude_bin: str) -> None:
    from boxwright.policy import define_sandbox_policy
    from boxwright.workspace import define_workspace as workspace_with

    model = FakeModelServer(
        {
            "policy": [
                ToolCall("Bash", {"command": "echo hi > allowed.txt", "description": "allowed"}),
                ToolCall("Bash", {"command": "rm -f keep.txt", "description": "denied"}),
                ToolCall("Bash", {"command": "touch asked.txt", "description": "needs a person"}),
                Text("Done."),
            ]
        }
    )
    model.start()
    home = tmp_path / "home"
    home.mkdir()
    sandbox = define_sandbox(
        "policy",
        local_process_sandbox(base_dir=tmp_path / "sb"),
        workspace_with(setup=["echo keep > keep.txt"]),
        policy=define_sandbox_policy(default="ask", allow=["echo *"], deny=["rm *"]),
    )
    store = MemoryInstanceStore()

    async def main() -> tuple[list[Event], list[str]]:
        events = await _collect(
            run_agent(
                sandbox,
                _harness(claude_bin, model, home),  # type: ignore[arg-type]
                "[[script:policy]] tidy up",
                thread_id="t-policy",
                store=store,
                host_env=_host_env(model),
            )
        )
        again = await sandbox.ensure_existing(EnsureContext(thread_id="t-policy", run_id="check", store=store))
        assert again is not None
        present = [n for n in ("allowed.txt", "keep.txt", "asked.txt") if await again.handle.fs.exists(n)]
        await again.handle.destroy()
        return events, present

    try:
        events, present = asyncio.run(main())
    finally:
        model.stop()
    assert events[-1].type == "RUN_FINISHED", _types(events)
    assert present == ["allowed.txt", "keep.txt"], "allowed ran; denied and unapproved did not"
    results = [e for e in events if isinstance(e, ToolCallResultEvent)]
    assert len(results) == 3
    assert results[0].state != "output-error"
    assert results[1].state == "output-error" and "denied by the sandbox policy" in str(results[1].content)
    assert results[2].state == "output-error" and "needs approval" in str(results[2].content)
    asked = [e for e in events if isinstance(e, CustomEvent) and e.name == "approval-requested"]
    assert len(asked) == 1 and asked[0].value["approvalId"] == "claude-code:command:touch asked.txt"
