"""reap_detached_runs, reclaim_sandbox, sandbox_reclaimer (spec §L-M: R64-R71, A53-A66).

The sweep runs on the backend of the ``backend`` fixture: memory stores here, SQLite in
tests/integration/test_takeover_sqlite.py (which subclasses ``ReaperScenarios``). Real
sandboxes and real journals are in tests/integration/test_reaper_real.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from boxwright import events as ev
from boxwright.abort import AbortSignal
from boxwright.errors import SandboxReclaimFailedError
from boxwright.journal import Finished, Producing, RunExitProbe, Unknown
from boxwright.providers import local_process_sandbox
from boxwright.reaper import (
    REAP_OUTCOMES,
    ReapResult,
    ReapRunEntry,
    has_finished_via_journal,
    reap_detached_runs,
    reclaim_sandbox,
    sandbox_reclaimer,
)
from boxwright.runs import EventLog, RunPatch, RunRecord, RunStore
from boxwright.sandbox import CreateInput
from boxwright.stores.base import InstanceRecord, LeaseSignal, LockStore
from boxwright.stores.memory import MemoryInstanceStore
from boxwright.takeover import run_driver_lock_key
from tests.support.providers import SpyProvider
from tests.unit.test_takeover_claim import (
    Backend,
    FaultyRuns,
    LosableLocks,
    deltas,
    memory_backend,
    payload,
    run,
)

NOW = 10_000_000
TTL = 60_000


def started(run_id: str) -> ev.RunStartedEvent:
    return ev.RunStartedEvent(thread_id=f"t-{run_id}", run_id=run_id)


def said(text: str) -> ev.TextMessageContentEvent:
    return ev.TextMessageContentEvent(message_id="m", delta=text)


class Agents:
    """What each run's agent did, replayed by ``drive`` as a journal re-read would."""

    def __init__(self, runs: RunStore) -> None:
        self.runs = runs
        self.scripts: dict[str, tuple[list[ev.Event], bool]] = {}
        self.calls: list[tuple[str, str, bool]] = []  # run_id, thread_id, signal already aborted
        self.cancel_seen: dict[str, bool | None] = {}

    def finished(self, run_id: str, *texts: str) -> None:
        events: list[ev.Event] = [started(run_id), *(said(t) for t in texts)]
        events.append(ev.RunFinishedEvent(thread_id=f"t-{run_id}", run_id=run_id))
        self.scripts[run_id] = (events, False)

    def live(self, run_id: str, *texts: str) -> None:
        self.scripts[run_id] = ([started(run_id), *(said(t) for t in texts)], True)

    def drive(self, run_id: str, thread_id: str, signal: AbortSignal) -> AsyncIterator[ev.Event]:
        self.calls.append((run_id, thread_id, signal.aborted))
        return self._replay(run_id, signal)

    async def _replay(self, run_id: str, signal: AbortSignal) -> AsyncIterator[ev.Event]:
        record = await self.runs.get(run_id)
        self.cancel_seen[run_id] = None if record is None else record.cancel_requested
        events, live = self.scripts.get(run_id, ([], False))
        for event in events:
            yield event
        if live:
            await signal.wait()  # the journal has no sentinel yet: the tail waits until stopped

    def driven(self) -> list[str]:
        return [run_id for run_id, _, _ in self.calls]


class Probes:
    def __init__(self) -> None:
        self.answers: dict[str, RunExitProbe | Exception] = {}
        self.asked: list[str] = []

    async def __call__(self, record: RunRecord) -> RunExitProbe:
        self.asked.append(record.run_id)
        answer = self.answers.get(record.run_id, Producing())
        if isinstance(answer, Exception):
            raise answer
        return answer


class Reclaims:
    def __init__(self, *, fail: bool = False) -> None:
        self.records: list[RunRecord] = []
        self.fail = fail

    async def __call__(self, record: RunRecord) -> None:
        self.records.append(record)
        if self.fail:
            raise SandboxReclaimFailedError(record.run_id, record.sandbox_key or "", "destroy failed")

    def keys(self) -> list[str | None]:
        return [r.sandbox_key for r in self.records]


class ListingFaultyRuns(FaultyRuns):
    def __init__(self, inner: Any, *, fail_list: bool = False, **kw: Any) -> None:
        super().__init__(inner, **kw)
        self.fail_list = fail_list

    async def list_reclaimable(self, now_ms: int, ttl_ms: int) -> list[RunRecord]:
        if self.fail_list:
            raise ConnectionError("listing failed")
        return list(await self.inner.list_reclaimable(now_ms, ttl_ms))


