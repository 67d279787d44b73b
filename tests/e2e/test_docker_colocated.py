"""Co-located mode on Docker: the runner in the container drives the REAL `claude` against the fake model on the
host, with the MCP bridge on the container's own loopback; only tool execution crosses back (tool-exec).

Also the runner's bad input: a wrong token, a malformed body and a secret value where a name belongs are each a
clear 4xx, and nothing hangs.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from boxwright.agent import run_agent
from boxwright.colocated import probe_colocated_run_exit, runner_token
from boxwright.definition import Lifecycle, define_sandbox
from boxwright.events import CustomEvent, Event, ToolCallResultEvent, ToolCallStartEvent, encode_event
from boxwright.journal import Finished, Producing, Unknown
from boxwright.runner.launch import spawn_runner
from boxwright.stores.memory import MemoryInstanceStore
from boxwright.workspace import define_workspace
from tests.fixtures.fake_model import FakeModelServer, Sleep, Text, ToolCall
from tests.support.docker import (
    RUNNER_IMAGE,
    RUNNER_SECRET,
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


def test_colocated_real_claude_edits_and_calls_a_host_tool() -> None:
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
    sandbox = define_sandbox(
        "docker-colocated",
        docker_sandbox(RUNNER_IMAGE, labels={TEST_LABEL: "1"}),
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
                thread_id="t-colocated",
                run_id="r-colocated",
                tools=[get_todos],
                store=MemoryInstanceStore(),
                host_env=model_env_in_container(model.base_url),
                mode="colocated",
            )
        ]

    try:
        events = asyncio.run(asyncio.wait_for(main(), 240))
        requests = model.model_requests()
    finally:
        model.stop()
    types = [e.type for e in events]
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED", types
    assert types.count("RUN_STARTED") == 1 and types.count("RUN_FINISHED") == 1, types
    starts = [e for e in events if isinstance(e, ToolCallStartEvent)]
    assert [s.tool_call_name for s in starts][:1] == ["Bash"], starts
    assert calls == ["open"], "the host tool ran once, on the host, over tool-exec"
    results = [e for e in events if isinstance(e, ToolCallResultEvent)]
    assert any("write the spec" in str(r.content) and r.state != "output-error" for r in results), results
    changed = [e for e in events if isinstance(e, CustomEvent) and e.name == "file.changed"]
    assert len(changed) == 1, types
    diff = changed[0].value["diff"]
    assert "-hello" in diff and "+hello from claude" in diff and "README.md" in diff
    assert "write the spec" in str(requests[-1].body["messages"])
    wire = b"".join(encode_event(e) for e in events)
    assert b"Bearer" not in wire and b"sk-test" not in wire
    assert labelled_containers() == [], "destroy_on_complete left the container"


def test_runner_refuses_a_wrong_token_a_malformed_body_and_a_secret_value() -> None:
    from boxwright.providers.docker import docker_sandbox

    async def main() -> None:
        handle = await docker_sandbox(RUNNER_IMAGE, labels={TEST_LABEL: "1"}).create()
        try:
            host = await handle.address()
            runner = await spawn_runner(handle, "right-token", host=host, port=8080, env={"ANTHROPIC_API_KEY": "sk-x"})
            base = f"http://{host}:8080"
            async with httpx.AsyncClient(timeout=10.0) as client:
                for _ in range(80):
                    try:
                        if (await client.get(f"{base}/health")).status_code == 200:
                            break
                    except httpx.HTTPError:
                        await asyncio.sleep(0.25)
                health = (await client.get(f"{base}/health")).json()
                assert health["ok"] is True and health["attach"] is True
                good = {
                    "runId": "r1",
                    "threadId": "t1",
                    "messages": [{"role": "user", "content": "hi"}],
                    "harness": "claude-code",
                    "model": "claude-sonnet-4-5",
                    "workspace": {"secrets": ["ANTHROPIC_API_KEY"]},
                    "toolDescriptors": [],
                    "toolExecUrl": "http://host.docker.internal:1/tool-exec/r1",
                    "toolExecToken": "exec-token",
                }
                wrong = await client.post(f"{base}/run", json=good, headers={"Authorization": "Bearer wrong"})
                assert wrong.status_code == 401 and "token" in wrong.text
                none = await client.post(f"{base}/run", json=good)
                assert none.status_code == 401
                auth = {"Authorization": "Bearer right-token"}
                bad = await client.post(f"{base}/run", content=b"{not json", headers=auth)
                assert bad.status_code == 400 and "JSON" in bad.text
                nope = await client.post(f"{base}/run", json={**good, "harness": "nope"}, headers=auth)
                assert nope.status_code == 400 and "harness" in nope.text
                empty = await client.post(f"{base}/run", json={**good, "messages": []}, headers=auth)
                assert empty.status_code == 400 and "messages" in empty.text
                value = "sk-ant-secret-value-1234"
                leaked = {**good, "workspace": {"secrets": [value]}}
                refused = await client.post(f"{base}/run", json=leaked, headers=auth)
                assert refused.status_code == 400 and "names" in refused.text and value not in refused.text
                as_env = {**good, "workspace": {"secrets": [], "env": {"ANTHROPIC_API_KEY": value}}}
                refused = await client.post(f"{base}/run", json=as_env, headers=auth)
                assert refused.status_code == 400 and value not in refused.text
                absent = {**good, "workspace": {"secrets": ["NOT_SET_HERE"]}}
                refused = await client.post(f"{base}/run", json=absent, headers=auth)
                assert refused.status_code == 400 and "NOT_SET_HERE" in refused.text
                unknown = await client.post(f"{base}/runs/nope/cancel", headers=auth)
                assert unknown.status_code == 404
            await runner.kill()
        finally:
            await handle.destroy()

    asyncio.run(asyncio.wait_for(main(), 120))
    assert labelled_containers() == []  # this session's: a parallel session's containers are not this test's


def test_runner_ndjson_is_re_read_from_byte_0_after_a_disconnect() -> None:
    from boxwright.providers.docker import docker_sandbox

    # The Sleep keeps the run going while the probe asks mid-run.
    model = FakeModelServer({"hi": [Sleep(2.0), Text("Hello from the container.")]}, host=bridge_address())
    model.start()

    async def main() -> tuple[bytes, bytes]:
        handle = await docker_sandbox(RUNNER_IMAGE, labels={TEST_LABEL: "1"}).create()
        try:
            host = await handle.address()
            token = runner_token(RUNNER_SECRET, handle.id)
            env = {**model_env_in_container(model.base_url), "CLAUDE_CODE_MAX_RETRIES": "0"}
            runner = await spawn_runner(handle, token, host=host, port=8080, env=env)
            base, auth = f"http://{host}:8080", {"Authorization": f"Bearer {token}"}
            body = {
                "runId": "r-reread",
                "threadId": "t1",
                "messages": [{"role": "user", "content": "[[script:hi]] hi"}],
                "harness": "claude-code",
                "model": "claude-sonnet-4-5",
                "workspace": {"secrets": ["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "CLAUDE_CODE_MAX_RETRIES"]},
                "toolDescriptors": [],
                "toolExecUrl": "http://host.docker.internal:1/tool-exec/r-reread",
                "toolExecToken": "exec-token",
            }
            async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=120.0)) as client:
                for _ in range(80):
                    try:
                        if (await client.get(f"{base}/health")).status_code == 200:
                            break
                    except httpx.HTTPError:
                        await asyncio.sleep(0.25)
                async with client.stream("POST", f"{base}/run", json=body, headers=auth) as response:
                    assert response.status_code == 200
                    first = await response.aiter_lines().__anext__()  # then hang up mid-run
                # A reaper's probe asks the runner, read-only: going on, then ended.
                assert await probe_colocated_run_exit(handle, "r-reread", runner_secret=RUNNER_SECRET) == Producing()
                full = b""
                async with client.stream("GET", f"{base}/runs/r-reread/events?offset=0", headers=auth) as again:
                    async for chunk in again.aiter_bytes():
                        full += chunk
                assert await probe_colocated_run_exit(handle, "r-reread", runner_secret=RUNNER_SECRET) == Finished(0)
                unknown = await probe_colocated_run_exit(handle, "nope", runner_secret=RUNNER_SECRET)
                assert isinstance(unknown, Unknown) and "404" in str(unknown.error)
                foreign = await probe_colocated_run_exit(handle, "r-reread", runner_secret="another secret")
                assert isinstance(foreign, Unknown) and "401" in str(foreign.error)
            await runner.kill()
            return first.encode(), full
        finally:
            await handle.destroy()

    try:
        first, full = asyncio.run(asyncio.wait_for(main(), 180))
    finally:
        model.stop()
    lines = full.splitlines()
    assert lines[0] == first, "the re-read starts at byte 0 with the line already seen"
    assert b'"RUN_STARTED"' in lines[0] and b'"RUN_FINISHED"' in lines[-1], lines[-1][:200]
    from boxwright.events import TextMessageContentEvent, decode_event

    text = "".join(e.delta for e in map(decode_event, lines) if isinstance(e, TextMessageContentEvent))
    assert "Hello from the container." in text, "the run went on after the reader hung up"
