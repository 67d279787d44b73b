"""The SIGKILL takeover in co-located mode: the runner in the container drives the REAL `claude` against the fake
model on the host; the app host that started the run (a real app under uvicorn, a subprocess) is SIGKILLed while the
agent is in a tool call; a second host process takes the run over by attaching to the runner, and the run completes.

Also the runner's attach route refuses a wrong token (401) and an unknown run id (404), a successor with no runner
to attach to says so, and a durable co-located run with no runner secret is refused before it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from boxwright.colocated import ColocatedRunError, colocated_drive, runner_token
from boxwright.events import (
    CustomEvent,
    RunFinishedEvent,
    RunStartedEvent,
    TextMessageContentEvent,
    TextMessageStartEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    chunk_fingerprint,
)
from boxwright.harnesses.base import Message
from boxwright.runner.launch import spawn_runner
from boxwright.scrub import EventScrubber
from tests.fixtures.fake_model import FakeModelServer, Text, ToolCall
from tests.support.docker import (
    CASE_LABEL,
    RUNNER_IMAGE,
    RUNNER_SECRET,
    TEST_LABEL,
    bridge_address,
    labelled_containers,
    model_env_in_container,
    no_leaked_containers,
    remove_images,
    runner_image,
    snapshots_of,
)
from tests.support.replicas import ROOT, free_port, record_row, stored_events, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leaked_containers", "runner_image")]
__all__ = ["no_leaked_containers", "runner_image"]
INTRO = "I will change the greeting in the readme first, then read the todos."
# The Bash call the host dies in: long enough that the agent is still in it when the host is gone.
EDIT = "sed -i 's/hello/hello from claude/' README.md && sleep 3"


@contextlib.contextmanager
def host(
    name: str, tmp: Path, db: Path, calls: Path, model_url: str, case: str
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """One app host process (tests.support.colocated_app) on a free port; killed on exit."""
    port = free_port()
    env = {
        **os.environ,
        "BOXWRIGHT_RUNNER_SECRET": RUNNER_SECRET,
        **model_env_in_container(model_url),
        "CLAUDE_CODE_MAX_RETRIES": "0",
    }
    argv = [sys.executable, "-m", "tests.support.colocated_app", "--db", str(db), "--port", str(port)]
    argv += ["--name", name, "--calls", str(calls), "--image", RUNNER_IMAGE, "--label", TEST_LABEL, "--case", case]
    with open(tmp / f"{name}.stderr", "wb") as stderr:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, env=env)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().decode().strip()
            assert line == f"listening {port}", f"{name} did not start: {(tmp / f'{name}.stderr').read_text()[-3000:]}"
            yield f"http://127.0.0.1:{port}", proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


def tail_to_status(url: str, run_id: str, timeout: float) -> dict[str, object]:
    """Tail the run's SSE events on ``url`` (which takes an orphaned run over) until its status frame."""
    kind = "message"
    with httpx.stream("GET", f"{url}/runs/{run_id}/events?offset=-1", timeout=httpx.Timeout(30, read=timeout)) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("event:"):
                kind = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and kind == "status":
                status: dict[str, object] = json.loads(line.split(":", 1)[1])
                return status
    raise AssertionError("the tail ended without a status frame")


