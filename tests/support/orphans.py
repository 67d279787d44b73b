"""An orphaned durable run: a SandboxService process starts it over a SQLite file and is SIGKILLed mid-run.

The agent goes on writing its journal in its local-process sandbox; another SandboxService over the
same file (the test's) may take it over.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Slow enough that the successor has lines left to drive; each line once, in order.
SLOW_AGENT = 'for i in 1 2 3 4 5 6 7 8; do echo "line $i"; sleep 0.25; done'
LEASE_TTL_MS = 1500

_DRIVER = textwrap.dedent(
    """
    import asyncio, sys
    sys.path.insert(0, {root!r})
    from boxwright.definition import define_sandbox
    from boxwright.harnesses.command import command_harness
    from boxwright.middleware import SandboxService
    from boxwright.providers import local_process_sandbox
    from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend

    async def main():
        db = open_database({db!r})
        runs, log = sqlite_run_backend(db)
        service = SandboxService(
            runs, log, locks=SqliteLockStore(db), store=SqliteInstanceStore(db), lease_ttl_ms={ttl}
        )
        sandbox = define_sandbox("svc", local_process_sandbox(base_dir={base!r}))
        await service.start_run(sandbox, command_harness({agent!r}), "go", thread_id="t1", run_id={run_id!r})
        async for _offset, event in log.read({run_id!r}, "-1"):
            if getattr(event, "delta", "") == "line 2\\n":
                print("mid-run", flush=True)
                await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


@dataclass(frozen=True)
class Orphan:
    db: str
    base: str
    run_id: str
    agent: str = SLOW_AGENT


def orphan_a_run(tmp_path: Path, *, agent: str = SLOW_AGENT) -> Orphan:
    """Start a run in a driver process, wait until it delivered 2 lines, SIGKILL the driver."""
    db, base = str(tmp_path / "svc.db"), str(tmp_path / "sandboxes")
    # Journals of local-process sandboxes share the host's /tmp: a run id of this test's own.
    run_id = f"orphan-{uuid.uuid4().hex}"
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER.format(root=str(ROOT), db=db, base=base, agent=agent, run_id=run_id, ttl=LEASE_TTL_MS))
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=dict(os.environ))
    assert driver.stdout is not None
    try:
        assert driver.stdout.readline().strip() == b"mid-run"
    finally:
        driver.send_signal(signal.SIGKILL)  # the driver dies; the agent goes on writing its journal
        driver.wait(timeout=10)
        driver.stdout.close()
    return Orphan(db=db, base=base, run_id=run_id, agent=agent)
