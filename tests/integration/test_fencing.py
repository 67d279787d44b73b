"""Every side effect of a driver is fenced on its claim, not only its appends (issue 10, points 1-3, 6).

In one process over one SQLite file opened twice (two hosts, as far as SQLite can tell): a
superseded driver's detach stamp is refused and its sandbox kept; a claim learns of a cancel or
of a successor through another connection within one renewal interval; what follows the end
(the journal's removal) runs only once the terminal record landed at the driver's epoch. Then
real replicas (``tests.support.replica_app`` under uvicorn) over one file: a driver SIGSTOPped
past its lease and resumed after a successor took over writes nothing, five rounds; a driver
killed right after the agent's exit sentinel, or just before its terminal record, is taken over
from the journal, still there.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from boxwright import events as ev
from boxwright.abort import AbortController
from boxwright.agent import JournalCleanup
from boxwright.definition import EnsureContext, define_sandbox, with_sandbox
from boxwright.errors import RunClaimLostError
from boxwright.events import now_ms
from boxwright.journal import Finished, journal_dir_of, journal_paths, probe_run_exit, start_journaled_agent
from boxwright.middleware.service import RecordDurability
from boxwright.providers import local_process_sandbox
from boxwright.reaper import has_finished_via_journal, journal_pruner, reap_detached_runs, sandbox_handle_for
from boxwright.runs import RUN_CANCEL_REASON, RunPatch, RunRecord, request_run_cancel
from boxwright.sandbox import CreateInput
from boxwright.stores.base import InstanceRecord
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from boxwright.takeover import RunClaim, pipe_claimed, run_claim, run_driver_lock_key
from tests.support.replicas import (
    Replica,
    journal_files,
    log_closed,
    record_row,
    replicas,
    stored_deltas,
    stored_events,
    wait_for,
)

LEASE_MS = 900  # renewal (and claim watch) every 0.3 s


async def _expire_lease(db: Any, run_id: str) -> None:
    # What a stall past the lease looks like to SQLite: the row is there, its time is up.
    async with db.transaction() as conn:
        await conn.execute("UPDATE lock_leases SET expires_at = 0 WHERE key = ?", (run_driver_lock_key(run_id),))


async def _steal(runs: Any, run_id: str) -> None:
    """A successor's claim, as far as the record goes: the epoch moves on."""
    record = await runs.get(run_id)
    assert record is not None
    await runs.update(run_id, RunPatch(driver_epoch=(record.driver_epoch or 0) + 1))


def test_a_superseded_driver_neither_stamps_its_detach_nor_destroys_the_sandbox(tmp_path: Path) -> None:
    """A's client drops after B took the run over: A's detach stamp is a compare-and-set at epoch 1,
    refused; the record keeps B's state and the sandbox (B's now) is left standing."""

    async def main() -> tuple[RunRecord | None, str | None, bool, bool]:
        path = tmp_path / "runs.db"
        async with open_database(path) as db_a, open_database(path) as db_b:
            runs_a, _ = sqlite_run_backend(db_a)
            runs_b, _ = sqlite_run_backend(db_b)
            await runs_a.create_or_resume("r", "t")
            sandbox = define_sandbox("fence", local_process_sandbox(base_dir=tmp_path / "sb"))
            abort = AbortController()
            async with run_claim(runs_a, SqliteLockStore(db_a), "r", lease_ttl_ms=LEASE_MS) as claim:
                durability = RecordDurability(runs_a, "r", claim=claim)
                ctx = EnsureContext(thread_id="t", run_id="r", signal=abort.signal)
                ending: str | None = None
                root = ""
                with contextlib.suppress(asyncio.CancelledError):
                    async with with_sandbox(sandbox, ctx, durability=durability) as scope:
                        root = scope.handle.id
                        await _steal(runs_b, "r")  # B claimed it meanwhile
                        abort.abort("the client went away")  # not a cancel: a durable run would detach
                        raise asyncio.CancelledError
                ending = scope.ending
                superseded = claim.superseded
            return await runs_b.get("r"), ending, Path(root).exists(), superseded

    record, ending, sandbox_kept, superseded = asyncio.run(main())
    assert record is not None and record.detached_since is None and record.sandbox_key is None, record
    assert record.driver_epoch == 2 and record.status == "running"
    assert ending == "superseded" and superseded
    assert sandbox_kept, "a superseded driver must not destroy the sandbox its successor drives"


