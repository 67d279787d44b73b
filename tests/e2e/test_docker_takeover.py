"""Takeover on Docker (host-driven mode): a SandboxService process driving an agent in a container is SIGKILLed
mid-run; another SandboxService over the same SQLite file resumes the container by id, re-attaches to the agent's
journal inside it and finishes the run when a client asks for its events. The container is destroyed at the end."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette

from boxwright.definition import EnsureContext, define_sandbox
from boxwright.events import TextMessageContentEvent, decode_event
from boxwright.harnesses.command import command_harness
from boxwright.middleware import SandboxService, sandbox_routes
from boxwright.providers.docker import docker_sandbox
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from tests.support.docker import BASE_IMAGE, TEST_LABEL, image_problem, labelled_containers, no_leaked_containers
from tests.support.require import missing

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leaked_containers")]
__all__ = ["no_leaked_containers"]
AGENT = 'for i in 1 2 3 4 5 6 7 8; do echo "line $i"; sleep 0.25; done'

HOST_A = textwrap.dedent(
    """
    import asyncio, sys
    sys.path.insert(0, {root!r})
    from boxwright.definition import define_sandbox
    from boxwright.harnesses.command import command_harness
    from boxwright.middleware import SandboxService
    from boxwright.providers.docker import docker_sandbox
    from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend

    async def main():
        db = open_database({db!r})
        runs, log = sqlite_run_backend(db)
        service = SandboxService(runs, log, locks=SqliteLockStore(db), store=SqliteInstanceStore(db), lease_ttl_ms=1500)
        sandbox = define_sandbox("svc", docker_sandbox({image!r}, labels={labels!r}))
        await service.start_run(sandbox, command_harness({agent!r}), "go", thread_id="t1", run_id={run_id!r})
        async for _offset, event in log.read({run_id!r}, "-1"):
            if getattr(event, "delta", "") == "line 2\\n":
                print("mid-run", flush=True)
                await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


def test_another_service_takes_a_sigkilled_hosts_docker_run_over(tmp_path: Path) -> None:
    if (problem := image_problem(BASE_IMAGE)) is not None:
        missing(problem)
    db = str(tmp_path / "svc.db")
    labels = {TEST_LABEL: "1"}
    script = tmp_path / "host_a.py"
    run_id = f"svc-{uuid.uuid4().hex}"
    script.write_text(HOST_A.format(root=str(ROOT), db=db, image=BASE_IMAGE, labels=labels, agent=AGENT, run_id=run_id))
    host_a = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=dict(os.environ))
    assert host_a.stdout is not None
    assert host_a.stdout.readline().strip() == b"mid-run"
    host_a.send_signal(signal.SIGKILL)  # the driver dies; the agent goes on writing its journal
    host_a.wait(timeout=10)

    async def main() -> tuple[list[str], dict[str, object]]:
        async with open_database(db) as database:
            runs, log = sqlite_run_backend(database)
            sandbox = define_sandbox("svc", docker_sandbox(BASE_IMAGE, labels=labels))
            service = SandboxService(
                runs,
                log,
                locks=SqliteLockStore(database),
                store=SqliteInstanceStore(database),
                factory=lambda start: (sandbox, command_harness(AGENT)),
                lease_ttl_ms=1500,
            )
            app = Starlette(routes=sandbox_routes(service))
            transport = httpx.ASGITransport(app=app)
            deltas: list[str] = []
            status: dict[str, object] = {}
            async with httpx.AsyncClient(transport=transport, base_url="http://host-b") as client:
                async with client.stream("GET", f"/runs/{run_id}/events", timeout=60) as response:
                    assert response.status_code == 200
                    kind, data = "message", ""
                    async for line in response.aiter_lines():
                        if line.startswith("event:"):
                            kind = line.split(":", 1)[1].strip()
                        elif line.startswith("data:"):
                            data = line.split(":", 1)[1].strip()
                        elif line == "" and data:
                            if kind == "status":
                                status = json.loads(data)
                                break
                            event = decode_event(data)
                            if isinstance(event, TextMessageContentEvent):
                                deltas.append(event.delta)
                            kind, data = "message", ""
            await service.aclose()
            instances = SqliteInstanceStore(database)
            again = await sandbox.ensure_existing(EnsureContext(thread_id="t1", run_id="check", store=instances))
            if again is not None:
                await again.handle.destroy()
            record = await runs.get(run_id)
            assert record is not None and record.driver_epoch == 2, "host B drove the rest under a new claim"
            return deltas, status

    deltas, status = asyncio.run(main())
    assert status["status"] == "completed"
    assert deltas == [f"line {i}\n" for i in range(1, 9)], "every line exactly once, in order"
    assert labelled_containers() == [], "the run's container outlived the test"
