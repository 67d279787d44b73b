"""Run semantics where boxwright follows the seed: cancel ends ``aborted``, durability is one opt-in,
a durable run needs the caller's run id, ``keep_alive`` is refused, one active run per thread."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from boxwright.agent import JournalOptions, run_agent
from boxwright.definition import Lifecycle, define_sandbox
from boxwright.errors import DurableRunIdRequiredError, HalfDurableRunError
from boxwright.events import Event
from boxwright.harnesses.command import command_harness
from boxwright.middleware import SandboxService
from boxwright.middleware.service import RecordDurability
from boxwright.providers import local_process_sandbox
from boxwright.stores.memory import MemoryInstanceStore, memory_run_backend
from boxwright.stores.sqlite import SqliteLockStore, open_database, sqlite_run_backend


def _tag() -> str:
    return uuid.uuid4().hex[:12]


async def _until_log_has(log: object, run_id: str, event_type: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not any(e.type == event_type for e in await log.snapshot(run_id)):  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, f"no {event_type} in run {run_id}'s log after {timeout} s"
        await asyncio.sleep(0.05)


def test_a_cancel_under_a_cross_process_claim_ends_aborted_not_failed(tmp_path: Path) -> None:
    # With a lock store that spans processes the service drives the run under its claim, where the
    # pump sees no signal: only the RUN_ERROR the run reports tells it the run was stopped.
    async def main() -> None:
        db = open_database(tmp_path / "runs.db")
        runs, log = sqlite_run_backend(db)
        service = SandboxService(runs, log, store=MemoryInstanceStore(), locks=SqliteLockStore(db))
        sandbox = define_sandbox("cancel", local_process_sandbox(base_dir=tmp_path / "sb"), file_events=False)
        try:
            run_id = await service.start_run(
                sandbox,
                command_harness("echo started; sleep 60"),
                "go",
                thread_id=f"t-{_tag()}",
                run_id=f"cancel-{_tag()}",
            )
            await _until_log_has(log, run_id, "TEXT_MESSAGE_CONTENT", 20)
            await service.cancel_run(run_id)
            record = await asyncio.wait_for(service.wait_run(run_id), 30)
            assert record is not None
            assert record.status == "aborted", record
            assert record.error is not None and record.error.code == "cancelled"
            assert record.cancel_requested is True
            last = (await log.snapshot(run_id))[-1]
            assert last.type == "RUN_ERROR" and last.code == "cancelled"  # type: ignore[union-attr]
        finally:
            await service.aclose(cancel=True)
            await db.close()

    asyncio.run(main())


async def _first(stream: AsyncGenerator[Event, None]) -> Event:
    async with contextlib.aclosing(stream) as events:
        return await anext(events)


def test_a_journaled_run_needs_the_callers_run_id(tmp_path: Path) -> None:
    sandbox = define_sandbox("rid", local_process_sandbox(base_dir=tmp_path / "sb"), file_events=False)

    async def main() -> None:
        stream: Any = run_agent(sandbox, command_harness("echo hi"), "go", thread_id="t", journal=JournalOptions())
        with pytest.raises(DurableRunIdRequiredError, match="needs a run_id"):
            await _first(stream)
        assert not (tmp_path / "sb").exists() or not any((tmp_path / "sb").iterdir()), "refused before any sandbox"

    asyncio.run(main())


def test_durability_without_a_journal_is_refused_before_any_sandbox(tmp_path: Path) -> None:
    runs, _ = memory_run_backend()
    sandbox = define_sandbox("half", local_process_sandbox(base_dir=tmp_path / "sb"), file_events=False)

    async def main() -> None:
        stream: Any = run_agent(
            sandbox,
            command_harness("echo hi"),
            "go",
            thread_id="t",
            run_id=f"half-{_tag()}",
            durability=RecordDurability(runs, "half"),
        )
        with pytest.raises(HalfDurableRunError, match="durability is one opt-in"):
            await _first(stream)
        assert not (tmp_path / "sb").exists() or not any((tmp_path / "sb").iterdir()), "refused before any sandbox"

    asyncio.run(main())


def test_keep_alive_is_refused_with_what_to_do_instead() -> None:
    with pytest.raises(ValueError, match="keep_alive.*not supported.*destroy_on_complete"):
        Lifecycle(keep_alive="30m")
    with pytest.raises(msgspec.ValidationError, match="keep_alive"):
        msgspec.convert({"keep_alive": "30m"}, Lifecycle)
    assert Lifecycle(destroy_on_complete=True).keep_alive is None