def test_a_cancel_recorded_through_another_connection_reaches_the_claim_within_one_interval(tmp_path: Path) -> None:
    async def main() -> tuple[float, bool, object]:
        path = tmp_path / "runs.db"
        async with open_database(path) as db_a, open_database(path) as db_b:
            runs_a, _ = sqlite_run_backend(db_a)
            runs_b, _ = sqlite_run_backend(db_b)
            await runs_a.create_or_resume("r", "t")
            async with run_claim(runs_a, SqliteLockStore(db_a), "r", lease_ttl_ms=LEASE_MS) as claim:
                await asyncio.sleep(0.05)
                assert not claim.cancel_signal.aborted
                started = time.monotonic()
                await request_run_cancel(runs_b, "r")  # another host's POST /cancel
                await asyncio.wait_for(claim.cancel_signal.wait(), 10)
                took = time.monotonic() - started
                return took, claim.signal.aborted, claim.run_signal.reason

    took, lost, reason = asyncio.run(main())
    assert took <= 2 * LEASE_MS / 3 / 1000, f"the cancel took {took:.2f} s to reach the claim"
    assert not lost, "a cancel is not a lost claim: the driver still writes the run's end"
    assert reason == RUN_CANCEL_REASON


def test_a_successor_seen_through_another_connection_latches_the_claim(tmp_path: Path) -> None:
    async def main() -> tuple[float, RunClaim]:
        path = tmp_path / "runs.db"
        async with open_database(path) as db_a, open_database(path) as db_b:
            runs_a, _ = sqlite_run_backend(db_a)
            runs_b, _ = sqlite_run_backend(db_b)
            await runs_a.create_or_resume("r", "t")
            async with run_claim(runs_a, SqliteLockStore(db_a), "r", lease_ttl_ms=LEASE_MS) as claim:
                started = time.monotonic()
                await _steal(runs_b, "r")
                await asyncio.wait_for(claim.signal.wait(), 10)
                return time.monotonic() - started, claim

    took, claim = asyncio.run(main())
    assert took <= 2 * LEASE_MS / 3 / 1000, f"the successor took {took:.2f} s to be noticed"
    assert claim.superseded and isinstance(claim.error, RunClaimLostError) and claim.error.observed_epoch == 2
    with pytest.raises(RunClaimLostError):
        claim.check()


def test_the_journal_is_removed_only_after_the_terminal_record_landed_at_the_drivers_epoch(tmp_path: Path) -> None:
    """``after_terminal`` (the journal's removal) sees the terminal record already stored; a driver
    superseded before its end never runs it."""
    seen: list[tuple[str, str | None]] = []

    async def main() -> tuple[RunRecord | None, list[str]]:
        path = tmp_path / "runs.db"
        async with open_database(path) as db_a, open_database(path) as db_b:
            runs_a, log_a = sqlite_run_backend(db_a)
            runs_b, _ = sqlite_run_backend(db_b)
            for run_id in ("done", "taken"):
                await runs_a.create_or_resume(run_id, "t")
            order: list[str] = []

            async def after(record: RunRecord) -> None:
                stored = await runs_b.get(record.run_id)  # through the other connection: it is durable
                seen.append((record.run_id, None if stored is None else stored.status))
                order.append("after_terminal")

            async def events(run_id: str, steal: bool) -> AsyncIterator[ev.Event]:
                yield ev.RunStartedEvent(thread_id="t", run_id=run_id)
                yield ev.TextMessageContentEvent(message_id="m", delta="x")
                if steal:
                    await _steal(runs_b, run_id)
                yield ev.RunFinishedEvent(thread_id="t", run_id=run_id)
                order.append("stream-end")

            locks = SqliteLockStore(db_a)
            async with run_claim(runs_a, locks, "done", lease_ttl_ms=LEASE_MS) as claim:
                await pipe_claimed(events("done", False), runs_a, log_a, claim, "t", after_terminal=after)
            async with run_claim(runs_a, locks, "taken", lease_ttl_ms=LEASE_MS) as claim:
                await pipe_claimed(events("taken", True), runs_a, log_a, claim, "t", after_terminal=after)
            return await runs_b.get("taken"), order

    taken, order = asyncio.run(main())
    assert seen == [("done", "completed")], seen
    assert order == ["stream-end", "after_terminal"], order
    assert taken is not None and taken.status == "running" and taken.driver_epoch == 2