def test_a_successor_host_attaches_to_the_runner_after_a_sigkill_mid_tool_call(tmp_path: Path) -> None:
    model = FakeModelServer(
        {
            "takeover": [
                # Text host A stores before it dies: host B re-derives it and must match it event for event.
                ToolCall("Bash", {"command": EDIT, "description": "edit the readme"}, text=INTRO),
                ToolCall("mcp__boxwright__get_todos", {"status": "open"}),  # made while no host answers
                ToolCall("mcp__boxwright__get_todos", {"status": "done"}),  # made once host B attached
                Text("I edited it and read your todos."),
            ]
        },
        host=bridge_address(),
    )
    model.start()
    db, calls, run_id = tmp_path / "hosts.db", tmp_path / "calls.log", f"r-co-{uuid.uuid4().hex[:12]}"
    containers: list[str] = []
    try:
        with host("host-a", tmp_path, db, calls, model.base_url, run_id) as (a_url, a_proc):
            body = {"prompt": "[[script:takeover]] edit README.md, then read my todos", "threadId": "t-co"}
            started = httpx.post(f"{a_url}/runs", json={**body, "runId": run_id}, timeout=30)
            assert started.status_code == 202, started.text

            def in_bash() -> bool:
                events = stored_events(db, run_id) if db.exists() else []
                return any(isinstance(e, ToolCallStartEvent) and e.tool_call_name == "Bash" for e in events)

            try:
                wait_for("the agent to be in its Bash call", in_bash, timeout=180, interval=0.1)
            except AssertionError as exc:
                stored = [e.type for e in stored_events(db, run_id)] if db.exists() else []
                said = (tmp_path / "host-a.stderr").read_text()[-2000:]
                raise AssertionError(f"{exc}; stored {stored}; host A said: {said}") from None
            a_proc.send_signal(signal.SIGKILL)  # the host dies; the runner and the agent go on in the box
            containers += labelled_containers(f"{CASE_LABEL}={run_id}")
            a_proc.wait(timeout=10)
        killed_at = time.monotonic()
        # With no host at all, the agent goes on: its Bash call ends, the model asks for the host tool, and the
        # agent calls it; the call is held in the runner (not failed) until a successor attaches.
        model.wait_for_request(lambda r: r.script == "takeover" and r.step == 1, timeout=60)
        time.sleep(1.0)
        before = stored_events(db, run_id)
        assert not any(isinstance(e, RunFinishedEvent) for e in before)
        stored_text = "".join(e.delta for e in before if isinstance(e, TextMessageContentEvent))
        assert stored_text == INTRO, "host A stored the text before the call it died in"
        with host("host-b", tmp_path, db, calls, model.base_url, run_id) as (b_url, _b_proc):
            status = tail_to_status(b_url, run_id, timeout=180)
            taken_over_in = time.monotonic() - killed_at
            requests = model.model_requests()
    finally:
        model.stop()
        # The workspace's after-setup snapshot outlives its sandbox by design: this test's own cleanup.
        remove_images([ref for container in containers for ref in snapshots_of(container)])
    assert containers, "the run's container was found by its label"
    assert status["status"] == "completed", status
    events = stored_events(db, run_id)
    types = [e.type for e in events]
    assert events[: len(before)] == before, "the successor appended after what host A stored, changing nothing"
    assert sum(isinstance(e, RunStartedEvent) for e in events) == 1, types
    assert sum(isinstance(e, RunFinishedEvent) for e in events) == 1 and types[-1] == "RUN_FINISHED", types
    # Exactly once: no event is stored twice (a replayed prefix appended again would repeat fingerprints).
    fingerprints = [chunk_fingerprint(e) for e in events]
    assert len(set(fingerprints)) == len(fingerprints), "an event is stored twice"
    starts = [e for e in events if isinstance(e, ToolCallStartEvent)]
    assert [s.tool_call_name for s in starts] == ["Bash", "get_todos", "get_todos"], starts
    results = {e.tool_call_id: e for e in events if isinstance(e, ToolCallResultEvent)}
    assert set(results) == {s.tool_call_id for s in starts}, "no gap: every started call has its result"
    # The host tool call made while no host answered was held, and reached the successor once it attached.
    assert calls.read_text() == "host-b open\nhost-b done\n", "each host tool call ran once, on host B"
    assert "served by host-b" in str(results[starts[1].tool_call_id].content)
    assert "[done], served by host-b" in str(results[starts[2].tool_call_id].content)
    assert "served by host-b" in str(requests[-1].body["messages"])
    assert len([e for e in events if isinstance(e, TextMessageStartEvent)]) == len(
        {e.message_id for e in events if isinstance(e, TextMessageStartEvent)}
    )
    text = "".join(e.delta for e in events if isinstance(e, TextMessageContentEvent))
    assert "I edited it and read your todos." in text
    changed = [e for e in events if isinstance(e, CustomEvent) and e.name == "file.changed"]
    assert len(changed) == 1 and "+hello from claude" in changed[0].value["diff"], types
    row = record_row(db, run_id)
    assert row is not None and row["driver_epoch"] == 2, "host B drove the rest under a new claim"
    print(f"\ntakeover: SIGKILL to completed run in {taken_over_in:.2f} s")
    wait_for("the run's container to be removed", lambda: labelled_containers() == [], timeout=30, interval=0.2)


