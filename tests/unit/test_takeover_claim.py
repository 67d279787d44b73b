"""Claim, fences, quiescence, the run driver and the resume driver (spec §I-J: R51-R58, A42-A49).

Every scenario runs on a backend given by the ``backend`` fixture: the memory stores here,
SQLite (real files) in tests/integration/test_takeover_sqlite.py, which subclasses these classes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import msgspec
import pytest

from boxwright import events as ev
from boxwright.abort import AbortSignal
from boxwright.errors import (
    EpochFencedError,
    InvalidRunStatusError,
    RunClaimLostError,
    RunClaimNotAcquiredError,
    RunDriverPipeOutsideClaimError,
    RunLogNotQuiescentError,
)
from boxwright.runs import RUN_ACCEPTED_EVENT, EventLog, RunListing, RunPatch, RunRecord, RunStore, format_offset
from boxwright.stores.base import DEFAULT_LEASE_TTL_MS, Lease, LeaseSignal, LockStore
from boxwright.stores.memory import MemoryLockStore, memory_run_backend
from boxwright.takeover import (
    LEASE_LOST,
    RunClaim,
    await_log_quiescence,
    fence_event_log,
    fence_run_store,
    pipe_claimed,
    resume_run,
    run_driver_lock_key,
    sandbox_run_driver,
    with_run_claim,
)

Backend = Callable[[], AbstractAsyncContextManager[tuple[RunStore, EventLog, LockStore]]]


@contextlib.asynccontextmanager
async def memory_backend() -> AsyncIterator[tuple[RunStore, EventLog, LockStore]]:
    runs, log = memory_run_backend()
    yield runs, log, MemoryLockStore()


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))  # type: ignore[arg-type]


def text(i: int | str, message_id: str = "m") -> ev.TextMessageContentEvent:
    return ev.TextMessageContentEvent(message_id=message_id, delta=str(i))


def started(run_id: str = "r", thread_id: str = "t") -> ev.RunStartedEvent:
    return ev.RunStartedEvent(thread_id=thread_id, run_id=run_id)


def finished(run_id: str = "r", thread_id: str = "t") -> ev.RunFinishedEvent:
    return ev.RunFinishedEvent(thread_id=thread_id, run_id=run_id)


async def stream_of(events: Sequence[ev.Event], *, closed: list[bool] | None = None) -> AsyncIterator[ev.Event]:
    try:
        for event in events:
            yield event
    finally:
        if closed is not None:
            closed.append(True)


def deltas(events: Sequence[ev.Event]) -> list[str]:
    return [e.delta for e in events if isinstance(e, ev.TextMessageContentEvent)]


def payload(events: Sequence[ev.Event]) -> list[ev.Event]:
    """The stored events but the run.accepted markers."""
    return [e for e in events if not (isinstance(e, ev.CustomEvent) and e.name == RUN_ACCEPTED_EVENT)]


async def until_stored(log: EventLog, run_id: str, delta: str) -> None:
    """Return once a text event with ``delta`` is in the log (a live read, woken by the append)."""
    async for _, event in log.read(run_id):
        if isinstance(event, ev.TextMessageContentEvent) and event.delta == delta:
            return


class LosableLocks:
    """A real lock store whose leases a test can lose on demand (as a stalled holder's lease is lost)."""

    def __init__(self, inner: LockStore, *, dead: bool = False) -> None:
        self.inner = inner
        self.dead = dead
        self.leases: list[Lease] = []

    @property
    def durable(self) -> bool:
        return self.inner.durable

    async def with_lock(
        self, key: str, fn: Callable[[LeaseSignal], Awaitable[Any]], *, ttl_ms: int = DEFAULT_LEASE_TTL_MS
    ) -> Any:
        async def held(_inner: LeaseSignal) -> Any:
            lease = Lease(key)
            if self.dead:
                lease.mark_lost("dead on arrival")
            self.leases.append(lease)
            return await fn(lease)

        return await self.inner.with_lock(key, held, ttl_ms=ttl_ms)

    def lose(self) -> None:
        for lease in self.leases:
            lease.mark_lost("the test took the lease away")


class SpyLog:
    """An event log that counts the calls that reach it (the log itself is real)."""

    def __init__(self, inner: EventLog) -> None:
        self.inner = inner
        self.calls: list[str] = []

    async def append(self, run_id: str, events: Sequence[ev.Event], *, epoch: int | None = None) -> list[str]:
        self.calls.append("append")
        return await self.inner.append(run_id, events, epoch=epoch)

    def read(self, run_id: str, after: str = "-1", *, signal: AbortSignal | None = None, live: bool = True) -> Any:
        self.calls.append("read")
        return self.inner.read(run_id, after, signal=signal, live=live)

    async def snapshot(self, run_id: str, limit: int | None = None) -> list[ev.Event]:
        self.calls.append("snapshot")
        return await self.inner.snapshot(run_id, limit)

    async def tail(self, run_id: str) -> str:
        self.calls.append("tail")
        return await self.inner.tail(run_id)

    async def close(self, run_id: str) -> None:
        self.calls.append("close")
        await self.inner.close(run_id)

    async def is_closed(self, run_id: str) -> bool:
        return await self.inner.is_closed(run_id)


class FaultyRuns:
    """A real run store with chosen calls failing or answering oddly."""

    def __init__(
        self,
        inner: RunStore,
        *,
        fail_get: bool = False,
        fail_update: Callable[[RunPatch], bool] | None = None,
        status: str | None = None,
    ) -> None:
        self.inner = inner
        self.fail_get = fail_get
        self.fail_update = fail_update
        self.status = status

    async def get(self, run_id: str) -> RunRecord | None:
        if self.fail_get:
            raise ConnectionError("the store is down")
        record = await self.inner.get(run_id)
        if record is not None and self.status is not None:
            return msgspec.structs.replace(record, status=self.status)  # type: ignore[arg-type]
        return record

    async def create_or_resume(self, run_id: str, thread_id: str, *, started_at: int | None = None) -> RunRecord:
        return await self.inner.create_or_resume(run_id, thread_id, started_at=started_at)

    async def update(self, run_id: str, patch: RunPatch, *, expected_epoch: int | None = None) -> RunRecord | None:
        if self.fail_update is not None and self.fail_update(patch):
            raise ConnectionError("the store is down")
        return await self.inner.update(run_id, patch, expected_epoch=expected_epoch)

    async def find_active_run(self, thread_id: str) -> RunRecord | None:
        return await self.inner.find_active_run(thread_id)


async def new_run(runs: RunStore, run_id: str = "r", thread_id: str = "t", **patch: Any) -> RunRecord:
    record = await runs.create_or_resume(run_id, thread_id)
    if patch:
        updated = await runs.update(run_id, RunPatch(**patch))
        assert updated is not None
        return updated
    return record


async def epoch_of(runs: RunStore, run_id: str = "r") -> int | None:
    record = await runs.get(run_id)
    assert record is not None
    return record.driver_epoch


async def steal(runs: RunStore, run_id: str = "r") -> int:
    """Another host claims the run through a lock that does not exclude us (its own process's memory)."""
    return int(await with_run_claim(runs, MemoryLockStore(), run_id, _epoch))


async def _epoch(claim: RunClaim) -> int:
    return claim.epoch


class ClaimScenarios:
    @pytest.fixture
    def backend(self) -> Backend:
        return memory_backend

    # -- A42, R51 -------------------------------------------------------------------------------

    def test_a42_epoch_absent_becomes_1_then_n_plus_1(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, _log, locks):
                await new_run(runs)
                assert await epoch_of(runs) is None

                async def inside(claim: RunClaim) -> tuple[int, int | None]:
                    return claim.epoch, await epoch_of(runs)

                assert await with_run_claim(runs, locks, "r", inside) == (1, 1)
                assert await with_run_claim(runs, locks, "r", inside) == (2, 2)
                await runs.update("r", RunPatch(driver_epoch=7))
                assert await with_run_claim(runs, locks, "r", inside) == (8, 8)
                # interrupted is not terminal: it can be claimed
                await runs.update("r", RunPatch(status="interrupted"))
                assert await with_run_claim(runs, locks, "r", inside) == (9, 9)

        run(main())

    def test_a42_unknown_and_terminal_runs_are_refused_and_keep_their_epoch(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, _log, locks):
                called: list[RunClaim] = []

                async def fn(claim: RunClaim) -> None:
                    called.append(claim)

                with pytest.raises(RunClaimNotAcquiredError) as unknown:
                    await with_run_claim(runs, locks, "nobody", fn)
                assert (unknown.value.run_id, unknown.value.reason) == ("nobody", "unknown")
                for status in ("completed", "failed", "aborted"):
                    await new_run(runs, status, driver_epoch=3, status=status)
                    with pytest.raises(RunClaimNotAcquiredError) as terminal:
                        await with_run_claim(runs, locks, status, fn)
                    assert terminal.value.reason == "terminal"
                    assert await epoch_of(runs, status) == 3
                assert called == []

        run(main())

    def test_a42_admit_refuses_before_the_bump(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, _log, locks):
                await new_run(runs, driver_epoch=4)

                def admit(record: RunRecord) -> None:
                    raise RunClaimNotAcquiredError(record.run_id, "superseded")

                with pytest.raises(RunClaimNotAcquiredError, match="superseded"):
                    await with_run_claim(runs, locks, "r", _epoch, admit=admit)
                assert await epoch_of(runs) == 4

        run(main())

    def test_a42_lock_released_when_the_body_raises(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, _log, locks):
                await new_run(runs)

                async def boom(claim: RunClaim) -> None:
                    raise ValueError("drive failed")

                with pytest.raises(ValueError, match="drive failed"):
                    await with_run_claim(runs, locks, "r", boom)
                # The key is free again at once: a lease left behind would make this wait for its ttl.
                assert await asyncio.wait_for(with_run_claim(runs, locks, "r", _epoch), 2) == 2

        run(main())

    def test_a42_two_claims_serialise_with_epochs_1_and_2(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, _log, locks):
                await new_run(runs)
                trace: list[str] = []

                async def body(claim: RunClaim) -> int:
                    trace.append(f"in {claim.epoch}")
                    await asyncio.sleep(0.05)
                    assert await epoch_of(runs) == claim.epoch  # nobody bumped it while we held it
                    trace.append(f"out {claim.epoch}")
                    return claim.epoch

                epochs = await asyncio.gather(*(with_run_claim(runs, locks, "r", body) for _ in range(2)))
                assert sorted(epochs) == [1, 2]
                assert trace == ["in 1", "out 1", "in 2", "out 2"]

        run(main())

    # -- A43, R52 -------------------------------------------------------------------------------

    def test_a43_quiescence_returns_the_settled_tail_and_never_reads(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, _locks):
                await new_run(runs)
                spy = SpyLog(log)
                assert await await_log_quiescence(spy, "r", 5) == format_offset("r", 0)  # empty
                await log.append("r", [text(1), text(2)])
                spy.calls.clear()
                assert await await_log_quiescence(spy, "r", 5) == format_offset("r", 2)
                assert spy.calls == ["tail", "tail"]  # agreed on the first re-probe; no read, no snapshot

        run(main())

    def test_a43_quiescence_waits_out_a_growing_log(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, _locks):
                await new_run(runs)
                spy = SpyLog(log)

                async def writer() -> None:
                    for i in range(3):
                        await log.append("r", [text(i)])
                        await asyncio.sleep(0.03)

                task = asyncio.create_task(writer())
                await asyncio.sleep(0)
                tail = await await_log_quiescence(spy, "r", 40)
                await task
                assert tail == format_offset("r", 3)
                assert spy.calls.count("tail") >= 3 and "read" not in spy.calls

        run(main())

    def test_a43_a_log_that_never_settles_raises_after_6_probes(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, _locks):
                await new_run(runs)
                spy = SpyLog(log)
                stop = asyncio.Event()

                async def writer() -> None:
                    i = 0
                    while not stop.is_set():
                        await log.append("r", [text(i)])
                        i += 1
                        await asyncio.sleep(0.003)

                task = asyncio.create_task(writer())
                try:
                    with pytest.raises(RunLogNotQuiescentError) as raised:
                        await await_log_quiescence(spy, "r", 20)
                finally:
                    stop.set()
                    await task
                assert raised.value.probes == 6 and raised.value.run_id == "r"
                assert spy.calls == ["tail"] * 7

        run(main())

    # -- A44-A45, R53-R54 (the append fence: a compare-and-set in the store, decision 3) ----------

    def test_a44_lost_lease_refuses_before_any_io(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                await new_run(runs)
                losable = LosableLocks(locks)
                spy = SpyLog(log)

                async def body(claim: RunClaim) -> RunClaimLostError:
                    fenced = fence_event_log(spy, claim)
                    await fenced.append("r", [text(0)])
                    losable.lose()
                    await asyncio.sleep(0)  # the claim's signal mirrors the lease
                    assert claim.signal.aborted and claim.lost and not claim.superseded
                    with pytest.raises(RunClaimLostError) as lost:
                        await fenced.append("r", [text(1)])
                    return lost.value

                error = await with_run_claim(runs, losable, "r", body)
                assert error.observed_epoch == LEASE_LOST and error.held_epoch == 1
                assert spy.calls == ["append"]  # the refused append never reached the log
                assert deltas(await log.snapshot("r")) == ["0"]

        run(main())

    def test_a44_a_bump_refuses_the_very_next_append(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                await new_run(runs)

                async def body(claim: RunClaim) -> RunClaimLostError:
                    fenced = fence_event_log(log, claim)
                    await fenced.append("r", [text(0)])
                    await fenced.append("r", [text(1)], epoch=99)  # the claim's epoch is used, not the caller's
                    assert await steal(runs) == 2
                    with pytest.raises(RunClaimLostError) as lost:
                        await fenced.append("r", [text(2)])
                    return lost.value

                error = await with_run_claim(runs, locks, "r", body)
                assert isinstance(error, EpochFencedError)
                assert (error.held_epoch, error.observed_epoch, error.stored_epoch) == (1, 2, 2)
                # Not one batch after the bump: the check is in the append's own transaction.
                assert deltas(await log.snapshot("r")) == ["0", "1"]

        run(main())

    def test_a45_the_latch_is_one_way_and_costs_no_io(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                await new_run(runs)
                await new_run(runs, "other")
                spy = SpyLog(log)

                async def body(claim: RunClaim) -> None:
                    fenced = fence_event_log(spy, claim)
                    for i in range(40):  # well past any re-check interval: all land while held
                        await fenced.append("r", [text(i)])
                    await steal(runs)
                    with pytest.raises(RunClaimLostError) as first:
                        await fenced.append("r", [text("x")])
                    # Even with the epoch put back, the latch stays shut, and the store is not asked again.
                    await runs.update("r", RunPatch(driver_epoch=claim.epoch))
                    calls = len(spy.calls)
                    with pytest.raises(RunClaimLostError) as second:
                        await fenced.append("r", [text("y")])
                    assert second.value is first.value and len(spy.calls) == calls
                    assert claim.superseded and claim.error is first.value
                    # Other runs pass through unfenced.
                    await fenced.append("other", [text("o")])
                    # A superseded claim does not close the run's log (it is its successor's now)...
                    await fenced.close("r")
                    assert not await log.is_closed("r")
                    # ...but other runs close normally.
                    await fenced.close("other")
                    assert await log.is_closed("other")

                await with_run_claim(runs, locks, "r", body)
                assert deltas(await log.snapshot("r")) == [str(i) for i in range(40)]
                assert deltas(await log.snapshot("other")) == ["o"]

        run(main())

    def test_a45_a_lost_lease_latches_too(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                await new_run(runs)

                async def body(claim: RunClaim) -> None:
                    fenced = fence_event_log(log, claim)
                    with pytest.raises(RunClaimLostError) as lost:
                        await fenced.append("r", [text(0)])
                    assert lost.value.observed_epoch == LEASE_LOST and claim.error is lost.value

                await with_run_claim(runs, LosableLocks(locks, dead=True), "r", body)
                assert await log.snapshot("r") == []

        run(main())

    def test_a45_close_works_while_the_claim_holds(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                await new_run(runs)

                async def body(claim: RunClaim) -> None:
                    fenced = fence_event_log(log, claim)
                    await fenced.append("r", [text(0)])
                    await fenced.close("r")

                await with_run_claim(runs, locks, "r", body)
                assert await log.is_closed("r")

        run(main())

    # -- A46 ------------------------------------------------------------------------------------

    def test_a46_memory_lock_signal_never_aborts(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, _log, _locks):
                await new_run(runs)

                async def body(claim: RunClaim) -> bool:
                    await asyncio.sleep(0.02)
                    return claim.signal.aborted

                assert await with_run_claim(runs, MemoryLockStore(), "r", body) is False

        run(main())

    def test_a46_mid_drive_supersession_keeps_earlier_appends_only(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, _locks):
                await new_run(runs)
                a_locks, b_locks = MemoryLockStore(), MemoryLockStore()  # two hosts: neither lock excludes the other
                superseded = asyncio.Event()
                a_signal_fired: list[bool] = []

                async def a_stream(claim: RunClaim) -> AsyncIterator[ev.Event]:
                    yield started()
                    yield text("a1")
                    yield ev.ToolCallEndEvent(tool_call_id="c")  # flushes
                    await superseded.wait()
                    a_signal_fired.append(claim.signal.aborted)
                    yield text("a-late")
                    yield finished()

                async def host_a(claim: RunClaim) -> RunRecord:
                    return await pipe_claimed(a_stream(claim), runs, log, claim, "t")

                async def host_b(claim: RunClaim) -> RunRecord:
                    return await pipe_claimed(stream_of([text("b1"), finished()]), runs, log, claim, "t")

                a = asyncio.create_task(with_run_claim(runs, a_locks, "r", host_a))
                await until_stored(log, "r", "a1")
                b_final = await with_run_claim(runs, b_locks, "r", host_b)
                superseded.set()
                a_final = await a
                assert a_signal_fired == [False]  # fenced by the epoch alone
                assert b_final.status == "completed" and b_final.driver_epoch == 2
                assert a_final.status == "completed" and a_final.driver_epoch == 2  # B's record, re-read
                assert deltas(await log.snapshot("r")) == ["a1", "b1"]
                stored = await runs.get("r")
                assert stored is not None and stored.status == "completed" and stored.driver_epoch == 2

        run(main())

    # -- A47, R55 (the record fence) --------------------------------------------------------------

    def test_a47_superseded_driver_resolves_and_leaves_the_run_to_its_successor(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                await new_run(runs)
                spy = SpyLog(log)

                async def a(claim: RunClaim) -> RunRecord:
                    await steal(runs)  # B claimed the run between A's claim and its first append
                    return await pipe_claimed(stream_of([started(), text("a"), finished()]), runs, spy, claim, "t")

                a_final = await with_run_claim(runs, locks, "r", a)
                assert a_final.status == "running" and a_final.driver_epoch == 2
                assert await log.snapshot("r") == []
                # No close: our logs refuse appends once closed, so that would end B's run.
                assert "close" not in spy.calls and not await log.is_closed("r")

                async def b(claim: RunClaim) -> RunRecord:
                    return await pipe_claimed(stream_of([started(), text("b"), finished()]), runs, log, claim, "t")

                b_final = await with_run_claim(runs, locks, "r", b)
                assert b_final.status == "completed" and b_final.driver_epoch == 3
                assert deltas(await log.snapshot("r")) == ["b"] and await log.is_closed("r")

        run(main())

    def test_a47_a_lost_claims_terminal_write_is_suppressed_and_logged_once(
        self, backend: Backend, caplog: pytest.LogCaptureFixture
    ) -> None:
        async def main() -> None:
            async with backend() as (runs, _log, locks):
                await new_run(runs)
                await new_run(runs, "other")
                losable = LosableLocks(locks)

                async def body(claim: RunClaim) -> None:
                    fenced = fence_run_store(runs, claim)
                    losable.lose()
                    await asyncio.sleep(0)
                    kept = await fenced.update("r", RunPatch(status="aborted"), expected_epoch=claim.epoch)
                    assert kept is not None and kept.status == "running"  # returned normally, nothing written
                    again = await fenced.update("r", RunPatch(status="failed"))
                    assert again is not None and again.status == "running"
                    # Non-terminal writes and other runs pass through.
                    detached = await fenced.update("r", RunPatch(detached_since=5))
                    assert detached is not None and detached.detached_since == 5
                    other = await fenced.update("other", RunPatch(status="completed"))
                    assert other is not None and other.status == "completed"
                    assert claim.superseded

                with caplog.at_level(logging.DEBUG, logger="boxwright.takeover"):
                    await with_run_claim(runs, losable, "r", body)
                warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "suppressed" in r.message]
                assert len(warnings) == 1 and "aborted" in warnings[0].message
                # The successor then terminalises it.

                async def successor(claim: RunClaim) -> RunRecord | None:
                    return await fence_run_store(runs, claim).update("r", RunPatch(status="completed"))

                final = await with_run_claim(runs, locks, "r", successor)
                assert final is not None and final.status == "completed" and final.driver_epoch == 2

        run(main())

    def test_a47_a_bumped_epoch_suppresses_and_a_store_error_does_not(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, _log, locks):
                await new_run(runs)

                async def bumped(claim: RunClaim) -> None:
                    await steal(runs)
                    kept = await fence_run_store(runs, claim).update("r", RunPatch(status="completed"))
                    assert kept is not None and kept.status == "running" and kept.driver_epoch == 2
                    assert claim.error is not None and claim.error.observed_epoch == 2

                await with_run_claim(runs, locks, "r", bumped)
                faulty = FaultyRuns(runs, fail_update=lambda patch: patch.status == "failed")

                async def store_down(claim: RunClaim) -> None:
                    with pytest.raises(ConnectionError):
                        await fence_run_store(faulty, claim).update("r", RunPatch(status="failed"))
                    assert not claim.lost  # an unanswered question is not a lost claim

                await with_run_claim(runs, locks, "r", store_down)

        run(main())

    def test_a47_optional_store_methods_exist_only_where_the_store_has_them(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, _log, locks):
                await new_run(runs, detached_since=1)

                async def body(claim: RunClaim) -> None:
                    assert isinstance(fence_run_store(runs, claim), RunListing) == isinstance(runs, RunListing)
                    bare = fence_run_store(FaultyRuns(runs), claim)
                    assert not hasattr(bare, "list_reclaimable") and isinstance(bare, RunStore)

                await with_run_claim(runs, locks, "r", body)

        run(main())

    # -- A48, R56 ---------------------------------------------------------------------------------

    def test_a48_driver_appends_at_the_acquired_epoch_after_quiescence(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                await new_run(runs, driver_epoch=4)
                spy = SpyLog(log)
                driver = sandbox_run_driver(runs, locks, spy, lambda *_: stream_of([]), fence_quiet_ms=5)

                async def body(claim: RunClaim) -> RunRecord:
                    assert driver.held_claim("r") is claim and driver.held_claim("x") is None
                    return await driver.pipe(stream_of([started(), text(1), finished()]), "r", "t")

                final = await driver.claim("r", body)
                assert driver.held_claim("r") is None  # the slot is restored after the call
                assert final.status == "completed" and final.driver_epoch == 5
                assert deltas(await log.snapshot("r")) == ["1"] and await log.is_closed("r")
                first_append = spy.calls.index("append")
                # Two quiescence probes, then the announcement check (an empty log gets run.accepted).
                assert spy.calls[:first_append] == ["tail", "tail", "tail"]
                assert "read" not in spy.calls

        run(main())

    def test_a48_pipe_outside_its_claim_raises_and_closes_the_stream(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                await new_run(runs)
                await new_run(runs, "other")
                driver = sandbox_run_driver(runs, locks, log, lambda *_: stream_of([]), fence_quiet_ms=1)
                closed: list[bool] = []
                stream = stream_of([text(1)], closed=closed)
                await stream.__anext__()  # started, so closing it runs its finally
                with pytest.raises(RunDriverPipeOutsideClaimError) as outside:
                    await driver.pipe(stream, "r", "t")
                assert outside.value.run_id == "r" and closed == [True]

                async def wrong_run(claim: RunClaim) -> None:
                    with pytest.raises(RunDriverPipeOutsideClaimError):
                        await driver.pipe(stream_of([text(2)]), "other", "t")

                await driver.claim("r", wrong_run)
                assert await log.snapshot("r") == [] and await log.snapshot("other") == []

        run(main())

    def test_a48_refused_after_a_bump_and_stopped_by_a_lost_lease(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                await new_run(runs)
                driver = sandbox_run_driver(runs, locks, log, lambda *_: stream_of([]), fence_quiet_ms=1)

                async def bumped(claim: RunClaim) -> RunRecord:
                    await steal(runs)
                    return await driver.pipe(stream_of([started(), finished()]), "r", "t")

                final = await driver.claim("r", bumped)
                assert final.status == "running" and final.driver_epoch == 2
                assert await log.snapshot("r") == [] and not await log.is_closed("r")

                losable = LosableLocks(locks)
                lossy = sandbox_run_driver(runs, losable, log, lambda *_: stream_of([]), fence_quiet_ms=1)

                async def live(claim: RunClaim) -> AsyncIterator[ev.Event]:
                    yield started()
                    yield text("before")
                    yield ev.ToolCallEndEvent(tool_call_id="c")
                    await claim.signal.wait()
                    yield text("after")

                async def lose_midway(claim: RunClaim) -> RunRecord:
                    async def loser() -> None:
                        await until_stored(log, "r", "before")
                        losable.lose()

                    task = asyncio.create_task(loser())
                    try:
                        return await lossy.pipe(live(claim), "r", "t")
                    finally:
                        await task

                final = await lossy.claim("r", lose_midway)
                stored = await log.snapshot("r")
                # The lost lease stopped the drive: nothing after it, no RUN_ERROR, no status, log open for a successor.
                assert deltas(stored) == ["before"] and not any(e.type == "RUN_ERROR" for e in stored)
                assert final.status == "running" and final.driver_epoch == 3
                assert not await log.is_closed("r")

        run(main())

    def test_r39_the_detach_verdict_passes_through_the_driver(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                await new_run(runs)
                losable = LosableLocks(locks)
                driver = sandbox_run_driver(runs, losable, log, lambda *_: stream_of([]), fence_quiet_ms=1)

                async def waits(claim: RunClaim) -> AsyncIterator[ev.Event]:
                    yield started()
                    losable.lose()
                    await claim.signal.wait()  # a detached sandbox: the replay stops, the agent goes on

                async def body(claim: RunClaim) -> tuple[RunClaim, RunRecord]:
                    return claim, await driver.pipe(waits(claim), "r", "t", detached=lambda: True)

                claim, final = await driver.claim("r", body)
                # Detached: nothing more written (no refused write either), status running, log open.
                assert final.status == "running" and not claim.superseded
                assert [e.type for e in payload(await log.snapshot("r"))] == ["RUN_STARTED"]
                assert not await log.is_closed("r")

        run(main())

    def test_a48_terminal_run_is_never_piped(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                await new_run(runs, status="completed")
                driver = sandbox_run_driver(runs, locks, log, lambda *_: stream_of([]), fence_quiet_ms=1)
                piped: list[bool] = []

                async def body(claim: RunClaim) -> None:
                    piped.append(True)

                with pytest.raises(RunClaimNotAcquiredError, match="terminal"):
                    await driver.claim("r", body)
                assert piped == []

        run(main())

    # -- A49, R57-R58 (the resume driver) -------------------------------------------------------

    def test_a49_resume_drives_nothing_when_it_should_not(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                driven: list[tuple[str, str]] = []

                def drive(run_id: str, thread_id: str, signal: AbortSignal) -> AsyncIterator[ev.Event]:
                    driven.append((run_id, thread_id))
                    return stream_of([started(run_id, thread_id), finished(run_id, thread_id)])

                async def resume(run_id: str, store: Any = runs) -> bool:
                    return await resume_run(store, locks, log, drive, run_id, fence_quiet_ms=1)

                assert await resume("") is False
                assert await resume("missing") is False
                for status in ("completed", "failed", "aborted"):
                    await new_run(runs, status, status=status)
                    assert await resume(status) is False
                await new_run(runs, "cancelled", cancel_requested=True, detached_since=3)
                assert await resume("cancelled") is False
                await new_run(runs, "r", detached_since=3)
                assert await resume("r", FaultyRuns(runs, status="bogus")) is False
                assert await resume("r", FaultyRuns(runs, fail_get=True)) is False
                assert driven == []
                cancelled = await runs.get("cancelled")
                assert cancelled is not None and cancelled.driver_epoch is None and cancelled.detached_since == 3

        run(main())

    def test_a49_resume_waits_for_a_holder_that_finishes_the_run(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                await new_run(runs, detached_since=3)
                driven: list[str] = []
                holding = asyncio.Event()

                async def holder(_lease: LeaseSignal) -> None:
                    holding.set()
                    await asyncio.sleep(0.05)
                    await runs.update("r", RunPatch(status="completed"))

                task = asyncio.create_task(locks.with_lock(run_driver_lock_key("r"), holder))
                await holding.wait()

                def drive(run_id: str, thread_id: str, signal: AbortSignal) -> AsyncIterator[ev.Event]:
                    driven.append(run_id)
                    return stream_of([])

                assert await resume_run(runs, locks, log, drive, "r", fence_quiet_ms=1) is False
                await task
                assert driven == []

        run(main())

    def test_a49_resume_clears_detached_since_then_drives_with_the_record_thread(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                await new_run(runs, "r", "t-9", detached_since=123, sandbox_key="k")
                await log.append("r", [started("r", "t-9"), text("old")])
                seen: list[tuple[str, str, int | None, bool]] = []

                async def drive(run_id: str, thread_id: str, signal: AbortSignal) -> AsyncIterator[ev.Event]:
                    record = await runs.get(run_id)
                    assert record is not None
                    seen.append((run_id, thread_id, record.detached_since, signal.aborted))
                    yield text("new")
                    yield finished(run_id, thread_id)

                assert await resume_run(runs, locks, log, drive, "r", fence_quiet_ms=1) is True
                assert seen == [("r", "t-9", None, False)]
                record = await runs.get("r")
                assert record is not None and record.status == "completed" and record.driver_epoch == 1
                assert record.sandbox_key == "k"
                assert deltas(await log.snapshot("r")) == ["old", "new"] and await log.is_closed("r")

        run(main())

    def test_a49_a_failed_clear_is_logged_and_a_raising_drive_fails_the_run(self, backend: Backend) -> None:
        async def main() -> None:
            async with backend() as (runs, log, locks):
                await new_run(runs, detached_since=1)
                faulty = FaultyRuns(runs, fail_update=lambda patch: patch.detached_since is None)

                def drive(run_id: str, thread_id: str, signal: AbortSignal) -> AsyncIterator[ev.Event]:
                    raise RuntimeError("no sandbox for this run")

                assert await resume_run(faulty, locks, log, drive, "r", fence_quiet_ms=1) is True
                record = await runs.get("r")
                assert record is not None and record.status == "failed" and record.error is not None
                assert "no sandbox for this run" in record.error.message
                assert record.detached_since == 1  # the clear failed; the drive went on regardless
                # An empty log still opens with RUN_STARTED (AG-UI clients verify the first event).
                assert [e.type for e in payload(await log.snapshot("r"))] == ["RUN_STARTED", "RUN_ERROR"]

        run(main())


class TestClaimMemory(ClaimScenarios):
    pass


def test_claim_lost_error_is_an_epoch_fenced_error_with_fields() -> None:
    error = RunClaimLostError("r", 3, 4)
    assert isinstance(error, EpochFencedError)
    assert (error.run_id, error.held_epoch, error.observed_epoch, error.stored_epoch) == ("r", 3, 4, 4)
    lost = RunClaimLostError("r", 3, LEASE_LOST)
    assert lost.stored_epoch is None and "lease was lost" in str(lost)
    refused = RunClaimNotAcquiredError("r", "terminal")
    assert (refused.run_id, refused.reason) == ("r", "terminal")
    assert not isinstance(InvalidRunStatusError("r", "x"), RunClaimNotAcquiredError)
