"""The reaper against real sandboxes and real journals (spec §L-M: R64-R71; A56, A58, A59, A65).

A journaled agent (``command_harness`` printing AG-UI NDJSON through ``run_agent(...,
journal=JournalOptions())``) runs in a local-process or bubblewrap sandbox; its first
driver delivers a prefix to the log, then the viewer leaves (the run detaches). The
sweep learns from the journal's exit sentinel which runs finished: a finished one is
replayed from its journal (aligned, so nothing is delivered twice), finalized and its
sandbox reclaimed; one still producing is left exactly as it was. Run records, logs,
locks and instance records are SQLite files.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from boxwright.abort import AbortController, AbortSignal
from boxwright.agent import JournalOptions, run_agent
from boxwright.definition import SandboxDefinition, define_sandbox
from boxwright.events import Event, RunErrorEvent, RunFinishedEvent, RunStartedEvent, TextMessageContentEvent, now_ms
from boxwright.harnesses.command import command_harness
from boxwright.journal import (
    Finished,
    Producing,
    Unknown,
    journal_cleanup_command,
    journal_dir_of,
    journal_paths,
    start_journaled_agent,
)
from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.reaper import has_finished_via_journal, reap_detached_runs, sandbox_handle_for, sandbox_reclaimer
from boxwright.runs import EventLog, RunPatch, RunRecord, RunStore, was_cancel_requested
from boxwright.sandbox import CreateInput, SandboxHandle, SandboxProvider
from boxwright.stores.base import InstanceRecord, LockStore, SandboxInstanceStore
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from boxwright.takeover import align_to_stored_log, is_out_of_band
from tests.support.require import missing
from tests.unit.test_takeover_claim import deltas, run

KINDS = ["local-process", "bubblewrap"]


def _provider(kind: str, tmp_path: Path) -> SandboxProvider:
    if kind == "local-process":
        return local_process_sandbox(base_dir=tmp_path / "sb")
    if not probe().available:
        missing(f"bubblewrap: {probe().reason}")
    return bubblewrap_sandbox(base_dir=tmp_path / "sb")


def _line(text: str) -> str:
    return "printf '%s\\n' '" + text + "'"


START = _line('{"type":"TEXT_MESSAGE_START","messageId":"m","role":"assistant"}')
END = _line('{"type":"TEXT_MESSAGE_END","messageId":"m"}')


def _say(i: int) -> str:
    return _line('{"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"line ' + str(i) + '"}')


def finishing_agent() -> str:
    return f"{START}; {_say(0)}; sleep 0.3; {_say(1)}; {_say(2)}; {END}"


def waiting_agent(stop_file: str) -> str:
    # Says one line, then works until told to stop (bounded, so a leak cannot outlive the suite by much).
    wait = f"i=0; while [ $i -lt 150 ] && [ ! -f {stop_file} ]; do sleep 0.1; i=$((i+1)); done"
    return f"{START}; {_say(0)}; {wait}; {END}"


class RecordDurability:
    """The run record as the sandbox lifecycle sees it: the cancel band, and where a detach is stamped."""

    def __init__(self, runs: RunStore, run_id: str) -> None:
        self.runs = runs
        self.run_id = run_id

    async def cancel_requested(self) -> bool:
        return await was_cancel_requested(self.runs, self.run_id)

    async def stamp_detached(self, sandbox_key: str) -> None:
        await self.runs.update(self.run_id, RunPatch(detached_since=now_ms(), sandbox_key=sandbox_key))


class World:
    def __init__(
        self,
        sandbox: SandboxDefinition,
        runs: RunStore,
        log: EventLog,
        locks: LockStore,
        instances: SandboxInstanceStore,
    ) -> None:
        self.sandbox, self.runs, self.log, self.locks, self.instances = sandbox, runs, log, locks, instances
        self.scripts: dict[str, str] = {}

    async def first_driver(self, run_id: str, script: str) -> RunRecord:
        """Drive a fresh journaled run; the viewer leaves after ``line 0`` (no cancel): the run detaches."""
        self.scripts[run_id] = script
        thread_id = f"t-{run_id}"
        await self.runs.create_or_resume(run_id, thread_id)
        viewer = AbortController()
        async for event in run_agent(
            self.sandbox,
            command_harness(script),
            "go",
            thread_id=thread_id,
            run_id=run_id,
            store=self.instances,
            locks=self.locks,
            journal=JournalOptions(),
            durability=RecordDurability(self.runs, run_id),
            signal=viewer.signal,
        ):
            if viewer.signal.aborted:
                continue  # nobody is reading any more: nothing else reaches the log
            await self.log.append(run_id, [event])
            if isinstance(event, TextMessageContentEvent) and event.delta == "line 0":
                viewer.abort("the client went away")
        record = await self.runs.get(run_id)
        assert record is not None and record.detached_since is not None and record.sandbox_key is not None
        return record

    def drive(self, run_id: str, thread_id: str, signal: AbortSignal) -> AsyncIterator[Event]:
        """What the resume route and the reaper both drive: the run re-read from its journal, aligned to the log."""
        replay = run_agent(
            self.sandbox,
            command_harness(self.scripts[run_id]),
            "go",
            thread_id=thread_id,
            run_id=run_id,
            store=self.instances,
            locks=self.locks,
            journal=JournalOptions(attach=True),
            durability=RecordDurability(self.runs, run_id),
            signal=signal,
        )
        return align_to_stored_log(replay, lambda: self.log.snapshot(run_id), out_of_band=is_out_of_band)

    async def sandbox_of(self, record: RunRecord) -> InstanceRecord | None:
        assert record.sandbox_key is not None
        return await self.instances.get(record.sandbox_key)


async def _eventually(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 15) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def _in_world(tmp_path: Path, kind: str, body: Callable[[World, SandboxProvider], Awaitable[Any]]) -> Any:
    provider = _provider(kind, tmp_path)
    async with open_database(tmp_path / "boxwright.db") as db:
        runs, log = sqlite_run_backend(db)
        world = World(
            define_sandbox("reaper", provider, file_events=False),
            runs,
            log,
            SqliteLockStore(db),
            SqliteInstanceStore(db),
        )
        return await body(world, provider)


@pytest.mark.parametrize("kind", KINDS)
def test_a56_a58_finished_while_detached_is_finalized_and_reclaimed_producing_is_untouched(
    kind: str, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    done_id, live_id = f"done-{suffix}", f"live-{suffix}"
    stop = tmp_path / "stop" if kind == "local-process" else Path("/workspace/stop")

    async def body(world: World, provider: SandboxProvider) -> None:
        done = await world.first_driver(done_id, finishing_agent())
        live = await world.first_driver(live_id, waiting_agent(str(stop)))
        done_instance, live_instance = await world.sandbox_of(done), await world.sandbox_of(live)
        assert done_instance is not None and live_instance is not None
        handle_for = sandbox_handle_for(provider, world.instances)
        has_finished = has_finished_via_journal(handle_for)

        async def done_finished() -> bool:
            return isinstance(await has_finished(done), Finished)

        await _eventually(done_finished, "the detached agent to finish")
        live_before = await world.runs.get(live_id)
        try:
            result = await reap_detached_runs(
                world.runs,
                world.locks,
                world.log,
                has_finished=has_finished,
                drive=world.drive,
                now_ms=now_ms(),
                detached_run_ttl_ms=600_000,
                fence_quiet_ms=50,
                run_budget_ms=20_000,
                reclaim=sandbox_reclaimer(provider, world.instances),
            )
            by_run = {e.run_id: e for e in result.runs}
            assert (result.considered, result.probed) == (2, 2)
            assert (by_run[done_id].outcome, by_run[done_id].status, by_run[done_id].exit_code) == (
                "finalized",
                "completed",
                0,
            )
            assert by_run[live_id].outcome == "producing"

            # Finished: the whole transcript, the prefix the first driver delivered not repeated.
            stored = await world.log.snapshot(done_id)
            assert deltas(stored) == ["line 0", "line 1", "line 2"]
            assert sum(isinstance(e, RunStartedEvent) for e in stored) == 1
            assert isinstance([e for e in stored if not is_out_of_band(e)][-1], RunFinishedEvent)
            assert await world.log.is_closed(done_id)
            record = await world.runs.get(done_id)
            assert record is not None and (record.status, record.driver_epoch) == ("completed", 1)
            assert record.detached_since == done.detached_since  # the reaper never clears it
            # ...and its sandbox reclaimed: forgotten, and gone from disk.
            assert await world.sandbox_of(done) is None
            assert not os.path.exists(done_instance.provider_sandbox_id)

            # Producing: untouched in every way.
            assert await world.runs.get(live_id) == live_before
            assert deltas(await world.log.snapshot(live_id)) == ["line 0"]
            assert not await world.log.is_closed(live_id)
            assert await world.sandbox_of(live) == live_instance
            assert os.path.isdir(live_instance.provider_sandbox_id)
            still = await has_finished(live)
            assert isinstance(still, Producing)
        finally:
            await _stop(provider, live_instance, stop, kind, live_id)

    run(_in_world(tmp_path, kind, body))


@pytest.mark.parametrize("kind", KINDS)
def test_a59_expired_live_run_is_cancelled_driven_within_its_budget_and_reclaimed(kind: str, tmp_path: Path) -> None:
    live_id = f"expired-{uuid.uuid4().hex[:8]}"
    stop = tmp_path / "stop" if kind == "local-process" else Path("/workspace/stop")

    async def body(world: World, provider: SandboxProvider) -> None:
        live = await world.first_driver(live_id, waiting_agent(str(stop)))
        instance = await world.sandbox_of(live)
        assert instance is not None
        try:
            result = await reap_detached_runs(
                world.runs,
                world.locks,
                world.log,
                has_finished=has_finished_via_journal(sandbox_handle_for(provider, world.instances)),
                drive=world.drive,
                now_ms=now_ms(),
                detached_run_ttl_ms=0,
                fence_quiet_ms=50,
                run_budget_ms=1_000,
                reclaim=sandbox_reclaimer(provider, world.instances),
            )
            (entry,) = result.runs
            assert (entry.outcome, entry.status) == ("expired", "aborted") and result.probed == 0
            record = await world.runs.get(live_id)
            assert record is not None and record.status == "aborted" and record.cancel_requested is True
            stored = await world.log.snapshot(live_id)
            assert deltas(stored) == ["line 0"] and isinstance(stored[-1], RunErrorEvent)
            assert await world.log.is_closed(live_id)
            # A recorded cancel destroys the sandbox (the drive's own teardown, or the reclaim after it).
            assert await world.sandbox_of(live) is None
            assert not os.path.exists(instance.provider_sandbox_id)
        finally:
            await _stop(provider, instance, stop, kind, live_id)

    run(_in_world(tmp_path, kind, body))


async def _stop(provider: SandboxProvider, instance: InstanceRecord, stop: Path, kind: str, run_id: str) -> None:
    """Tell a waiting agent to end, and leave nothing of it behind."""
    from boxwright.sandbox import DestroyInput, ResumeInput

    if kind == "local-process":
        stop.touch()
        await asyncio.sleep(0.3)  # it sees the file, ends, and appends its sentinel in the sandbox's journal dir
        handle = await provider.resume(ResumeInput(id=instance.provider_sandbox_id))
        if handle is None:
            handle = await provider.create(CreateInput())
        await handle.process.exec(journal_cleanup_command(journal_paths(run_id, journal_dir_of(handle))))
        await handle.destroy()
    await provider.destroy(DestroyInput(id=instance.provider_sandbox_id))


@pytest.mark.parametrize("kind", KINDS)
def test_a65_has_finished_reads_the_real_journal_tail(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        provider = _provider(kind, tmp_path)
        handle = await provider.create(CreateInput())
        try:

            async def handle_for(_record: RunRecord) -> SandboxHandle:
                return handle

            has_finished = has_finished_via_journal(handle_for)

            def record(run_id: str) -> RunRecord:
                return RunRecord(run_id=run_id, thread_id="t", status="running", started_at=1, updated_at=1)

            suffix = uuid.uuid4().hex[:8]
            ran = {
                "exit": (f"exit-{suffix}", "echo '{}'; exit 3"),
                # The agent's own sentinel-looking lines: unnonced, and with another run's nonce.
                "forged": (
                    f"forged-{suffix}",
                    'echo \'{"__exit":0}\'; echo \'{"__exit":0,"__nonce":"' + "0" * 32 + "\"}'; sleep 3",
                ),
            }
            for run_id, command in ran.values():
                await start_journaled_agent(handle, command, journal_paths(run_id, journal_dir_of(handle)))

            async def exited() -> bool:
                return isinstance(await has_finished(record(ran["exit"][0])), Finished)

            await _eventually(exited, "the journaled agent to exit")
            assert await has_finished(record(ran["exit"][0])) == Finished(3)
            assert await has_finished(record(ran["forged"][0])) == Producing()
            assert await has_finished(record(f"absent-{suffix}")) == Producing()
            for run_id, _ in ran.values():
                await handle.process.exec(journal_cleanup_command(journal_paths(run_id, journal_dir_of(handle))))
            # A sandbox that can no longer run anything is unknown, never finished.
            await handle.destroy()
            gone = await has_finished(record(ran["exit"][0]))
            assert isinstance(gone, Unknown) and gone.error
        finally:
            await handle.destroy()

    run(main())