async def detached(runs: RunStore, run_id: str, since: int, **patch: Any) -> RunRecord:
    await runs.create_or_resume(run_id, f"t-{run_id}")
    record = await runs.update(run_id, RunPatch(detached_since=since, sandbox_key=f"sb-{run_id}", **patch))
    assert record is not None
    return record


FRESH = NOW - 1_000  # detached, not expired
OLD = NOW - TTL  # expired, exactly at the cutoff


class Sweep:
    def __init__(self, runs: RunStore, log: EventLog, locks: LockStore) -> None:
        self.runs, self.log, self.locks = runs, log, locks
        self.agents = Agents(runs)
        self.probes = Probes()
        self.reclaims = Reclaims()

    async def __call__(self, **kw: Any) -> ReapResult:
        options: dict[str, Any] = {
            "has_finished": self.probes,
            "drive": self.agents.drive,
            "now_ms": NOW,
            "detached_run_ttl_ms": TTL,
            "fence_quiet_ms": 1,
            "reclaim": self.reclaims,
        }
        options.update(kw)
        runs = options.pop("runs", self.runs)
        locks = options.pop("locks", self.locks)
        result = await reap_detached_runs(runs, locks, self.log, **options)
        assert set(result.outcomes) == set(REAP_OUTCOMES)  # all eight keys, always
        assert sum(result.outcomes.values()) == len(result.runs) == result.considered
        return result

    async def record(self, run_id: str) -> RunRecord:
        record = await self.runs.get(run_id)
        assert record is not None
        return record


def entry(result: ReapResult, run_id: str) -> Any:
    (found,) = [e for e in result.runs if e.run_id == run_id]
    return found


