"""Claim, fences, run drivers and the reaper on SQLite files, in one process and across two (A42-A49, A53-A64).

The scenarios of tests/unit/test_takeover_claim.py and tests/unit/test_reaper.py run again
here on ``SqliteRunStore`` + ``SqliteEventLog`` + ``SqliteLockStore`` over a real file; then
a lease really lost to another connection, and two processes racing to claim one run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from boxwright import events as ev
from boxwright.errors import RunClaimLostError
from boxwright.runs import EventLog, RunRecord, RunStore
from boxwright.stores.base import LockStore
from boxwright.stores.sqlite import SqliteLockStore, open_database, sqlite_run_backend
from boxwright.takeover import (
    LEASE_LOST,
    RunClaim,
    pipe_claimed,
    run_driver_lock_key,
    sandbox_run_driver,
    with_run_claim,
)
from tests.unit.test_reaper import ReaperScenarios
from tests.unit.test_takeover_claim import Backend, ClaimScenarios, deltas, run, stream_of

REPO = Path(__file__).resolve().parents[2]


def sqlite_backend(path: Path) -> Backend:
    @contextlib.asynccontextmanager
    async def backend() -> AsyncIterator[tuple[RunStore, EventLog, LockStore]]:
        async with open_database(path) as db:
            runs, log = sqlite_run_backend(db)
            yield runs, log, SqliteLockStore(db)

    return backend


class TestClaimSqlite(ClaimScenarios):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> Backend:
        return sqlite_backend(tmp_path / "runs.db")


class TestReaperSqlite(ReaperScenarios):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> Backend:
        return sqlite_backend(tmp_path / "runs.db")


def test_a46_a_lease_lost_to_another_connection_stops_its_holder(tmp_path: Path) -> None:
    """A's lease row expires under it (a stall, as far as SQLite can tell); B takes the key over and
    finishes the run; A's renewal finds the row gone, its signal fires, and it writes nothing more."""

    async def main() -> tuple[RunClaim, RunRecord, list[ev.Event], RunRecord | None, bool]:
        path = tmp_path / "runs.db"
        async with open_database(path) as db_a, open_database(path) as db_b:
            runs_a, log_a = sqlite_run_backend(db_a)
            runs_b, log_b = sqlite_run_backend(db_b)
            await runs_a.create_or_resume("r", "t")
            a_holds = asyncio.Event()

            async def a_stream(claim: RunClaim) -> AsyncIterator[ev.Event]:
                yield ev.RunStartedEvent(thread_id="t", run_id="r")
                yield ev.TextMessageContentEvent(message_id="m", delta="a1")
                yield ev.ToolCallEndEvent(tool_call_id="c")
                a_holds.set()
                await claim.signal.wait()
                yield ev.TextMessageContentEvent(message_id="m", delta="a-late")

            async def host_a(claim: RunClaim) -> tuple[RunClaim, RunRecord]:
                return claim, await pipe_claimed(a_stream(claim), runs_a, log_a, claim, "t")

            a = asyncio.create_task(with_run_claim(runs_a, SqliteLockStore(db_a), "r", host_a, lease_ttl_ms=900))
            await a_holds.wait()
            async with db_b.transaction() as conn:
                await conn.execute("UPDATE lock_leases SET expires_at = 0 WHERE key = ?", (run_driver_lock_key("r"),))
            driver_b = sandbox_run_driver(
                runs_b, SqliteLockStore(db_b), log_b, lambda *_: stream_of([]), fence_quiet_ms=20
            )

            async def host_b(claim: RunClaim) -> RunRecord:
                done = [
                    ev.TextMessageContentEvent(message_id="m", delta="b1"),
                    ev.RunFinishedEvent(thread_id="t", run_id="r"),
                ]
                return await driver_b.pipe(stream_of(done), "r", "t")

            b_final = await driver_b.claim("r", host_b)
            claim_a, a_final = await asyncio.wait_for(a, 10)
            assert b_final.status == "completed" and b_final.driver_epoch == 2
            return claim_a, a_final, await log_b.snapshot("r"), await runs_b.get("r"), await log_b.is_closed("r")

    claim_a, a_final, stored, record, closed = run(main())
    assert claim_a.signal.aborted and isinstance(claim_a.signal.reason, RunClaimLostError)
    assert claim_a.superseded and claim_a.error is not None
    assert claim_a.error.observed_epoch in (LEASE_LOST, 2)
    assert a_final.status == "completed" and a_final.driver_epoch == 2  # B's record, re-read
    assert deltas(stored) == ["a1", "b1"] and not any(e.type == "RUN_ERROR" for e in stored)
    assert record is not None and record.status == "completed" and record.driver_epoch == 2 and closed