def test_runner_attach_refuses_a_wrong_token_and_an_unknown_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from boxwright.providers.docker import docker_sandbox

    monkeypatch.delenv("BOXWRIGHT_RUNNER_SECRET", raising=False)

    async def drive(handle: object, **options: object) -> None:
        stream = colocated_drive(
            handle,  # type: ignore[arg-type]
            None,
            run_id="r1",
            thread_id="t1",
            messages=[Message(role="user", content="hi")],
            tools=[],
            host_env={},
            scrub=EventScrubber(),
            signal=None,
            durable=True,
            **options,  # type: ignore[arg-type]
        )
        async with contextlib.aclosing(stream):
            async for _event in stream:
                pass

    async def main() -> None:
        handle = await docker_sandbox(RUNNER_IMAGE, labels={TEST_LABEL: "1"}).create()
        try:
            host = await handle.address()
            # No runner answers in the box: a successor says the run cannot be re-attached, and why.
            with pytest.raises(ColocatedRunError, match="driver lost; runner cannot re-attach: ConnectError"):
                await drive(handle, attach=True, runner_secret=RUNNER_SECRET)
            # A durable run whose token no other host could derive is refused before anything starts.
            with pytest.raises(ColocatedRunError, match=r"needs a runner secret .* set \$BOXWRIGHT_RUNNER_SECRET"):
                await drive(handle)
            token = runner_token(RUNNER_SECRET, handle.id)
            runner = await spawn_runner(handle, token, host=host, port=8080)
            base = f"http://{host}:8080"
            async with httpx.AsyncClient(timeout=10.0) as client:
                for _ in range(80):
                    with contextlib.suppress(httpx.HTTPError):
                        if (await client.get(f"{base}/health")).status_code == 200:
                            break
                    await asyncio.sleep(0.25)
                assert (await client.get(f"{base}/health")).json()["attach"] is True
                move = {"toolExecUrl": "http://host.docker.internal:1/tool-exec/r1", "toolExecToken": "t"}
                wrong = await client.post(f"{base}/runs/r1/attach", json=move, headers={"Authorization": "Bearer x"})
                assert wrong.status_code == 401 and "token" in wrong.text
                bare = await client.post(f"{base}/runs/r1/attach", json=move)
                assert bare.status_code == 401
                other = runner_token(RUNNER_SECRET, "another-container")
                assert other != token, "the token is per container"
                foreign = await client.post(f"{base}/run", json={}, headers={"Authorization": f"Bearer {other}"})
                assert foreign.status_code == 401
                right = {"Authorization": f"Bearer {token}"}
                unknown = await client.post(f"{base}/runs/no-such-run/attach", json=move, headers=right)
                assert unknown.status_code == 404 and "unknown run" in unknown.text
                assert (await client.post(f"{base}/shutdown", headers={"Authorization": "Bearer x"})).status_code == 401
                assert (await client.post(f"{base}/shutdown", headers=right)).status_code == 202
                assert await asyncio.wait_for(runner.wait(), 20) == 0, "the runner exits on /shutdown"
        finally:
            await handle.destroy()

    asyncio.run(asyncio.wait_for(main(), 120))
