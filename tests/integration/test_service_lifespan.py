"""SandboxService as the app's lifespan, under a real uvicorn: what shutting the app down does to a run in flight.

``detach`` (the default): the record stays ``running`` and the claim's lease is released, so
another replica adopts the run at once (not after the lease's TTL) and finishes it; ``drain``: the
run finishes before the app has shut down; ``cancel``: it ends ``aborted`` / ``cancelled``.
"""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from boxwright.definition import define_sandbox
from boxwright.events import Event, TextMessageContentEvent
from boxwright.harnesses.command import command_harness
from boxwright.middleware import SandboxService, sandbox_routes
from boxwright.providers import local_process_sandbox
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from boxwright.tool_bridge import serve_asgi

AGENT = 'for i in 1 2 3 4 5 6 7 8; do echo "line $i"; sleep 0.25; done'
LINES = [f"line {i}\n" for i in range(1, 9)]
# Long: a lease left held at shutdown would keep a successor out for a minute, far past the test's bound.
LEASE_TTL_MS = 60_000


@pytest.fixture(autouse=True)
def _own_leaks_only() -> Iterator[None]:
    """Scope the ``error`` filter below to what a test leaks itself.

    Garbage an earlier test on this worker left (a socket, a child process) is collected at no fixed
    time; collected during one of these tests it would fail it. Collect it first, with warnings as
    usual, and collect again at the end so this test's own leaks surface here and not later.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        gc.collect()
    yield
    gc.collect()


def _deltas(events: list[Event]) -> list[str]:
    return [e.delta for e in events if isinstance(e, TextMessageContentEvent)]


def _service(database: Any, base: Path, **options: Any) -> SandboxService:
    runs, log = sqlite_run_backend(database)
    sandbox = define_sandbox("lifespan", local_process_sandbox(base_dir=base), file_events=False)
    return SandboxService(
        runs,
        log,
        locks=SqliteLockStore(database),
        store=SqliteInstanceStore(database),
        factory=lambda start: (sandbox, command_harness(AGENT)),
        lease_ttl_ms=LEASE_TTL_MS,
        **options,
    )


async def _run_then_shut_down(service: SandboxService, run_id: str) -> None:
    """Serve an app whose lifespan is the service, start a run, shut the app down at its 2nd line."""

    async def whoami(request: Request) -> PlainTextResponse:
        return PlainTextResponse(type(request.state.boxwright).__name__)

    app = Starlette(routes=[*sandbox_routes(service), Route("/whoami", whoami)], lifespan=service.lifespan)
    server = await serve_asgi(app, lifespan="on")
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            # The lifespan state carries the service: no middleware needed.
            assert (await client.get("/whoami")).text == "SandboxService"
            started = await client.post("/runs", json={"prompt": "go", "threadId": "t1", "runId": run_id})
            assert started.status_code == 202, started.text
        deadline = time.monotonic() + 30
        while "line 2\n" not in _deltas(await service.log.snapshot(run_id)):
            assert time.monotonic() < deadline, "the run never got going"
            await asyncio.sleep(0.05)
        assert service.active_runs == [run_id]
    finally:
        await server.close()  # uvicorn's shutdown: the lifespan exits, the service closes
    assert service.active_runs == []  # every run task ended with the lifespan


@pytest.mark.filterwarnings("error")
def test_detach_at_shutdown_keeps_the_run_running_and_frees_its_lease(tmp_path: Path) -> None:
    run_id = f"lifespan-{uuid.uuid4().hex}"

    async def main() -> None:
        async with open_database(tmp_path / "runs.db") as database:
            first = _service(database, tmp_path / "sb")  # on_close="detach" is the default
            await _run_then_shut_down(first, run_id)
            record = await first.runs.get(run_id)
            assert record is not None and record.status == "running", record
            assert record.detached_since is not None and record.sandbox_key
            assert not await first.log.is_closed(run_id)
            # Another replica adopts it at once: the lease was released, not left to expire.
            successor = _service(database, tmp_path / "sb")
            began = time.monotonic()
            async with successor:
                assert await successor.take_over_if_orphaned(run_id)
                final = await asyncio.wait_for(successor.wait_run(run_id), 30)
            assert time.monotonic() - began < LEASE_TTL_MS / 1000 / 2
            assert final is not None and final.status == "completed" and final.driver_epoch == 2, final
            assert _deltas(await successor.log.snapshot(run_id)) == LINES, "every line once, in order"

    asyncio.run(main(), debug=True)


@pytest.mark.filterwarnings("error")
def test_drain_at_shutdown_finishes_the_run_first(tmp_path: Path) -> None:
    run_id = f"lifespan-{uuid.uuid4().hex}"

    async def main() -> None:
        async with open_database(tmp_path / "runs.db") as database:
            service = _service(database, tmp_path / "sb", on_close="drain")
            await _run_then_shut_down(service, run_id)
            record = await service.runs.get(run_id)
            assert record is not None and record.status == "completed", record
            assert await service.log.is_closed(run_id)
            assert _deltas(await service.log.snapshot(run_id)) == LINES

    asyncio.run(main(), debug=True)


@pytest.mark.filterwarnings("error")
def test_cancel_at_shutdown_cancels_the_run(tmp_path: Path) -> None:
    run_id = f"lifespan-{uuid.uuid4().hex}"

    async def main() -> None:
        async with open_database(tmp_path / "runs.db") as database:
            service = _service(database, tmp_path / "sb", on_close="cancel")
            await _run_then_shut_down(service, run_id)
            record = await service.runs.get(run_id)
            assert record is not None and record.status == "aborted", record
            assert record.error is not None and record.error.code == "cancelled"
            assert record.cancel_requested is True
            assert list((tmp_path / "sb").iterdir()) == [], "a cancelled run's sandbox is destroyed"

    asyncio.run(main(), debug=True)


def test_a_closed_service_starts_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with open_database(tmp_path / "runs.db") as database:
            service = _service(database, tmp_path / "sb")
            async with service:
                pass
            app = Starlette(routes=sandbox_routes(service))
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
                refused = await client.post("/runs", json={"prompt": "go", "threadId": "t1"})
            assert refused.status_code == 503 and refused.json()["code"] == "service_closed"

    asyncio.run(main())