def test_journal_cleanup_is_armed_not_run_and_runs_once(tmp_path: Path) -> None:
    """The cleanup removes nothing until called, and nothing at all when never armed."""

    async def main() -> tuple[bool, bool, bool, bool]:
        provider = local_process_sandbox(base_dir=tmp_path / "sb")

        handle = await provider.create(CreateInput())
        try:
            paths = journal_paths("r", journal_dir_of(handle))
            await handle.process.exec(f"mkdir -p '{paths.dir}' && echo x > '{paths.journal}' && : > '{paths.stderr}'")
            cleanup = JournalCleanup()
            unarmed = await cleanup()
            cleanup.arm(handle, paths)
            there = Path(paths.journal).exists()
            removed = await cleanup()
            return unarmed, there, removed, Path(paths.journal).exists() or Path(paths.stderr).exists()
        finally:
            await handle.destroy()

    unarmed, there, removed, left = asyncio.run(main())
    assert not unarmed and there and removed and not left


def test_the_reaper_prunes_a_finalized_runs_journal_after_its_terminal_record(tmp_path: Path) -> None:
    """A detached run whose agent finished is finalized by the sweep; ``journal_pruner`` then removes
    its journal (the record is terminal by then), and keeps a running sibling's."""

    async def main() -> tuple[RunRecord | None, RunRecord | None, bool, bool, bool]:
        provider = local_process_sandbox(base_dir=tmp_path / "sb")
        handle = await provider.create(CreateInput())
        try:
            async with open_database(tmp_path / "runs.db") as db:
                runs, log = sqlite_run_backend(db)
                instances = SqliteInstanceStore(db)
                await instances.upsert(
                    InstanceRecord(
                        key="k",
                        provider=provider.name,
                        provider_sandbox_id=handle.id,
                        thread_id="t",
                        updated_at=now_ms(),
                    )
                )
                done, going = (
                    journal_paths("done", journal_dir_of(handle)),
                    journal_paths("going", journal_dir_of(handle)),
                )
                for run_id in ("done", "going"):
                    await runs.create_or_resume(run_id, "t")
                    await runs.update(run_id, RunPatch(detached_since=now_ms(), sandbox_key="k"))
                await start_journaled_agent(handle, "echo '{}'", done)
                await start_journaled_agent(handle, "sleep 30", going)
                for _ in range(100):
                    if isinstance(await probe_run_exit(handle, done), Finished):
                        break
                    await asyncio.sleep(0.05)
                handle_for = sandbox_handle_for(provider, instances)

                async def drive(run_id: str, thread_id: str, _signal: Any) -> AsyncIterator[ev.Event]:
                    yield ev.RunStartedEvent(thread_id=thread_id, run_id=run_id)
                    yield ev.RunFinishedEvent(thread_id=thread_id, run_id=run_id)

                await reap_detached_runs(
                    runs,
                    SqliteLockStore(db),
                    log,
                    has_finished=has_finished_via_journal(handle_for),
                    drive=drive,
                    now_ms=now_ms(),
                    detached_run_ttl_ms=3_600_000,
                    fence_quiet_ms=20,
                    prune=journal_pruner(handle_for, runs),
                )
                return (
                    await runs.get("done"),
                    await runs.get("going"),
                    Path(done.journal).exists(),
                    Path(done.stderr).exists(),
                    Path(going.journal).exists(),
                )
        finally:
            await handle.destroy()

    done, going, done_journal, done_sidecar, going_journal = asyncio.run(main())
    assert done is not None and done.status == "completed"
    assert going is not None and going.status == "running"
    assert not done_journal and not done_sidecar, "the finalized run's journal is pruned"
    assert going_journal, "a running run's journal is kept"


# -- replicas under uvicorn --------------------------------------------------------------------------

LINES = 120
AGENT = f'for i in $(seq 1 {LINES}); do echo "line $i"; sleep 0.04; done'
REPLICA_LEASE_MS = 1500
EXPECTED = [f"line {i}\n" for i in range(1, LINES + 1)]


def _terminal(db: Path, run_id: str) -> dict[str, Any] | None:
    row = record_row(db, run_id)
    return row if row is not None and row["status"] in ("completed", "failed", "aborted") else None


