"""The REAL `codex` CLI through run_agent, in a local-process and a bubblewrap sandbox, against the fake model.

Each run is a short scripted reply: a shell command and a file edit (the diff is asserted), a host
Python tool over the bridge (its result reaches the model's next request), a cancelled run (no
process left), and a resumed thread.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from boxwright.abort import AbortController
from boxwright.agent import run_agent
from boxwright.definition import EnsureContext, Lifecycle, define_sandbox
from boxwright.events import (
    CustomEvent,
    Event,
    RunErrorEvent,
    RunFinishedEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from boxwright.harnesses.codex import codex
from boxwright.policy import define_sandbox_policy
from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.stores.memory import MemoryInstanceStore
from boxwright.tool_bridge.tools import define_tool
from boxwright.workspace import define_workspace, git_source
from tests.fixtures.fake_model import CustomToolCall, FakeModelServer, Hang, Text, ToolCall
from tests.support.agent_harnesses import codex_for
from tests.support.agent_procs import agent_left
from tests.support.require import agent_cli, missing

AGENTS = "/opt/boxwright-agents"
PATCH = "*** Begin Patch\n*** Update File: README.md\n@@\n-hello\n+hello from codex\n*** End Patch\n"
TODOS = '[{"id": 1, "title": "write the report"}]'
PROVIDERS = ["local-process", "bubblewrap"]


@pytest.fixture
def codex_bin() -> str:
    return agent_cli("codex")


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    repo = tmp_path / "origin"
    repo.mkdir()
    for args in (["init", "-q", "-b", "main"], ["config", "user.email", "t@example.com"], ["config", "user.name", "t"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    (repo / "README.md").write_text("hello\n")
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "init"], cwd=repo, check=True)
    return repo


@pytest.fixture
def model() -> Iterator[FakeModelServer]:
    server = FakeModelServer(
        {
            "work": [
                ToolCall("exec_command", {"cmd": "echo made > made.txt"}),
                CustomToolCall("apply_patch", PATCH),
                Text("Made a file and edited README.md."),
            ],
            "tool": [ToolCall("get_todos", {}, namespace="mcp__boxwright"), Text("You have one todo.")],
            "hang": [Hang(max_seconds=60)],
            "echo": [ToolCall("exec_command", {"cmd": "echo hi"}), Text("Said hi.")],
            "first": [Text("First answer.")],
            "second": [Text("Second answer.")],
        }
    )
    server.start()
    yield server
    server.stop()


def _provider(kind: str, tmp_path: Path, origin: Path) -> Any:
    if kind == "local-process":
        return local_process_sandbox(base_dir=tmp_path / "sandboxes")
    if not probe().available:
        missing(f"bubblewrap: {probe().reason}")
    # The CLI's install and the origin repository, read-only.
    binds = [str(origin), AGENTS]
    return bubblewrap_sandbox(base_dir=tmp_path / "sandboxes", ro_binds=[b for b in binds if os.path.isdir(b)])


def _harness(codex_bin: str, model: FakeModelServer, tmp_path: Path) -> Any:
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    # CODEX_HOME outside TMPDIR: codex's own sandbox refuses to set up its helper under $TMPDIR (measured).
    return codex(
        "gpt-5.5",
        executable=codex_bin,
        base_url=model.base_url + "/v1",
        max_retries=0,
        env={"HOME": str(home), "CODEX_HOME": str(home), "TMPDIR": str(tmp), "CODEX_API_KEY": "sk-test"},
    )


def _sandbox(kind: str, tmp_path: Path, origin: Path, *, keep: bool = False) -> Any:
    return define_sandbox(
        "codex-e2e",
        _provider(kind, tmp_path, origin),
        define_workspace(source=git_source(f"file://{origin}")),
        lifecycle=Lifecycle(destroy_on_complete=not keep),
    )


async def _collect(events: Any) -> list[Event]:
    return [event async for event in events]


def _types(events: list[Event]) -> list[str]:
    return [e.type for e in events]


def _finished(events: list[Event]) -> None:
    types = _types(events)
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED" and "RUN_ERROR" not in types, (
        types,
        [e for e in events if isinstance(e, RunErrorEvent)],
    )


@pytest.mark.parametrize("kind", PROVIDERS)
def test_real_codex_runs_a_command_and_edits_a_file(
    kind: str, tmp_path: Path, origin: Path, model: FakeModelServer, codex_bin: str
) -> None:
    store = MemoryInstanceStore()
    sandbox = _sandbox(kind, tmp_path, origin, keep=True)

    async def main() -> tuple[list[Event], str, str]:
        events = await _collect(
            run_agent(
                sandbox,
                _harness(codex_bin, model, tmp_path),
                "[[script:work]] make a file and fix the greeting",
                thread_id="t-codex",
                run_id="r-codex",
                store=store,
                host_env={},
            )
        )
        again = await sandbox.ensure_existing(EnsureContext(thread_id="t-codex", run_id="r-check", store=store))
        assert again is not None
        made = await again.handle.fs.read("/workspace/made.txt")
        readme = await again.handle.fs.read("/workspace/README.md")
        await again.handle.destroy()
        return events, made, readme

    events, made, readme = asyncio.run(main())
    _finished(events)
    names = [e.tool_call_name for e in events if isinstance(e, ToolCallStartEvent)]
    assert names == ["command_execution", "file_change"]
    results = [e for e in events if isinstance(e, ToolCallResultEvent)]
    assert len(results) == 2 and all(r.state is None for r in results), results
    assert made == "made\n" and readme == "hello from codex\n"
    changed = [e for e in events if isinstance(e, CustomEvent) and e.name == "file.changed"]
    assert len(changed) == 1
    diff = changed[0].value["diff"]
    assert "-hello" in diff and "+hello from codex" in diff and "made.txt" in diff
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent) and finished.usage
    assert agent_left(f"HOME={tmp_path / 'home'}") == []


@pytest.mark.parametrize("kind", PROVIDERS)
def test_real_codex_calls_a_host_tool_over_the_bridge(
    kind: str, tmp_path: Path, origin: Path, model: FakeModelServer, codex_bin: str
) -> None:
    calls: list[Any] = []

    def get_todos(args: Any, ctx: Any) -> str:
        calls.append(args)
        return TODOS

    tool = define_tool("get_todos", "List the open todos.", {"type": "object", "properties": {}}, get_todos)
    events = asyncio.run(
        _collect(
            run_agent(
                _sandbox(kind, tmp_path, origin),
                _harness(codex_bin, model, tmp_path),
                "[[script:tool]] list my todos",
                thread_id="t-tool",
                tools=[tool],
                store=MemoryInstanceStore(),
                host_env={},
            )
        )
    )
    _finished(events)
    assert len(calls) == 1, "the host tool ran once"
    start = next(e for e in events if isinstance(e, ToolCallStartEvent))
    assert start.tool_call_name == "get_todos"
    result = next(e for e in events if isinstance(e, ToolCallResultEvent))
    assert "write the report" in str(result.content)
    # The tool's result went back to the model: the next Responses request carries it.
    last = model.model_requests()[-1].body
    outputs = [i for i in last["input"] if i.get("type") == "function_call_output"]
    assert outputs and "write the report" in str(outputs[-1]["output"])
    assert agent_left(f"HOME={tmp_path / 'home'}") == []


@pytest.mark.parametrize("kind", PROVIDERS)
def test_cancelled_codex_run_ends_once_and_leaves_no_process(
    kind: str, tmp_path: Path, origin: Path, model: FakeModelServer, codex_bin: str
) -> None:
    controller = AbortController()

    async def main() -> list[Event]:
        events: list[Event] = []
        stream = run_agent(
            _sandbox(kind, tmp_path, origin),
            _harness(codex_bin, model, tmp_path),
            "[[script:hang]] wait forever",
            thread_id="t-cancel",
            store=MemoryInstanceStore(),
            host_env={},
            signal=controller.signal,
        )

        async def cancel_when_asked() -> None:
            await asyncio.to_thread(model.wait_for_request, lambda r: r.script == "hang", 60)
            controller.abort("cancelled by the test")

        task = asyncio.create_task(cancel_when_asked())
        try:
            async for event in stream:
                events.append(event)
        finally:
            await task
        return events

    events = asyncio.run(asyncio.wait_for(main(), 120))
    types = _types(events)
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_ERROR" and types.count("RUN_ERROR") == 1, types
    assert "RUN_FINISHED" not in types
    assert agent_left(f"HOME={tmp_path / 'home'}") == []


def test_codex_resumes_its_thread_by_id(tmp_path: Path, origin: Path, model: FakeModelServer, codex_bin: str) -> None:
    harness = _harness(codex_bin, model, tmp_path)
    store = MemoryInstanceStore()
    sandbox = _sandbox("local-process", tmp_path, origin, keep=True)

    async def main() -> tuple[list[Event], list[Event]]:
        first = await _collect(
            run_agent(sandbox, harness, "[[script:first]] one", thread_id="t-resume", store=store, host_env={})
        )
        session = next(e for e in first if isinstance(e, CustomEvent) and e.name == "codex.session-id")
        second = await _collect(
            run_agent(
                sandbox,
                harness,
                "[[script:second]] two",
                thread_id="t-resume",
                store=store,
                host_env={},
                session_id=session.value["sessionId"],
            )
        )
        again = await sandbox.ensure_existing(EnsureContext(thread_id="t-resume", run_id="r-x", store=store))
        if again is not None:
            await again.handle.destroy()
        return first, second

    first, second = asyncio.run(main())
    _finished(first)
    _finished(second)
    ids = [
        e.value["sessionId"] for e in [*first, *second] if isinstance(e, CustomEvent) and e.name == "codex.session-id"
    ]
    assert len(ids) == 2 and ids[0] == ids[1], "the same thread came back"
    resumed = model.model_requests()[-1].body
    assert "[[script:first]] one" in str(resumed["input"]) and "First answer." in str(resumed["input"])


@pytest.mark.parametrize("default", ["ask", "deny"])
def test_codex_runs_under_a_policy_mapped_to_its_own_modes(
    default: str, tmp_path: Path, origin: Path, model: FakeModelServer, codex_bin: str
) -> None:
    """No permission hook in ``codex exec`` (see the module): the policy only picks sandbox and approval
    modes, which this CLI must accept (0.169.0 exits at start on ``untrusted``, a deny default's old mapping)."""
    policy = define_sandbox_policy(allow=["echo *"], deny=["rm *"], default=default)  # type: ignore[arg-type]
    sandbox = define_sandbox(
        "codex-policy",
        _provider("local-process", tmp_path, origin),
        lifecycle=Lifecycle(destroy_on_complete=True),
        policy=policy,
    )
    events = asyncio.run(
        _collect(
            run_agent(
                sandbox,
                _harness(codex_bin, model, tmp_path),
                "[[script:echo]] say hi",
                thread_id="t-policy",
                store=MemoryInstanceStore(),
                host_env={},
            )
        )
    )
    _finished(events)
    result = next(e for e in events if isinstance(e, ToolCallResultEvent))
    assert result.state is None and '"aggregated_output":"hi\\n"' in str(result.content)


def test_a_codex_run_against_an_unreachable_model_ends_at_its_deadline(tmp_path: Path, codex_bin: str) -> None:
    # Measured: codex retries an unreachable endpoint for ever ("Reconnecting..."), even with retries at 0.
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe_socket.getsockname()[1]}"  # closed once the block ends: refused
    home = tmp_path / "home"
    home.mkdir()
    sandbox = define_sandbox(
        "e2e", local_process_sandbox(base_dir=tmp_path / "sb"), lifecycle=Lifecycle(destroy_on_complete=True)
    )

    async def main() -> list[Event]:
        stream = run_agent(
            sandbox,
            codex_for(dead, str(home), codex_bin),
            "hello?",
            thread_id="t-deadline",
            store=MemoryInstanceStore(),
            host_env={},
            deadline=4.0,
        )
        return [event async for event in stream]

    started = time.monotonic()
    events = asyncio.run(asyncio.wait_for(main(), 120))
    took = time.monotonic() - started
    types = _types(events)
    assert types[-1] == "RUN_ERROR" and types.count("RUN_ERROR") == 1 and "RUN_FINISHED" not in types, types
    error = events[-1]
    assert isinstance(error, RunErrorEvent) and error.code == "deadline_exceeded", error
    assert "deadline of 4 s" in error.message
    assert 4.0 <= took < 30, took
    assert agent_left(f"HOME={home}") == []


def test_a_deadline_that_is_not_a_positive_number_is_refused_before_any_sandbox(tmp_path: Path) -> None:
    sandbox = define_sandbox("e2e", local_process_sandbox(base_dir=tmp_path / "sb"))

    async def main() -> list[Event]:
        run = run_agent(sandbox, codex(), "hi", thread_id="t", store=MemoryInstanceStore(), deadline=0)
        return [event async for event in run]

    events = asyncio.run(main())
    error = events[-1]
    assert isinstance(error, RunErrorEvent) and error.code == "invalid_input" and "deadline" in error.message
    assert not (tmp_path / "sb").exists(), "no sandbox was made"
