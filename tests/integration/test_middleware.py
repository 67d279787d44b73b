"""SandboxMiddleware, SandboxService and sandbox_routes: the in-app deployment shape, end to end."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect

from boxwright.definition import define_sandbox
from boxwright.harnesses.command import command_harness
from boxwright.middleware import SandboxMiddleware, SandboxService, sandbox_routes
from boxwright.providers import local_process_sandbox
from boxwright.secrets import register_secret_values
from boxwright.stores.memory import MemoryInstanceStore, memory_run_backend
from tests.integration.test_delivery_sse import (
    agent_script,
    expected_text,
    read_sse,
    run_async,
    running_stack,
    sse_messages,
)


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


async def _until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def test_cancel_route_aborts_the_run_and_destroys_its_sandbox(tmp_path: Path) -> None:
    marker = f"41.{random.randrange(10**6, 10**7)}"  # a sleep duration no other process has

    async def main() -> None:
        async with running_stack(tmp_path) as stack:
            # A completed run keeps its sandbox (destroy_on_complete is off) ...
            kept = await stack.start(agent_script(1, 0))
            assert (await stack.service.wait_run(kept)).status == "completed"  # type: ignore[union-attr]
            kept_dirs = set(os.listdir(stack.sandboxes))
            assert len(kept_dirs) == 1
            # ... a cancelled one loses it, and its agent, whatever the lifecycle says.
            run_id = await stack.start(agent_script(2, 0, then=f"sleep {marker}"))
            tail = asyncio.ensure_future(read_sse(stack.client, f"/runs/{run_id}/events"))
            await _until(lambda: _processes_with(marker), 15, "the agent to start sleeping")
            assert len(os.listdir(stack.sandboxes)) == 2

            response = await stack.client.post(f"/runs/{run_id}/cancel")
            assert response.status_code == 202 and response.json() == {"runId": run_id, "cancelRequested": True}
            events, status = await asyncio.wait_for(tail, 15)
            assert status is not None
            assert status.json()["status"] == "aborted" and status.json()["error"]["code"] == "cancelled"
            assert events[-1].json()["type"] == "RUN_ERROR" and events[-1].json()["code"] == "cancelled"
            record = (await stack.client.get(f"/runs/{run_id}")).json()
            assert record["status"] == "aborted" and record["cancelRequested"] is True
            assert "finishedAt" in record and "cancel_requested" not in record
            assert set(os.listdir(stack.sandboxes)) == kept_dirs, "the cancelled run's sandbox directory is gone"
            await _until(lambda: not _processes_with(marker), 5, "the agent to be killed")
            assert run_id not in stack.service.active_runs

            # Cancelling a finished run changes nothing.
            again = await stack.client.post(f"/runs/{run_id}/cancel")
            assert again.status_code == 200 and again.json()["status"] == "aborted"
            assert again.json()["cancelRequested"] is True, "the answer agrees with the record"
            assert (await stack.client.get(f"/runs/{kept}")).json()["status"] == "completed"

    run_async(main)


def test_trigger_validates_dedupes_and_never_leaks_secrets(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with running_stack(tmp_path) as stack:
            client = stack.client
            for body, words in [
                ({"threadId": "t"}, "prompt"),
                ({"prompt": "echo", "threadId": ""}, "threadId"),
                ({"prompt": " ", "threadId": "t"}, "prompt"),
                ({"prompt": "echo", "threadId": "t", "runId": "a/b"}, "run id"),
                ({"prompt": 3, "threadId": "t"}, "prompt"),
            ]:
                response = await client.post("/runs", json=body)
                assert response.status_code == 400 and words in response.json()["error"], (body, response.text)
            assert (await client.post("/runs", content=b"{not json")).status_code == 400
            assert (await client.post("/runs", content=b" " * (2 * 1024 * 1024 + 1))).status_code == 413

            # X-Run-Id names the run; a retried trigger starts no second drive; another thread is a 409.
            script = agent_script(2, 0.05)
            headers = {"X-Run-Id": "run-1"}
            first = await client.post("/runs", json={"prompt": script, "threadId": "t1"}, headers=headers)
            second = await client.post("/runs", json={"prompt": script, "threadId": "t1"}, headers=headers)
            assert first.status_code == second.status_code == 202
            assert first.json() == second.json() == {"runId": "run-1"}
            clash = await client.post("/runs", json={"prompt": script, "threadId": "t2", "runId": "run-1"})
            assert clash.status_code == 409
            await stack.service.wait_run("run-1")
            stored = await stack.log_entries("run-1")
            assert [e["type"] for _, e in stored].count("RUN_STARTED") == 1
            record = (await client.get("/runs/run-1")).json()
            assert record["runId"] == "run-1" and record["threadId"] == "t1" and record["status"] == "completed"

    async def leaky() -> None:
        secret = "sk-test-" + "x" * 12
        register_secret_values([secret])

        def factory(request: Any) -> Any:
            raise RuntimeError(f"could not reach the model with {secret}")

        runs, events = memory_run_backend()
        service = SandboxService(runs, events, factory=factory)
        app = Starlette(routes=sandbox_routes(service))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
            with caplog.at_level(logging.DEBUG, logger="boxwright"):
                response = await client.post("/runs", json={"prompt": "hi", "threadId": "t"})
        assert response.status_code == 500 and secret not in response.text
        assert "could not reach the model" in caplog.text and secret not in caplog.text

    run_async(main)
    run_async(leaky)


def test_middleware_puts_the_service_on_request_state(tmp_path: Path) -> None:
    sandbox = define_sandbox("mw", local_process_sandbox(base_dir=tmp_path / "sb"), file_events=False)

    async def chat(request: Request) -> Response:
        # What an app does: start a run, answer with its SSE tail.
        service: SandboxService = request.state.boxwright
        body = await request.json()
        run_id = await service.start_run(sandbox, command_harness(agent_script(3, 0)), "go", thread_id=body["thread"])
        return await service.events_response(run_id, request)

    async def lifespan_value(request: Request) -> Response:
        return Response(json.dumps({"app": request.state.app_value, "same": request.state.boxwright is service}))

    async def whoami(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(type(websocket.state.boxwright).__name__)
        await websocket.close()

    runs, events = memory_run_backend()
    service = SandboxService(runs, events, store=MemoryInstanceStore())
    app = Starlette(
        routes=[Route("/chat", chat, methods=["POST"]), Route("/value", lifespan_value)],
        middleware=[Middleware(SandboxMiddleware, service=service)],
    )

    async def main() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
            response = await client.post("/chat", json={"thread": "t-mw"})
            assert response.status_code == 200
            messages = [m async for m in sse_messages(response)]
        assert messages[-1].event == "status" and messages[-1].json() == {"status": "completed"}
        deltas = "".join(m.json().get("delta", "") for m in messages[:-1])
        assert deltas == expected_text(3)
        await service.aclose()

        # Pure ASGI: lifespan state stays visible, the shared state dict is never written to.
        shared = {"app_value": 7}
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": "/value", "headers": [], "query_string": b"", "state": shared}
        await SandboxMiddleware(app.router, service)(scope, receive, send)
        assert json.loads(sent[-1]["body"]) == {"app": 7, "same": True}
        assert shared == {"app_value": 7}

    run_async(main)

    async def websocket_state() -> None:
        async with running_stack(tmp_path / "ws", extra_routes=[WebSocketRoute("/whoami", whoami)]) as stack:
            async with connect("ws" + stack.url.removeprefix("http") + "/whoami") as ws:
                assert await ws.recv() == "SandboxService"

    run_async(websocket_state)


def test_a_client_that_disconnects_never_stops_the_run(tmp_path: Path) -> None:
    async def main() -> None:
        async with running_stack(tmp_path) as stack:
            run_id = await stack.start(agent_script(6, 0.3))
            # Several clients come and go mid-run: SSE, long-poll, one after another.
            for _ in range(3):
                await read_sse(stack.client, f"/runs/{run_id}/events", stop=lambda seen: len(seen) >= 2)
            # Right after an event the next is 0.3 s away: a poll that gives up after 50 ms leaves mid-wait.
            await stack.client.get(f"/runs/{run_id}/poll?offset=now&wait=20000")
            with pytest.raises(httpx.ReadTimeout):
                await stack.client.get(f"/runs/{run_id}/poll?offset=now&wait=20000", timeout=0.05)
            await stack.wait_reads_closed()
            record = await stack.service.wait_run(run_id)
            assert record is not None and record.status == "completed" and record.detached_since is None
            assert (await stack.client.get(f"/runs/{run_id}")).json()["status"] == "completed"

    run_async(main)


# -- one client run id, many requests at once (issue 10, point 7) ----------------------------------


@pytest.mark.parametrize("backend", ["memory", "sqlite", "two-services-one-sqlite"])
def test_concurrent_starts_of_one_run_id_one_wins_and_the_rest_name_its_thread(tmp_path: Path, backend: str) -> None:
    """20 POST /runs at once, one run id, 20 threads: one 202, nineteen 409s naming the winner's thread.

    The same thread asking again (the idempotent retry) still gets 202 and the same run.
    """
    from boxwright.stores.sqlite import open_database, sqlite_run_backend
    from boxwright.tool_bridge import serve_asgi

    sandbox = define_sandbox("race", local_process_sandbox(base_dir=tmp_path / "sb"), file_events=False)

    def factory(body: Any) -> Any:
        return sandbox, command_harness("sleep 0.3; echo done")

    async def main() -> None:
        db = open_database(tmp_path / "race.db") if backend != "memory" else None
        services = []
        for _ in range(2 if backend == "two-services-one-sqlite" else 1):
            runs, log = memory_run_backend() if db is None else sqlite_run_backend(db)
            services.append(SandboxService(runs, log, store=MemoryInstanceStore(), factory=factory))
        servers = [await serve_asgi(Starlette(routes=sandbox_routes(service))) for service in services]
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                run_id = f"client-{random.getrandbits(40):x}"

                async def post(i: int) -> httpx.Response:
                    url = servers[i % len(servers)].url + "/runs"
                    return await client.post(url, json={"prompt": "go", "threadId": f"t-{i}", "runId": run_id})

                answers = await asyncio.gather(*(post(i) for i in range(20)))
                codes = sorted(a.status_code for a in answers)
                assert codes == [202] + [409] * 19, codes
                [winner] = [i for i, a in enumerate(answers) if a.status_code == 202]
                assert answers[winner].json() == {"runId": run_id}
                for answer in answers:
                    if answer.status_code == 409:
                        body = answer.json()
                        assert body["code"] == "thread_mismatch"
                        assert body["ownerThreadId"] == f"t-{winner}", body
                # The winner's retry, on any replica: the same run, accepted again; nothing new started.
                for server in servers:
                    again = await client.post(
                        server.url + "/runs", json={"prompt": "go", "threadId": f"t-{winner}", "runId": run_id}
                    )
                    assert (again.status_code, again.json()) == (202, {"runId": run_id})
                driving = [s for s in services if run_id in s.active_runs]
                assert len(driving) <= 1
                record = await services[0].wait_run(run_id) if services[0] in driving or not driving else None
                record = record or await driving[0].wait_run(run_id)
                assert record is not None and record.thread_id == f"t-{winner}" and record.status == "completed"
        finally:
            for server in servers:
                await server.close()
            for service in services:
                await service.aclose(cancel=True)
            if db is not None:
                await db.close()

    run_async(main)


# -- every tail route takes an orphaned run over (issue 10, point 5) ------------------------------


async def _successor(orphan: Any) -> Any:
    from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
    from tests.support.orphans import LEASE_TTL_MS

    database = open_database(orphan.db)
    runs, log = sqlite_run_backend(database)
    sandbox = define_sandbox("svc", local_process_sandbox(base_dir=orphan.base))
    service = SandboxService(
        runs,
        log,
        locks=SqliteLockStore(database),
        store=SqliteInstanceStore(database),
        factory=lambda start: (sandbox, command_harness(orphan.agent)),
        lease_ttl_ms=LEASE_TTL_MS,
    )
    return database, runs, service


@pytest.mark.parametrize("route", ["long-poll", "websocket"])
def test_a_tail_of_an_orphaned_run_takes_it_over_like_sse(tmp_path: Path, route: str) -> None:
    """The driver process is SIGKILLed mid-run; a long-poll or WebSocket client of another replica
    makes that replica adopt the run, and reads every line once, in order, to the end."""
    from boxwright.events import TextMessageContentEvent, decode_event
    from boxwright.tool_bridge import serve_asgi
    from tests.support.orphans import orphan_a_run

    orphan = orphan_a_run(tmp_path)

    async def main() -> tuple[list[str], str, int | None]:
        database, runs, service = await _successor(orphan)
        server = await serve_asgi(Starlette(routes=sandbox_routes(service)))
        deltas: list[str] = []
        status = ""
        try:
            if route == "long-poll":
                async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                    offset, closed = "-1", False
                    deadline = time.monotonic() + 60
                    while not closed:
                        assert time.monotonic() < deadline, "the orphaned run never ended"
                        page = (await client.get(f"/runs/{orphan.run_id}/poll?offset={offset}&wait=5000")).json()
                        for item in page["events"]:
                            event = decode_event(json.dumps(item["event"]))
                            if isinstance(event, TextMessageContentEvent):
                                deltas.append(event.delta)
                        offset, closed, status = page["nextOffset"], page["closed"], page["status"]
            else:
                url = "ws" + server.url.removeprefix("http") + f"/runs/{orphan.run_id}/ws?offset=-1"
                async with connect(url, open_timeout=30) as ws:
                    async for raw in ws:
                        frame = json.loads(raw)
                        if frame.get("closed"):
                            status = frame["status"]
                            break
                        event = decode_event(json.dumps(frame["event"]))
                        if isinstance(event, TextMessageContentEvent):
                            deltas.append(event.delta)
            await service.wait_run(orphan.run_id)
        finally:
            await server.close()
            await service.aclose()
        record = await runs.get(orphan.run_id)
        await database.close()
        return deltas, status, record.driver_epoch if record is not None else None

    deltas, status, epoch = asyncio.run(main())
    assert status == "completed"
    assert epoch == 2, "the replica drove the rest under a new claim"
    assert deltas == [f"line {i}\n" for i in range(1, 9)], "every line exactly once, in order"
