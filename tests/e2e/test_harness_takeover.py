"""The durable SIGKILL takeover, once per harness, with the REAL codex and opencode CLIs against the fake model.

A SandboxService process drives a journaled run of the real CLI and is SIGKILLed while the agent's second
shell command runs; another SandboxService over the same SQLite file takes the run over when a client asks
for its events, and the run completes: every tool call and the final text exactly once, under epoch 2.
"""

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

from boxwright.definition import define_sandbox
from boxwright.events import TextMessageContentEvent, ToolCallResultEvent, ToolCallStartEvent, decode_event
from boxwright.middleware import SandboxService, sandbox_routes
from boxwright.providers import local_process_sandbox
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from tests.fixtures.fake_model import FakeModelServer, Text, ToolCall
from tests.support.agent_harnesses import HARNESS_FOR
from tests.support.agent_procs import agent_left
from tests.support.require import agent_cli

ROOT = Path(__file__).resolve().parents[2]
FINAL = "Finished after the pause."
SCRIPTS = {
    "codex": [
        ToolCall("exec_command", {"cmd": "echo first"}),
        ToolCall("exec_command", {"cmd": "sleep 4; echo second"}),
        Text(FINAL),
    ],
    "opencode": [
        ToolCall("bash", {"command": "echo first", "description": "first"}),
        ToolCall("bash", {"command": "sleep 4; echo second", "description": "second"}),
        Text(FINAL),
    ],
}

HOST_A = textwrap.dedent(
    """
    import asyncio, sys
    sys.path.insert(0, {root!r})
    from boxwright.definition import define_sandbox
    from boxwright.middleware import SandboxService
    from boxwright.providers import local_process_sandbox
    from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
    from tests.support.agent_harnesses import HARNESS_FOR

    async def main():
        db = open_database({db!r})
        runs, log = sqlite_run_backend(db)
        service = SandboxService(runs, log, locks=SqliteLockStore(db), store=SqliteInstanceStore(db), lease_ttl_ms=1500)
        sandbox = define_sandbox("svc", local_process_sandbox(base_dir={base!r}))
        harness = HARNESS_FOR[{agent!r}]({model!r}, {home!r}, {executable!r})
        await service.start_run(sandbox, harness, "[[script:pause]] two commands", thread_id="t1", run_id={run_id!r})
        async for _offset, event in log.read({run_id!r}, "-1"):
            if event.type == "TOOL_CALL_RESULT":  # the first command is done; the second one runs now
                print("mid-run", flush=True)
                await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("agent", ["codex", "opencode"])
def test_another_service_takes_over_a_killed_hosts_cli_run(agent: str, tmp_path: Path) -> None:
    executable = agent_cli(agent)
    db, base, home = str(tmp_path / "svc.db"), str(tmp_path / "sandboxes"), str(tmp_path / "home")
    os.makedirs(home)
    run_id = f"svc-{agent}-{uuid.uuid4().hex}"  # journals of local-process sandboxes share the host's /tmp
    with FakeModelServer({"pause": SCRIPTS[agent]}) as model:
        script = tmp_path / "host_a.py"
        script.write_text(
            HOST_A.format(
                root=str(ROOT),
                db=db,
                base=base,
                agent=agent,
                model=model.base_url,
                home=home,
                executable=executable,
                run_id=run_id,
            )
        )
        host_a = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=dict(os.environ))
        try:
            assert host_a.stdout is not None
            assert host_a.stdout.readline().strip() == b"mid-run"
        finally:
            host_a.send_signal(signal.SIGKILL)  # the driver dies; the agent goes on writing its journal
            host_a.wait(timeout=10)

        async def main() -> tuple[list[str], list[str], list[str], dict[str, object]]:
            async with open_database(db) as database:
                runs, log = sqlite_run_backend(database)
                sandbox = define_sandbox("svc", local_process_sandbox(base_dir=base))
                harness = HARNESS_FOR[agent](model.base_url, home, executable)
                service = SandboxService(
                    runs,
                    log,
                    locks=SqliteLockStore(database),
                    store=SqliteInstanceStore(database),
                    factory=lambda start: (sandbox, harness),
                    lease_ttl_ms=1500,
                )
                app = Starlette(routes=sandbox_routes(service))
                transport = httpx.ASGITransport(app=app)
                deltas: list[str] = []
                starts: list[str] = []
                results: list[str] = []
                status: dict[str, object] = {}
                async with httpx.AsyncClient(transport=transport, base_url="http://host-b") as client:
                    async with client.stream("GET", f"/runs/{run_id}/events", timeout=120) as response:
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
                                elif isinstance(event, ToolCallStartEvent):
                                    starts.append(event.tool_call_id)
                                elif isinstance(event, ToolCallResultEvent):
                                    results.append(str(event.content))
                                kind, data = "message", ""
                await service.aclose()
                record = await runs.get(run_id)
                assert record is not None and record.driver_epoch == 2, "host B drove the rest under a new claim"
                return deltas, starts, results, status

        deltas, starts, results, status = asyncio.run(asyncio.wait_for(main(), 180))
    assert status["status"] == "completed", status
    assert "".join(deltas) == FINAL, "the final text exactly once"
    assert len(starts) == 2 and len(set(starts)) == 2 and len(results) == 2, (starts, results)
    assert "first" in results[0] and "second" in results[1]
    assert agent_left(f"HOME={home}") == []
