"""Host-driven mode on Docker: the REAL `claude` in a real container (spawned by docker exec) against the fake
model on the host, the MCP tool bridge on the host reached via host.docker.internal.

The agent edits a file of the container's workspace and calls a host Python tool; the test asserts the events,
the diff and the tool result, and that the container is gone after the run.
"""

from __future__ import annotations

import asyncio

import pytest

from boxwright.agent import run_agent
from boxwright.definition import Lifecycle, define_sandbox
from boxwright.events import CustomEvent, Event, ToolCallResultEvent, ToolCallStartEvent, encode_event
from boxwright.stores.memory import MemoryInstanceStore
from boxwright.workspace import define_workspace
from tests.fixtures.fake_model import FakeModelServer, Text, ToolCall
from tests.support.docker import (
    RUNNER_IMAGE,
    TEST_LABEL,
    bridge_address,
    claude_in_image,
    labelled_containers,
    model_env_in_container,
    no_leaked_containers,
    repo_setup,
    runner_image,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leaked_containers", "runner_image")]
__all__ = ["no_leaked_containers", "runner_image"]
EDIT = "sed -i 's/hello/hello from claude/' README.md"


def test_real_claude_in_a_container_edits_and_calls_a_host_tool() -> None:
    from boxwright.providers.docker import docker_sandbox
    from boxwright.tool_bridge import tool

    calls: list[str] = []

    @tool(read_only=True)
    def get_todos(status: str = "open") -> str:
        """List the todos of the app (closure state on the host)."""
        calls.append(status)
        return f"- write the spec [{status}]\n- ship it [{status}]"

    model = FakeModelServer(
        {
            "edit": [
                ToolCall("Bash", {"command": EDIT, "description": "edit the readme"}),
                ToolCall("mcp__boxwright__get_todos", {"status": "open"}),
                Text("I edited it and read your todos."),
            ]
        },
        host=bridge_address(),
    )
    model.start()
    provider = docker_sandbox(RUNNER_IMAGE, labels={TEST_LABEL: "1"})
    sandbox = define_sandbox(
        "docker-e2e",
        provider,
        define_workspace(setup=repo_setup()),
        lifecycle=Lifecycle(destroy_on_complete=True),
    )
    harness = claude_in_image()

    async def main() -> list[Event]:
        return [
            event
            async for event in run_agent(
                sandbox,
                harness,
                "[[script:edit]] change the greeting in README.md, then read my todos",
                thread_id="t-docker",
                run_id="r-docker",
                tools=[get_todos],
                store=MemoryInstanceStore(),
                host_env=model_env_in_container(model.base_url),
            )
        ]

    try:
        events = asyncio.run(asyncio.wait_for(main(), 240))
        requests = model.model_requests()
    finally:
        model.stop()
    types = [e.type for e in events]
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED", types
    starts = [e for e in events if isinstance(e, ToolCallStartEvent)]
    assert [s.tool_call_name for s in starts][:1] == ["Bash"], starts
    assert calls == ["open"], "the host tool ran once, in this process, with the agent's arguments"
    results = [e for e in events if isinstance(e, ToolCallResultEvent)]
    assert any("write the spec" in str(r.content) and r.state != "output-error" for r in results), results
    changed = [e for e in events if isinstance(e, CustomEvent) and e.name == "file.changed"]
    assert len(changed) == 1, types
    diff = changed[0].value["diff"]
    assert "-hello" in diff and "+hello from claude" in diff and "README.md" in diff
    assert "write the spec" in str(requests[-1].body["messages"])
    assert b"Bearer" not in b"".join(encode_event(e) for e in events)
    assert [c for c in labelled_containers() if c] == [], "destroy_on_complete left the container"
