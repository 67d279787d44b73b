"""The durable SIGKILL takeover of one real agent CLI, shared by the per-harness takeover tests.

A SandboxService process (host A) drives a journaled run of the real CLI against the fake model and is
SIGKILLed while the agent's second shell command runs; another SandboxService over the same SQLite file
(host B) takes the run over when a client asks for its events, and the run completes.
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
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from starlette.applications import Starlette

from boxwright.definition import define_sandbox
from boxwright.events import TextMessageContentEvent, ToolCallResultEvent, ToolCallStartEvent, decode_event
from boxwright.middleware import SandboxService, sandbox_routes
from boxwright.providers import local_process_sandbox
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from tests.fixtures.fake_model import FakeModelServer, Step, Text
from tests.support.agent_harnesses import HARNESS_FOR, SHELL_CALL

ROOT = Path(__file__).resolve().parents[2]
FINAL = "Finished after the pause."
TAKEOVER_TIMEOUT = 180.0  # seconds, host B's whole read; a healthy one takes 5-15 s here

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


def pause_script(agent: str) -> list[Step]:
    """Two shell commands, the second one slow (the kill lands in it), then the final text."""
    shell = SHELL_CALL[agent]
    return [shell("echo first"), shell("sleep 4; echo second"), Text(FINAL)]


@dataclass
class TakenOver:
    deltas: list[str] = field(default_factory=list)
    starts: list[str] = field(default_factory=list)
    results: list[str] = field(default_factory=list)
    status: dict[str, object] = field(default_factory=dict)
    epoch: int | None = None
    last_request: str = ""  # the fake model's last recorded request body: what the agent told it at the end


def kill_host_then_take_over(agent: str, executable: str, tmp_path: Path) -> TakenOver:
    """Host A starts the run and is SIGKILLed mid-command; host B's client reads it to its end."""
    db, base, home = str(tmp_path / "svc.db"), str(tmp_path / "sandboxes"), str(tmp_path / "home")
    os.makedirs(home)
    run_id = f"svc-{agent}-{uuid.uuid4().hex}"  # journals of local-process sandboxes share the host's /tmp
    with FakeModelServer({"pause": pause_script(agent)}) as model:
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

        async def main() -> TakenOver:
            seen = TakenOver()
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
                async with httpx.AsyncClient(transport=transport, base_url="http://host-b") as client:
                    async with client.stream("GET", f"/runs/{run_id}/events", timeout=TAKEOVER_TIMEOUT) as response:
                        assert response.status_code == 200
                        kind, data = "message", ""
                        async for line in response.aiter_lines():
                            if line.startswith("event:"):
                                kind = line.split(":", 1)[1].strip()
                            elif line.startswith("data:"):
                                data = line.split(":", 1)[1].strip()
                            elif line == "" and data:
                                if kind == "status":
                                    seen.status = json.loads(data)
                                    break
                                event = decode_event(data)
                                if isinstance(event, TextMessageContentEvent):
                                    seen.deltas.append(event.delta)
                                elif isinstance(event, ToolCallStartEvent):
                                    seen.starts.append(event.tool_call_id)
                                elif isinstance(event, ToolCallResultEvent):
                                    seen.results.append(str(event.content))
                                kind, data = "message", ""
                await service.aclose()
                record = await runs.get(run_id)
                seen.epoch = record.driver_epoch if record is not None else None
            return seen

        seen = asyncio.run(asyncio.wait_for(main(), TAKEOVER_TIMEOUT))
        requests = model.model_requests()
        seen.last_request = str(requests[-1].body) if requests else ""
        return seen
