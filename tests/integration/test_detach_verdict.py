"""R39: a durable run whose driver stops without a cancel detaches: log open, status running, nothing appended."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from boxwright.abort import AbortController
from boxwright.agent import JournalOptions, run_agent
from boxwright.definition import define_sandbox
from boxwright.events import RunErrorEvent, TextMessageContentEvent
from boxwright.harnesses.command import command_harness
from boxwright.middleware.service import RecordDurability
from boxwright.providers import local_process_sandbox
from boxwright.runs import RUN_CANCEL_REASON, pipe_to_run_log
from boxwright.stores.memory import MemoryInstanceStore, memory_run_backend

AGENT = 'for i in 1 2 3 4 5 6; do echo "line $i"; sleep 0.2; done'


@pytest.mark.parametrize(("reason", "detaches"), [("host shutting down", True), (RUN_CANCEL_REASON, False)])
def test_stopping_a_durable_driver_detaches_unless_cancelled(tmp_path: Path, reason: str, detaches: bool) -> None:
    # Journals of local-process sandboxes share the host's /tmp: a run id of its own per test.
    run = f"detach-{uuid.uuid4().hex}"

    async def main() -> None:
        runs, log = memory_run_backend()
        await runs.create_or_resume(run, "t1")
        durability = RecordDurability(runs, run)
        controller = AbortController()
        sandbox = define_sandbox("d", local_process_sandbox(base_dir=tmp_path / "sb"))
        stream = run_agent(
            sandbox,
            command_harness(AGENT),
            "go",
            thread_id="t1",
            run_id=run,
            store=MemoryInstanceStore(),
            journal=JournalOptions(),
            durability=durability,
            signal=controller.signal,
        )

        async def watch() -> None:
            async for _offset, event in log.read(run, "-1"):
                if isinstance(event, TextMessageContentEvent):
                    controller.abort(reason)
                    return

        watcher = asyncio.ensure_future(watch())
        record = await pipe_to_run_log(
            stream, runs, log, run, "t1", controller.signal, detached=lambda: durability.detached
        )
        await watcher
        stored = await log.snapshot(run)
        if detaches:
            assert record.status == "running" and record.detached_since is not None and record.sandbox_key
            assert not await log.is_closed(run)
            assert not any(isinstance(e, RunErrorEvent) for e in stored)
            assert len(list((tmp_path / "sb").iterdir())) == 1, "the sandbox is kept for a successor"
        else:
            assert record.status == "aborted" and record.error is not None and record.error.code == "cancelled"
            assert await log.is_closed(run)
            assert isinstance(stored[-1], RunErrorEvent)
            assert list((tmp_path / "sb").iterdir()) == []

    asyncio.run(main())


def test_a_service_over_a_cross_process_lock_drives_fresh_runs_under_a_claim(tmp_path: Path) -> None:
    from boxwright.middleware.service import SandboxService
    from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend

    async def main() -> tuple[object, object]:
        async with open_database(tmp_path / "svc.db") as db:
            runs, log = sqlite_run_backend(db)
            service = SandboxService(runs, log, locks=SqliteLockStore(db), store=SqliteInstanceStore(db))
            sandbox = define_sandbox("svc", local_process_sandbox(base_dir=tmp_path / "sb"))
            run_id = await service.start_run(sandbox, command_harness("echo hi"), "go", thread_id="t")
            record = await service.wait_run(run_id)
            await service.aclose()
            return record, await log.snapshot(run_id)

    record, stored = asyncio.run(main())
    assert record.status == "completed" and record.driver_epoch == 1  # type: ignore[attr-defined]
    assert any(isinstance(e, TextMessageContentEvent) and e.delta == "hi\n" for e in stored)  # type: ignore[union-attr]
