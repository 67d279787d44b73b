"""examples/chat_app on Starlette and on FastAPI, served by uvicorn on 127.0.0.1, with the real demo agent.

A run is started through the app's own routes (``/agent/runs`` behind its authorize callback); the
demo agent edits its sandbox, calls the app's ``style_guide`` tool over the bridge and waits on a
question before it runs the tests, so a run is reliably mid-way while a test does its part.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from boxwright.events import encode_event
from boxwright.stores.sqlite import open_database, sqlite_run_backend
from boxwright.tool_bridge.asgi import serve_asgi
from tests.support.viewer import SseFrame, sse_frames

APPROVAL = "demo:command:python3 -m unittest -q"
VARIANTS = ["starlette", "fastapi"]


@contextlib.asynccontextmanager
async def chat_app(tmp_path: Path, variant: str) -> AsyncIterator[httpx.AsyncClient]:
    if variant == "fastapi":
        from examples.chat_app.app_fastapi import create_app
    else:
        from examples.chat_app.app import create_app  # type: ignore[assignment]
    app = create_app(tmp_path / "chat.db", sandbox_base=str(tmp_path / "sandboxes"), pace_s=0.05)
    server = await serve_asgi(app, lifespan="on")
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            yield client
    finally:
        await server.close()


async def start(client: httpx.AsyncClient, user: str, thread_id: str) -> str:
    body = {"threadId": thread_id, "prompt": "Greet the team.", "metadata": {"harness": "demo"}}
    response = await client.post("/agent/runs", json=body, headers={"X-User": user})
    assert response.status_code == 202, response.text
    return str(response.json()["runId"])


async def stored(tmp_path: Path, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    db = open_database(tmp_path / "chat.db")
    try:
        _, log = sqlite_run_backend(db)
        return [(offset, json.loads(encode_event(e))) async for offset, e in log.read(run_id, "-1", live=False)]
    finally:
        await db.close()


async def wait_for(client: httpx.AsyncClient, user: str, run_id: str, thread_id: str, *statuses: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        response = await client.get(f"/agent/runs/{run_id}", params={"threadId": thread_id}, headers={"X-User": user})
        record: dict[str, Any] = response.json()
        if record.get("status") in statuses or time.monotonic() > deadline:
            return record
        await asyncio.sleep(0.05)


async def read_events(
    client: httpx.AsyncClient, path: str, headers: dict[str, str], *, until: int | None = None
) -> tuple[list[SseFrame], SseFrame | None]:
    """Frames read until ``until`` of them arrived (then the client drops the connection) or the status frame."""
    seen: list[SseFrame] = []
    async with client.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200, (await response.aread()).decode()
        async for frame in sse_frames(response):
            if frame.event == "status":
                return seen, frame
            seen.append(frame)
            if until is not None and len(seen) >= until:
                return seen, None
    return seen, None


@pytest.mark.parametrize("variant", VARIANTS)
def test_an_sse_client_that_drops_mid_run_resumes_from_its_offset_with_every_event_once(
    tmp_path: Path, variant: str
) -> None:
    async def main() -> None:
        async with chat_app(tmp_path, variant) as client:
            thread_id = f"alice-{uuid.uuid4().hex[:8]}"
            run_id = await start(client, "alice", thread_id)
            headers = {"X-User": "alice"}
            first, status = await read_events(client, f"/agent/runs/{run_id}/events", headers, until=8)
            assert status is None and len(first) == 8, "dropped mid-run"
            # The run goes on without its client: it reaches its question, which alice answers.
            deadline = time.monotonic() + 60
            while not any(
                e["type"] == "CUSTOM" and e.get("name") == "approval-requested"
                for _, e in await stored(tmp_path, run_id)
            ):
                assert time.monotonic() < deadline, "the run never asked"
                await asyncio.sleep(0.05)
            answer = {"approvalId": APPROVAL, "decision": "allow"}
            response = await client.post(f"/agent/runs/{run_id}/approval", json=answer, headers=headers)
            assert response.status_code == 200, response.text
            rest, status = await read_events(
                client, f"/agent/runs/{run_id}/events", {**headers, "Last-Event-ID": str(first[-1].id)}
            )
            assert status is not None and json.loads(status.data)["status"] == "completed"
            offsets = [frame.id for frame in first + rest]
            log = await stored(tmp_path, run_id)
            assert offsets == [offset for offset, _ in log], "every event exactly once, in order"
            names = [e.get("name") for _, e in log if e["type"] == "CUSTOM"]
            assert "tool_bridge.finished" in names and "approval-resolved" in names

    asyncio.run(main())


def _agent_processes(sandboxes: Path) -> list[int]:
    """Processes working in a sandbox under ``sandboxes`` (the agent's cwd is its workspace)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/cwd").startswith(str(sandboxes)):
                found.append(int(pid))
    return found


@pytest.mark.parametrize("variant", VARIANTS)
def test_cancel_stops_the_agent(tmp_path: Path, variant: str) -> None:
    async def main() -> None:
        async with chat_app(tmp_path, variant) as client:
            thread_id = f"alice-{uuid.uuid4().hex[:8]}"
            run_id = await start(client, "alice", thread_id)
            deadline = time.monotonic() + 60
            while not _agent_processes(tmp_path / "sandboxes"):
                assert time.monotonic() < deadline, "the agent never started"
                await asyncio.sleep(0.05)
            response = await client.post(f"/agent/runs/{run_id}/cancel", headers={"X-User": "alice"})
            assert response.status_code == 202, response.text
            record = await wait_for(client, "alice", run_id, thread_id, "completed", "failed", "aborted")
            assert record["status"] == "aborted"
            assert _agent_processes(tmp_path / "sandboxes") == [], "no agent process left"
            assert os.listdir(tmp_path / "sandboxes") == [], "its sandbox is gone"
            log = await stored(tmp_path, run_id)
            assert log[-1][1]["type"] == "RUN_ERROR", "nothing after the run's end"
            assert not any(e.get("name") == "approval-resolved" for _, e in log), "the agent never went on"

    asyncio.run(main())


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_user_the_authorize_callback_refuses_cannot_read_another_threads_run(tmp_path: Path, variant: str) -> None:
    async def main() -> None:
        async with chat_app(tmp_path, variant) as client:
            thread_id = f"t-{uuid.uuid4().hex[:8]}"
            run_id = await start(client, "alice", thread_id)
            bob = {"X-User": "bob"}
            params = {"threadId": thread_id}
            refused = [
                await client.get(f"/agent/runs/{run_id}", params=params, headers=bob),
                await client.get(f"/agent/runs/{run_id}/events", params=params, headers=bob),
                await client.get(f"/agent/runs/{run_id}/poll", params={**params, "wait": "0"}, headers=bob),
                await client.get(f"/agent/runs/{run_id}/stream", params={**params, "offset": "-1"}, headers=bob),
                await client.post(f"/agent/runs/{run_id}/cancel", params=params, headers=bob),
                await client.post(
                    f"/agent/runs/{run_id}/approval", json={"approvalId": APPROVAL, "decision": "allow"}, headers=bob
                ),
                await client.post(
                    "/agent/runs", json={"threadId": thread_id, "prompt": "mine now", "metadata": {}}, headers=bob
                ),
            ]
            assert [r.status_code for r in refused] == [403] * len(refused), [r.text for r in refused]
            assert all("another user" in r.json()["error"] for r in refused)
            anonymous = await client.get(f"/agent/runs/{run_id}/events")
            assert anonymous.status_code == 401
            # alice still reads her run, and it was never cancelled by bob's request.
            record = await wait_for(client, "alice", run_id, thread_id, "running")
            assert record["status"] == "running" and not record.get("cancelRequested")
            response = await client.post(f"/agent/runs/{run_id}/cancel", headers={"X-User": "alice"})
            assert response.status_code == 202
            await wait_for(client, "alice", run_id, thread_id, "aborted")

    asyncio.run(main())