class ReaperScenarios:
    @pytest.fixture
    def backend(self) -> Backend:
        return memory_backend

    def test_a53_the_default_cap_is_25_runs(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                sweep = Sweep(runs, log, locks)
                for i in range(30):
                    await detached(runs, f"r{i:02d}", FRESH - i)
                result = await sweep()
                assert result.considered == result.probed == 25
                assert result.outcomes["producing"] == 25 and len(sweep.probes.asked) == 25
                assert sweep.agents.calls == []

        run(main())

    def test_a54_exactly_at_the_cutoff_is_expired_unprobed(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                sweep = Sweep(runs, log, locks)
                await detached(runs, "old", OLD)
                await detached(runs, "fresh", OLD + 1)
                sweep.agents.finished("old", "bye")
                result = await sweep()
                assert sweep.probes.asked == ["fresh"] and result.probed == 1
                assert entry(result, "old").outcome == "expired" and entry(result, "old").status == "completed"
                assert entry(result, "fresh").outcome == "producing"

        run(main())

    def test_a55_no_listing_or_a_failing_listing_sweeps_nothing(
        self, backend: Backend, caplog: pytest.LogCaptureFixture
    ) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                sweep = Sweep(runs, log, locks)
                await detached(runs, "r", OLD)
                with caplog.at_level(logging.WARNING, logger="boxwright.reaper"):
                    bare = await sweep(runs=FaultyRuns(runs))
                    failing = await sweep(runs=ListingFaultyRuns(runs, fail_list=True))
                for result in (bare, failing):
                    assert result.considered == 0 and result.runs == [] and not any(result.outcomes.values())
                assert any("no list_reclaimable" in r.message for r in caplog.records)
                assert any(r.levelno == logging.ERROR and "listing failed" in r.message for r in caplog.records)
                assert sweep.agents.calls == [] and (await sweep.record("r")).driver_epoch is None

        run(main())

    def test_a56_producing_is_left_untouched_while_a_finished_sibling_finalizes(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                sweep = Sweep(runs, log, locks)
                await detached(runs, "live", FRESH - 10)
                await detached(runs, "done", FRESH)
                await log.append("live", [started("live"), said("a")])
                before = await sweep.record("live")
                sweep.probes.answers["done"] = Finished(0)
                sweep.agents.finished("done", "x")
                result = await sweep()
                assert entry(result, "live").outcome == "producing"
                assert entry(result, "done").outcome == "finalized"
                assert await sweep.record("live") == before  # no write at all: same epoch, detached_since, updated_at
                assert deltas(await log.snapshot("live")) == ["a"] and not await log.is_closed("live")
                assert sweep.agents.driven() == ["done"] and sweep.reclaims.keys() == ["sb-done"]

        run(main())

    def test_a57_unknown_carries_the_error_and_touches_nothing(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                sweep = Sweep(runs, log, locks)
                await detached(runs, "a", FRESH)
                await detached(runs, "b", FRESH)
                sweep.probes.answers["a"] = Unknown("no handle")
                sweep.probes.answers["b"] = ConnectionError("provider API down")
                before = [await sweep.record("a"), await sweep.record("b")]
                result = await sweep()
                assert [e.outcome for e in result.runs] == ["unknown", "unknown"]
                assert entry(result, "a").error == "no handle"
                assert "provider API down" in entry(result, "b").error
                assert [await sweep.record("a"), await sweep.record("b")] == before
                assert sweep.agents.calls == [] and sweep.reclaims.records == []

        run(main())

    def test_a58_finished_run_is_finalized_with_its_exit_code_and_reclaimed(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                sweep = Sweep(runs, log, locks)
                await detached(runs, "done", FRESH)
                await detached(runs, "live", FRESH)
                await log.append("done", [started("done"), said("one")])  # what the first driver delivered
                sweep.probes.answers["done"] = Finished(3)
                sweep.agents.finished("done", "two")
                result = await sweep()
                done = entry(result, "done")
                assert (done.outcome, done.status, done.exit_code) == ("finalized", "completed", 3)
                assert done.terminalized_anyway is None
                record = await sweep.record("done")
                assert record.status == "completed" and record.driver_epoch == 1
                assert record.detached_since == FRESH  # the reaper never clears it
                assert deltas(await log.snapshot("done")) == ["one", "two"] and await log.is_closed("done")
                assert sweep.agents.calls == [("done", "t-done", False)]
                assert sweep.reclaims.keys() == ["sb-done"]  # only the finished one

        run(main())

    def test_a58_a_failing_terminal_write_still_reclaims_with_the_listed_key(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                sweep = Sweep(runs, log, locks)
                await detached(runs, "done", FRESH)
                sweep.probes.answers["done"] = Finished(0)
                sweep.agents.finished("done", "x")
                faulty = ListingFaultyRuns(runs, fail_update=lambda patch: isinstance(patch.status, str))
                result = await sweep(runs=faulty)
                assert entry(result, "done").outcome == "finalized"
                assert sweep.reclaims.keys() == ["sb-done"]

        run(main())

    def test_a59_expired_run_is_cancelled_then_stopped_by_the_budget(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                sweep = Sweep(runs, log, locks)
                await detached(runs, "old", OLD)
                sweep.agents.live("old", "still going")
                result = await sweep(run_budget_ms=50)
                old = entry(result, "old")
                assert (old.outcome, old.status, old.terminalized_anyway) == ("expired", "aborted", None)
                assert sweep.agents.cancel_seen["old"] is True  # the cancel was written before the drive
                record = await sweep.record("old")
                assert record.status == "aborted" and record.cancel_requested is True
                stored = await log.snapshot("old")
                assert deltas(stored) == ["still going"] and stored[-1].type == "RUN_ERROR"
                assert sweep.reclaims.keys() == ["sb-old"]

        run(main())

    def test_a59_a_wedged_finished_run_is_budget_exceeded(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                sweep = Sweep(runs, log, locks)
                await detached(runs, "wedged", FRESH)
                sweep.probes.answers["wedged"] = Finished(0)
                sweep.agents.live("wedged", "half")
                result = await sweep(run_budget_ms=50)
                wedged = entry(result, "wedged")
                assert (wedged.outcome, wedged.status, wedged.terminalized_anyway) == (
                    "budget-exceeded",
                    "aborted",
                    True,
                )
                assert (await sweep.record("wedged")).cancel_requested is None  # not expired: no cancel
                assert await log.is_closed("wedged") and sweep.reclaims.keys() == ["sb-wedged"]

        run(main())

    def test_a60_a_log_that_never_settles_fails_that_run_and_the_sweep_goes_on(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                sweep = Sweep(runs, log, locks)
                await detached(runs, "busy", FRESH - 1)
                await detached(runs, "done", FRESH)
                for run_id in ("busy", "done"):
                    sweep.probes.answers[run_id] = Finished(0)
                    sweep.agents.finished(run_id, run_id)
                stop = asyncio.Event()

                async def other_writer() -> None:  # a predecessor still appending, unfenced
                    i = 0
                    while not stop.is_set():
                        await log.append("busy", [said(f"w{i}")])
                        i += 1
                        await asyncio.sleep(0.002)

                writer = asyncio.create_task(other_writer())
                try:
                    # A window far above the writer's 2 ms pace: on a loaded CI machine a 10 ms one saw quiet.
                    result = await sweep(fence_quiet_ms=250)
                finally:
                    stop.set()
                    await writer
                busy = entry(result, "busy")
                assert busy.outcome == "failed" and "did not stay still" in busy.error
                assert all(d.startswith("w") for d in deltas(await log.snapshot("busy")))
                assert payload(await log.snapshot("busy")) == await log.snapshot("busy")  # no run.accepted of ours
                assert (await sweep.record("busy")).status == "running"
                assert entry(result, "done").outcome == "finalized"
                assert sweep.agents.driven() == ["done"] and sweep.reclaims.keys() == ["sb-done"]

        run(main())

    def test_a61_terminalised_elsewhere_before_the_claim_is_not_claimed(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                sweep = Sweep(runs, log, locks)
                await detached(runs, "done", FRESH)
                await detached(runs, "old", OLD)
                sweep.probes.answers["done"] = Finished(0)
                holding = asyncio.Event()

                async def another_driver(_lease: LeaseSignal) -> None:
                    holding.set()
                    await asyncio.sleep(0.03)
                    for run_id in ("done", "old"):
                        await runs.update(run_id, RunPatch(status="completed"))

                holders = [
                    asyncio.create_task(locks.with_lock(run_driver_lock_key(r), another_driver))
                    for r in ("done", "old")
                ]
                await holding.wait()
                result = await sweep()
                await asyncio.gather(*holders)
                for run_id in ("done", "old"):
                    found = entry(result, run_id)
                    assert found.outcome == "not-claimed" and "terminal" in found.error
                    assert (await sweep.record(run_id)).cancel_requested is None
                assert sweep.agents.calls == [] and sweep.reclaims.records == []

        run(main())

    def test_a61_a_viewer_back_before_the_claim_keeps_its_run(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                sweep = Sweep(runs, log, locks)
                await detached(runs, "old", OLD)
                holding = asyncio.Event()

                async def viewer_returns(_lease: LeaseSignal) -> None:
                    holding.set()
                    await asyncio.sleep(0.03)
                    await runs.update("old", RunPatch(detached_since=None, driver_epoch=5))

                holder = asyncio.create_task(locks.with_lock(run_driver_lock_key("old"), viewer_returns))
                await holding.wait()
                result = await sweep()
                await holder
                old = entry(result, "old")
                assert old.outcome == "not-claimed" and "superseded" in old.error
                record = await sweep.record("old")
                assert record.cancel_requested is None and record.driver_epoch == 5 and record.status == "running"
                assert sweep.agents.calls == [] and sweep.reclaims.records == []

        run(main())

    def test_a62_the_budget_starts_after_the_lock_wait_and_the_quiet_window(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                sweep = Sweep(runs, log, locks)
                await detached(runs, "done", FRESH)
                sweep.probes.answers["done"] = Finished(0)
                sweep.agents.finished("done", "x")
                holding = asyncio.Event()

                async def busy(_lease: LeaseSignal) -> None:
                    holding.set()
                    await asyncio.sleep(0.1)

                holder = asyncio.create_task(locks.with_lock(run_driver_lock_key("done"), busy))
                await holding.wait()
                result = await sweep(fence_quiet_ms=25, run_budget_ms=50)
                await holder
                assert entry(result, "done").outcome == "finalized"
                assert entry(result, "done").status == "completed"

        run(main())

    def test_a63_a_dead_lease_drives_nothing_and_keeps_the_run(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                sweep = Sweep(runs, log, locks)
                await detached(runs, "done", FRESH)
                sweep.probes.answers["done"] = Finished(0)
                sweep.agents.finished("done", "x")
                result = await sweep(locks=LosableLocks(locks, dead=True))
                done = entry(result, "done")
                assert done.outcome == "not-claimed" and "lease" in done.error
                assert sweep.agents.calls == [("done", "t-done", True)]  # its signal was aborted from the start
                assert await log.snapshot("done") == [] and not await log.is_closed("done")
                record = await sweep.record("done")
                assert record.status == "running" and record.driver_epoch == 1
                assert sweep.reclaims.records == []

        run(main())

    def test_a64_a_raising_reclaim_is_reclaim_failed_and_keeps_the_budget_flag(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                sweep = Sweep(runs, log, locks)
                sweep.reclaims.fail = True
                await detached(runs, "done", FRESH)
                await detached(runs, "wedged", FRESH)
                sweep.probes.answers["done"] = Finished(0)
                sweep.probes.answers["wedged"] = Finished(0)
                sweep.agents.finished("done", "x")
                sweep.agents.live("wedged", "y")
                result = await sweep(run_budget_ms=50)
                done, wedged = entry(result, "done"), entry(result, "wedged")
                assert (done.outcome, done.status) == ("reclaim-failed", "completed")
                assert "SandboxReclaimFailedError" in done.error
                assert (wedged.outcome, wedged.status, wedged.terminalized_anyway) == (
                    "reclaim-failed",
                    "aborted",
                    True,
                )
                assert result.outcomes["reclaim-failed"] == 2

        run(main())


class TestReaperMemory(ReaperScenarios):
    pass


# -- reclaim (A64, A66; R70-R71) --------------------------------------------------------------------


def _record(run_id: str = "r", sandbox_key: str | None = "key") -> RunRecord:
    return RunRecord(
        run_id=run_id, thread_id="t", status="completed", started_at=1, updated_at=1, sandbox_key=sandbox_key
    )


class BrokenInstances(MemoryInstanceStore):
    async def get(self, key: str) -> InstanceRecord | None:
        raise ConnectionError("instance store down")


def test_a66_reclaim_sandbox_each_outcome(tmp_path: Path) -> None:
    async def main() -> None:
        provider = SpyProvider(local_process_sandbox(base_dir=tmp_path / "sb"))
        instances = MemoryInstanceStore()
        handle = await provider.create(CreateInput())
        root = handle.workspace_root

        def instance(provider_name: str) -> InstanceRecord:
            return InstanceRecord(
                key="key", provider=provider_name, provider_sandbox_id=root, thread_id="t", updated_at=1
            )

        assert (await reclaim_sandbox(_record(sandbox_key=None), provider, instances)).outcome == "no-sandbox-key"
        assert (await reclaim_sandbox(_record(), provider, instances)).outcome == "not-found"
        await instances.upsert(instance("docker"))
        mismatch = await reclaim_sandbox(_record(), provider, instances)
        assert mismatch.outcome == "provider-mismatch" and provider.count("destroy") == 0
        assert await instances.get("key") is not None and Path(root).is_dir()  # touched nothing
        await instances.upsert(instance("local-process"))
        destroyed = await reclaim_sandbox(_record(), provider, instances)
        assert (destroyed.outcome, destroyed.sandbox_key) == ("destroyed", "key")
        assert await instances.get("key") is None and not Path(root).exists()
        # A destroy that raises still forgets the instance.
        await instances.upsert(instance("local-process"))
        provider.fail_destroy = True
        failed = await reclaim_sandbox(_record(), provider, instances)
        assert failed.outcome == "destroy-failed" and "destroy failed on purpose" in (failed.error or "")
        assert await instances.get("key") is None
        # An instance store error propagates.
        with pytest.raises(ConnectionError):
            await reclaim_sandbox(_record(), provider, BrokenInstances())

    run(main())


def test_a64_shipped_reclaimer_raises_on_a_failed_destroy(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        provider = SpyProvider(local_process_sandbox(base_dir=tmp_path / "sb"), fail_destroy=True)
        instances = MemoryInstanceStore()
        reclaim = sandbox_reclaimer(provider, instances)
        await instances.upsert(
            InstanceRecord(key="key", provider="local-process", provider_sandbox_id="x", thread_id="t", updated_at=1)
        )
        with caplog.at_level(logging.DEBUG, logger="boxwright.reaper"):
            with pytest.raises(SandboxReclaimFailedError) as raised:
                await reclaim(_record())
            assert (raised.value.run_id, raised.value.sandbox_key) == ("r", "key")
            assert any(r.levelno == logging.ERROR for r in caplog.records)
            # Other outcomes return quietly.
            assert (await reclaim(_record())).outcome == "not-found"

    run(main())


def test_has_finished_via_journal_answers_unknown_when_unsure() -> None:
    async def main() -> None:
        async def no_handle(record: RunRecord) -> Any:
            return None

        async def raising(record: RunRecord) -> Any:
            raise ConnectionError("provider API down")

        record = _record()
        missing = await has_finished_via_journal(no_handle)(record)
        assert isinstance(missing, Unknown) and "no sandbox handle" in (missing.error or "")
        failed = await has_finished_via_journal(raising)(record)
        assert isinstance(failed, Unknown) and "provider API down" in (failed.error or "")

    run(main())


def test_reap_result_wire_shape_is_camel_case() -> None:
    result = ReapResult()
    result.runs.append(ReapRunEntry(run_id="r", outcome="budget-exceeded", terminalized_anyway=True))
    wire = msgspec.json.decode(msgspec.json.encode(result))
    assert wire["runs"] == [{"runId": "r", "outcome": "budget-exceeded", "terminalizedAnyway": True}]
    assert wire["outcomes"] == dict.fromkeys(REAP_OUTCOMES, 0)