def _tail(replica: Replica, run_id: str) -> None:
    """A client coming back to ``replica`` for the run: its SSE route takes an orphaned run over.

    The client stays (in a thread of its own) until the stream ends, as a browser would: one that
    hangs up at its first line, while the replica still waits out the lease and its quiet window,
    can take the takeover it started down with it, and then nobody claims the run.
    """

    def read() -> None:
        with contextlib.suppress(httpx.HTTPError):
            with httpx.stream("GET", f"{replica.url}/runs/{run_id}/events", timeout=httpx.Timeout(30, read=90)) as r:
                for _line in r.iter_lines():
                    pass

    threading.Thread(target=read, name=f"tail {run_id}", daemon=True).start()


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _write_lock_free(db: Path) -> bool:
    conn = sqlite3.connect(db, timeout=0.2, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


def _pause_outside_a_write(replica: Replica, db: Path) -> None:
    """SIGSTOP ``replica`` at a moment it holds no SQLite write lock.

    A process paused inside a write transaction (an append, a lease renewal: milliseconds, many a
    second) keeps the database file's one write lock until it runs again: every replica on that file
    waits ("database is locked"). That is SQLite's locking on one host, measured here in CI; the
    Redis stores have no such lock. What this test is about is a paused driver's *fencing*, so it
    pauses A between two writes (it comes back, SIGCONT, and is paused again if it was inside one).
    """
    for _ in range(50):
        replica.stop()
        # SIGSTOP lands asynchronously: the lock is looked at once the process is stopped (state T).
        wait_for("A to stop", lambda: _state(replica.proc.pid) == "T", 10, interval=0.005)
        if _write_lock_free(db):
            return
        replica.resume()
        time.sleep(0.02)
    raise AssertionError("A was inside a write at each of 50 pauses")


@pytest.mark.parametrize("round_", range(5))
def test_a_driver_resumed_after_its_successor_took_over_writes_nothing(tmp_path: Path, round_: int) -> None:
    """SIGSTOP A mid-run, past its lease; B takes over (default 5 s quiet window); SIGCONT A at a
    different moment each round (during B's quiet window, its replay, after its end). Every line
    once, in order, ``completed`` at epoch 2, and after A ran again nothing it could write moved:
    no record field, no event, no journal removal before B's end (B replays the whole journal)."""
    db, base = tmp_path / "runs.db", tmp_path / "sb"
    run_id = f"stop-{round_}-{tmp_path.name[-12:]}"
    with replicas(
        Replica("a", db, base, AGENT, lease_ms=REPLICA_LEASE_MS),
        Replica("b", db, base, AGENT, lease_ms=REPLICA_LEASE_MS),
    ) as (a, b):
        assert a.post("/runs", {"prompt": "go", "threadId": f"t-{run_id}", "runId": run_id}).status_code == 202
        wait_for("20 lines stored", lambda: len(stored_deltas(db, run_id)) >= 20, 30)
        _pause_outside_a_write(a, db)
        time.sleep(REPLICA_LEASE_MS / 1000 + 0.8)  # A's lease runs out
        _tail(b, run_id)
        try:
            wait_for("B's claim", lambda: (record_row(db, run_id) or {}).get("driver_epoch") == 2, 60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; record {record_row(db, run_id)}\nA: {a.stderr()}\nB: {b.stderr()}") from None
        # 0: inside B's quiet window, the agent still writing; 1: quiet window, agent done;
        # 2: while B replays; 3, 4: after B's end.
        resume_after = [1.0, 4.0, 6.0, None, None][round_]
        if resume_after is not None:
            time.sleep(resume_after)
            a.resume()
        final = wait_for("B's end", lambda: _terminal(db, run_id), 60)
        if resume_after is None:
            time.sleep(0.5 if round_ == 3 else 2.0)
            a.resume()
        time.sleep(3 * REPLICA_LEASE_MS / 1000)  # A runs again: lease check, claim watch, journal reader
        assert a.proc.poll() is None, f"A died: {a.stderr()}"
        after = record_row(db, run_id)
        events = stored_events(db, run_id)
        failures = f"A: {a.stderr()}\nB: {b.stderr()}"
        assert final["status"] == "completed" and final["driver_epoch"] == 2, (final, failures)
        assert after == final, f"a record field moved after B's end: {final} -> {after}\n{failures}"
        assert after is not None and after["detached_since"] is None and after["error_message"] is None
        assert stored_deltas(db, run_id) == EXPECTED, failures
        assert [e.type for e in events].count("RUN_FINISHED") == 1 and events[-1].type == "RUN_FINISHED"
        assert not any(e.type == "RUN_ERROR" for e in events), failures
        assert log_closed(db, run_id)
        # B records the end, then removes the journal: on a loaded machine the removal comes a moment later.
        wait_for("B to remove its journal", lambda: journal_files(run_id, Path(f"{base}.state")) == [], 30)


@pytest.mark.parametrize("exit_code", [0, 3], ids=["completed", "failed"])
@pytest.mark.parametrize("point", ["agent.exit-sentinel", "run.finish"])
def test_a_driver_killed_after_the_exit_sentinel_is_taken_over_from_the_journal(
    tmp_path: Path, point: str, exit_code: int
) -> None:
    """A dies right after reading the agent's exit sentinel (or just before its terminal record):
    the journal is still there, and B, taking the run over, finishes it from the journal. An agent that
    failed (exit 3) is recorded failed with the error the log holds, once: at ``run.finish`` the log
    already ends with it, and B's replay, which matches it, adds nothing that would say otherwise."""
    db, base = tmp_path / "runs.db", tmp_path / "sb"
    run_id = f"kill-{point.replace('.', '-')}-{exit_code}-{tmp_path.name[-12:]}"
    agent = AGENT if exit_code == 0 else f"{AGENT}; exit {exit_code}"
    a = Replica("a", db, base, agent, lease_ms=REPLICA_LEASE_MS, env={"BOXWRIGHT_FAULT": f"{point}:kill"})
    with replicas(a, Replica("b", db, base, agent, lease_ms=REPLICA_LEASE_MS)) as (a, b):
        assert a.post("/runs", {"prompt": "go", "threadId": f"t-{run_id}", "runId": run_id}).status_code == 202
        a.proc.wait(timeout=60)
        assert f"boxwright fault: {point}" in a.stderr(), a.stderr()
        row = record_row(db, run_id)
        assert row is not None and row["status"] == "running"
        assert journal_files(run_id, Path(f"{base}.state")), "the journal must outlive the exit sentinel"
        _tail(b, run_id)
        final = wait_for("B's end", lambda: _terminal(db, run_id), 60)
        failures = f"B: {b.stderr()}"
        events = stored_events(db, run_id)
        kinds = [e.type for e in events]
        assert stored_deltas(db, run_id) == EXPECTED, failures
        assert final["driver_epoch"] == 2, (final, failures)
        if exit_code == 0:
            assert final["status"] == "completed", (final, failures)
            assert kinds.count("RUN_FINISHED") == 1 and "RUN_ERROR" not in kinds, (kinds, failures)
        else:
            errors = [e for e in events if isinstance(e, ev.RunErrorEvent)]
            assert len(errors) == 1 and events[-1] is errors[0] and "RUN_FINISHED" not in kinds, (kinds, failures)
            assert final["status"] == "failed", (final, failures)
            assert final["error_message"] == errors[0].message, (final, errors[0], failures)
        assert log_closed(db, run_id)
        # B records the end, then removes the journal: on a loaded machine the removal comes a moment later.
        wait_for("B to remove its journal", lambda: journal_files(run_id, Path(f"{base}.state")) == [], 30)


def test_a_host_killed_inside_sandbox_creation_holds_the_sandbox_lock_for_its_run_lease_only(tmp_path: Path) -> None:
    """A dies holding the sandbox's lock, right before the provider's create: that lock's lease is the
    service's run lease (1.5 s here), not the lock store's 30 s default, so B's takeover re-enters the
    sandbox as soon as it may drive the run, and finishes it once."""
    db, base = tmp_path / "runs.db", tmp_path / "sb"
    run_id = f"kill-create-{tmp_path.name[-12:]}"
    a = Replica("a", db, base, AGENT, lease_ms=REPLICA_LEASE_MS, env={"BOXWRIGHT_FAULT": "sandbox.create:kill"})
    with replicas(a, Replica("b", db, base, AGENT, lease_ms=REPLICA_LEASE_MS)) as (a, b):
        assert a.post("/runs", {"prompt": "go", "threadId": f"t-{run_id}", "runId": run_id}).status_code == 202
        a.proc.wait(timeout=60)
        died_ms = now_ms()
        assert "boxwright fault: sandbox.create" in a.stderr(), a.stderr()
        with contextlib.closing(sqlite3.connect(db, timeout=10)) as conn:
            leases = conn.execute("SELECT expires_at FROM lock_leases WHERE key LIKE 'sandbox:%'").fetchall()
        assert len(leases) == 1, leases
        # A's last renewal set the expiry at most one lease past its death (a 30 s lease would be far past).
        assert leases[0][0] - died_ms <= REPLICA_LEASE_MS, (leases, died_ms)
        _tail(b, run_id)
        final = wait_for("B's end", lambda: _terminal(db, run_id), 60)
        failures = f"B: {b.stderr()}"
        assert final["status"] == "completed" and final["driver_epoch"] == 2, (final, failures)
        assert stored_deltas(db, run_id) == EXPECTED, failures