# -- two processes ------------------------------------------------------------------------------------

RACER = r"""
import asyncio, json, os, sys, time

from boxwright import events as ev
from boxwright.errors import EpochFencedError
from boxwright.runs import RunPatch
from boxwright.stores.sqlite import SqliteLockStore, open_database, sqlite_run_backend
from boxwright.takeover import sandbox_run_driver

STALL_S = 1.5
LEASE_TTL_MS = 300


async def main(db_path, run_id, name, go_path):
    async with open_database(db_path) as db:
        runs, log = sqlite_run_backend(db)
        locks = SqliteLockStore(db)
        await runs.get(run_id)
        await locks.with_lock("warm-up", lambda lease: asyncio.sleep(0))
        print("ready", flush=True)
        while not os.path.exists(go_path):
            await asyncio.sleep(0.002)
        report = {"name": name}

        async def stream(claim):
            yield ev.RunStartedEvent(thread_id="t", run_id=run_id)
            yield ev.TextMessageContentEvent(message_id=name, delta=f"{name}-early")
            yield ev.ToolCallEndEvent(tool_call_id=name)
            if claim.epoch == 1:
                # A GC pause or a suspended VM: the whole loop stops, so nobody renews the lease.
                time.sleep(STALL_S)
            yield ev.TextMessageContentEvent(message_id=name, delta=f"{name}-late")
            yield ev.RunFinishedEvent(thread_id="t", run_id=run_id)

        driver = sandbox_run_driver(runs, locks, log, lambda *_: None, fence_quiet_ms=50, lease_ttl_ms=LEASE_TTL_MS)

        async def body(claim):
            report["epoch"] = claim.epoch
            final = await driver.pipe(stream(claim), run_id, "t")
            report.update(final=final.status, final_epoch=final.driver_epoch, superseded=claim.superseded)
            if claim.superseded:
                # Past every wrapper, straight to the store: the log and the record still refuse this epoch.
                event = ev.TextMessageContentEvent(message_id=name, delta="direct")
                failed = RunPatch(status="failed")
                for what, write in (
                    ("direct_append", lambda: log.append(run_id, [event], epoch=claim.epoch)),
                    ("direct_update", lambda: runs.update(run_id, failed, expected_epoch=claim.epoch)),
                ):
                    try:
                        await write()
                        report[what] = "landed"
                    except EpochFencedError as exc:
                        report[what] = type(exc).__name__

        await driver.claim(run_id, body)
        print(json.dumps(report), flush=True)


asyncio.run(main(*sys.argv[1:5]))
"""


def test_two_processes_race_to_claim_one_run_and_the_superseded_one_writes_nothing(tmp_path: Path) -> None:
    path, go = tmp_path / "runs.db", tmp_path / "go"

    async def prepare() -> None:
        async with open_database(path) as db:
            runs, _ = sqlite_run_backend(db)
            await runs.create_or_resume("r", "t")

    run(prepare())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(path), "r", name, str(go)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("p0", "p1")
    ]
    try:
        for racer in racers:
            assert racer.stdout is not None and racer.stdout.readline().strip() == "ready"
        go.touch()  # both claim at once
        outputs = [racer.communicate(timeout=60)[0] for racer in racers]
        assert [racer.returncode for racer in racers] == [0, 0]
    finally:
        for racer in racers:
            racer.kill()
            racer.wait()
    reports = sorted((json.loads(out.strip().splitlines()[-1]) for out in outputs), key=lambda r: r["epoch"])
    first, second = reports
    assert [first["epoch"], second["epoch"]] == [1, 2]
    # The first claimant stalled past its lease; the second took the run over and finished it.
    assert (second["final"], second["final_epoch"], second["superseded"]) == ("completed", 2, False)
    assert (first["final"], first["final_epoch"], first["superseded"]) == ("completed", 2, True)
    assert first["direct_append"] == "EpochFencedError" and first["direct_update"] == "EpochFencedError"

    async def final() -> tuple[list[ev.Event], RunRecord | None, bool]:
        async with open_database(path) as db:
            runs, log = sqlite_run_backend(db)
            return await log.snapshot("r"), await runs.get("r"), await log.is_closed("r")

    stored, record, closed = run(final())
    a, b = first["name"], second["name"]
    # The superseded driver kept what it wrote before the takeover and landed nothing after it.
    assert deltas(stored) == [f"{a}-early", f"{b}-early", f"{b}-late"]
    assert not any(e.type == "RUN_ERROR" for e in stored)
    assert record is not None and (record.status, record.driver_epoch) == ("completed", 2) and closed
