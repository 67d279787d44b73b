"""The REAL `opencode` CLI through run_agent, in a local-process and a bubblewrap sandbox, against the fake model.

Each run is a short scripted reply: a shell command and a file edit (the diff is asserted), a host
Python tool over the bridge (its result reaches the model's next request), a cancelled run (no
process left), and a resumed session (the policy's three outcomes: test_policy_run_agent.py).
OpenCode's first start in a fresh HOME takes seconds: the runs of one test share a HOME.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
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
from boxwright.harnesses.opencode import opencode
from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.stores.memory import MemoryInstanceStore
from boxwright.tool_bridge.tools import define_tool
from boxwright.workspace import define_workspace, git_source
from tests.fixtures.fake_model import FakeModelServer, Hang, Text, ToolCall, ToolCalls
from tests.support.agent_procs import agent_left
from tests.support.require import agent_cli, missing

AGENTS = "/opt/boxwright-agents"
TODOS = '[{"id": 1, "title": "write the report"}]'
PROVIDERS = ["local-process", "bubblewrap"]
EDIT = {"filePath": "README.md", "oldString": "hello", "newString": "hello from opencode"}


@pytest.fixture
def opencode_bin() -> str:
    return agent_cli("opencode")


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
                ToolCall("bash", {"command": "echo made > made.txt", "description": "make a file"}),
                ToolCall("edit", EDIT),
                Text("Made a file and edited README.md."),
            ],
            "tool": [ToolCall("boxwright_get_todos", {}), Text("You have one todo.")],
            "policy": [
                ToolCalls(
                    [
                        ("bash", {"command": "echo allowed", "description": "allowed"}),
                        ("bash", {"command": "rm -f README.md", "description": "denied"}),
                        ("bash", {"command": "ls", "description": "asks"}),
                    ]
                ),
                Text("Policy applied."),
            ],
            "hang": [Hang(max_seconds=60)],
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
    binds = [str(origin), AGENTS]  # the CLI's install and the origin repository, read-only
    return bubblewrap_sandbox(base_dir=tmp_path / "sandboxes", ro_binds=[b for b in binds if os.path.isdir(b)])


def _harness(opencode_bin: str, model: FakeModelServer, tmp_path: Path) -> Any:
    home = tmp_path / "home"
    config = {
        "provider": {
            "fake": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Fake",
                "options": {"baseURL": model.base_url + "/v1", "apiKey": "sk-test"},
                "models": {"fake-model": {"name": "Fake Model", "tool_call": True}},
            }
        }
    }
    env = {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local/share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local/state"),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "npm_config_registry": "http://127.0.0.1:9/",  # offline: its plugin lookups fail at once
    }
    return opencode("fake/fake-model", executable=opencode_bin, config=config, env=env)


def _sandbox(kind: str, tmp_path: Path, origin: Path, *, keep: bool = False, policy: Any = None) -> Any:
    return define_sandbox(
        "opencode-e2e",
        _provider(kind, tmp_path, origin),
        define_workspace(source=git_source(f"file://{origin}")),
        lifecycle=Lifecycle(destroy_on_complete=not keep),
        policy=policy,
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


def _home(tmp_path: Path) -> str:
    return f"HOME={tmp_path / 'home'}"


@pytest.mark.parametrize("kind", PROVIDERS)
def test_real_opencode_runs_a_command_and_edits_a_file(
    kind: str, tmp_path: Path, origin: Path, model: FakeModelServer, opencode_bin: str
) -> None:
    store = MemoryInstanceStore()
    sandbox = _sandbox(kind, tmp_path, origin, keep=True)

    async def main() -> tuple[list[Event], str, str]:
        events = await _collect(
            run_agent(
                sandbox,
                _harness(opencode_bin, model, tmp_path),
                "[[script:work]] make a file and fix the greeting",
                thread_id="t-oc",
                run_id="r-oc",
                store=store,
                host_env={},
            )
        )
        again = await sandbox.ensure_existing(EnsureContext(thread_id="t-oc", run_id="r-check", store=store))
        assert again is not None
        made = await again.handle.fs.read("/workspace/made.txt")
        readme = await again.handle.fs.read("/workspace/README.md")
        await again.handle.destroy()
        return events, made, readme

    events, made, readme = asyncio.run(main())
    _finished(events)
    assert [e.tool_call_name for e in events if isinstance(e, ToolCallStartEvent)] == ["bash", "edit"]
    results = [e for e in events if isinstance(e, ToolCallResultEvent)]
    assert len(results) == 2 and all(r.state is None for r in results), results
    assert made == "made\n" and readme == "hello from opencode\n"
    changed = [e for e in events if isinstance(e, CustomEvent) and e.name == "file.changed"]
    assert len(changed) == 1
    diff = changed[0].value["diff"]
    assert "-hello" in diff and "+hello from opencode" in diff and "made.txt" in diff
    finished = events[-1]
    assert isinstance(finished, RunFinishedEvent) and finished.usage
    assert agent_left(_home(tmp_path)) == []


@pytest.mark.parametrize("kind", PROVIDERS)
def test_real_opencode_calls_a_host_tool_over_the_bridge(
    kind: str, tmp_path: Path, origin: Path, model: FakeModelServer, opencode_bin: str
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
                _harness(opencode_bin, model, tmp_path),
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
    assert next(e for e in events if isinstance(e, ToolCallStartEvent)).tool_call_name == "get_todos"
    assert "write the report" in str(next(e for e in events if isinstance(e, ToolCallResultEvent)).content)
    # The tool's result went back to the model: the next Chat Completions request carries it.
    last = model.model_requests()[-1].body
    tool_messages = [m for m in last["messages"] if m.get("role") == "tool"]
    assert tool_messages and "write the report" in str(tool_messages[-1]["content"])
    assert agent_left(_home(tmp_path)) == []


@pytest.mark.parametrize("kind", PROVIDERS)
def test_cancelled_opencode_run_ends_once_and_leaves_no_process(
    kind: str, tmp_path: Path, origin: Path, model: FakeModelServer, opencode_bin: str
) -> None:
    controller = AbortController()

    async def main() -> list[Event]:
        events: list[Event] = []
        stream = run_agent(
            _sandbox(kind, tmp_path, origin),
            _harness(opencode_bin, model, tmp_path),
            "[[script:hang]] wait forever",
            thread_id="t-cancel",
            store=MemoryInstanceStore(),
            host_env={},
            signal=controller.signal,
        )

        async def cancel_when_asked() -> None:
            await asyncio.to_thread(model.wait_for_request, lambda r: r.script == "hang", 90)
            controller.abort("cancelled by the test")

        task = asyncio.create_task(cancel_when_asked())
        try:
            async for event in stream:
                events.append(event)
        finally:
            await task
        return events

    events = asyncio.run(asyncio.wait_for(main(), 150))
    types = _types(events)
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_ERROR" and types.count("RUN_ERROR") == 1, types
    assert "RUN_FINISHED" not in types
    assert agent_left(_home(tmp_path)) == []


def test_opencode_resumes_its_session_by_id(
    tmp_path: Path, origin: Path, model: FakeModelServer, opencode_bin: str
) -> None:
    harness = _harness(opencode_bin, model, tmp_path)
    store = MemoryInstanceStore()
    sandbox = _sandbox("local-process", tmp_path, origin, keep=True)

    async def main() -> tuple[list[Event], list[Event]]:
        first = await _collect(
            run_agent(sandbox, harness, "[[script:first]] one", thread_id="t-resume", store=store, host_env={})
        )
        session = next(e for e in first if isinstance(e, CustomEvent) and e.name == "opencode.session-id")
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
        e.value["sessionId"]
        for e in [*first, *second]
        if isinstance(e, CustomEvent) and e.name == "opencode.session-id"
    ]
    assert len(ids) == 2 and ids[0] == ids[1], "the same session came back"
    resumed = model.model_requests()[-1].body
    assert "[[script:first]] one" in str(resumed["messages"]) and "First answer." in str(resumed["messages"])
