"""The coordinator's seams between its replicas: what a successor needs to rebuild a run, who adopts a run whose
replica died, and the watchdog's one final status. Real ``boxwright serve`` processes (or the real app under uvicorn)
over one SQLite file, local-process sandboxes running the command harness's scripted agent.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx

from boxwright.coordinator import CoordinatorConfig, StoreSet
from boxwright.coordinator.scheduler import WATCHDOG_CODE, WATCHDOG_MESSAGE
from boxwright.definition import define_sandbox
from boxwright.events import RunErrorEvent
from boxwright.harnesses.command import CommandHarness
from boxwright.providers import local_process_sandbox
from boxwright.runs import RunPatch
from boxwright.stores.sqlite import (
    SqliteInstanceStore,
    SqliteLockStore,
    SqliteRunStore,
    open_database,
    sqlite_run_backend,
)
from tests.support.coordinator import (
    CLIENT_TOKEN,
    CoordinatorProcess,
    client_headers,
    coordinator_server,
    coordinators,
    scripted_agent,
    sse_events,
    started_together,
    trigger,
    wait_record,
)
from tests.support.replicas import record_row, stored_deltas, stored_events, wait_for

LEASE_MS = 1500


def _config(tmp: Path, db: Path, agent: str, **overrides: Any) -> CoordinatorConfig:
    """A replica's config over the SQLite file ``db``: two local sandbox profiles in their own directories."""
    sqlite = open_database(db)
    runs, log = sqlite_run_backend(sqlite)
    return CoordinatorConfig(
        sandboxes={
            "local": define_sandbox("seams-local", local_process_sandbox(base_dir=tmp / "local"), file_events=False),
            "other": define_sandbox("seams-other", local_process_sandbox(base_dir=tmp / "other"), file_events=False),
        },
        harnesses={"command": CommandHarness(command=agent), "second": CommandHarness(command=agent)},
        stores=StoreSet(runs, log, SqliteLockStore(sqlite), SqliteInstanceStore(sqlite), close=sqlite.close),
        client_token=CLIENT_TOKEN,
        lease_ttl_ms=LEASE_MS,
        **overrides,
    )


def test_a_run_with_other_profiles_is_taken_over_with_them(tmp_path: Path) -> None:
    """The record keeps the profile names the trigger chose (names only); the replica that adopts the run after its
    driver went away rebuilds it with them, not with the first profiles (the other sandbox holds its journal)."""
    agent = scripted_agent(tmp_path)
    db = tmp_path / "coordinator.db"
    thread, run = f"t-{secrets.token_hex(4)}", f"r-prof-{secrets.token_hex(4)}"

    async def main() -> None:
        async with httpx.AsyncClient(headers=client_headers(), timeout=30) as http:
            async with coordinator_server(_config(tmp_path, db, agent, drain_timeout=0.2)) as (a_url, _):
                body = trigger(thread, "lines 30 0.1", run, sandbox="other", harness="second", secret="not-a-name")
                assert (await http.post(f"{a_url}/runs", json=body)).status_code == 202
                record = (await http.get(f"{a_url}/runs/{run}", params={"threadId": thread})).json()
                assert (record["sandboxProfile"], record["harnessProfile"]) == ("other", "second"), record
                await asyncio.to_thread(sse_events, a_url, run, thread, limit=6)
            # A went away mid-run (its lifespan detached the run and released its lease): B adopts it.
            row = record_row(db, run)
            assert row is not None and row["status"] == "running", row
            async with coordinator_server(_config(tmp_path, db, agent)) as (b_url, _):
                attached = await http.post(f"{b_url}/runs/{run}/attach", params={"threadId": thread})
                assert attached.status_code == 202 and attached.json()["driving"] is True, attached.text
                final = await wait_record(b_url, run, thread, status=("completed", "failed", "aborted"), timeout=90)
        assert final["status"] == "completed" and final["driverEpoch"] == 2, final
        assert "not-a-name" not in db.read_bytes().decode(errors="replace")  # metadata itself is never stored
        assert stored_deltas(db, run) == [f"line {i}\n" for i in range(1, 31)]

    asyncio.run(main())


def test_a_run_whose_replica_was_killed_is_adopted_by_the_sweep_with_no_client(tmp_path: Path) -> None:
    """A SIGKILLed mid-run leaves no detach stamp; nobody attaches or tails; B's scheduler sweep finds the run
    running with no live lease, adopts it (epoch 2) and completes it. While A lived, B's sweeps left it alone."""
    agent = scripted_agent(tmp_path)
    db = tmp_path / "coordinator.db"
    thread, run = f"t-{secrets.token_hex(4)}", f"r-sweep-{secrets.token_hex(4)}"
    sweeping = {"BWT_SWEEP_S": "0.5"}
    with coordinators(
        *started_together(
            lambda: CoordinatorProcess("a", tmp_path, agent, lease_ms=LEASE_MS),
            lambda: CoordinatorProcess("b", tmp_path, agent, lease_ms=LEASE_MS, env=sweeping),
        )
    ) as (a, b):
        assert a.post("/runs", trigger(thread, "lines 40 0.1", run)).status_code == 202
        assert len(sse_events(a.url, run, thread, limit=8)) == 8
        time.sleep(1.5)  # B swept about three times meanwhile: A's live lease kept it out
        row = record_row(db, run)
        assert row is not None and row["driver_epoch"] == 1 and row["detached_since"] is None, row
        a.kill()
        failures = lambda: f"A: {a.stderr()}\nB: {b.stderr()}"  # noqa: E731
        final = wait_for("B's end", lambda: (r := record_row(db, run)) and r["status"] != "running" and r, 90)
        assert final["status"] == "completed" and final["driver_epoch"] == 2, (final, failures())
        assert "sweep adopted 1 run(s): " + run in b.stderr(), failures()
        assert stored_deltas(db, run) == [f"line {i}\n" for i in range(1, 41)], failures()
        assert [e.type for e in stored_events(db, run)].count("RUN_FINISHED") == 1


def test_the_watchdog_writes_failed_once_and_the_log_says_why(tmp_path: Path) -> None:
    """An idle run stopped by the watchdog: its driver records ``failed`` (code ``watchdog``) as the one final
    status, never ``aborted`` on the way; the log's terminal RUN_ERROR carries the watchdog's reason; the cancel is
    recorded; its sandbox is gone with its agent."""
    agent = scripted_agent(tmp_path)
    db = tmp_path / "coordinator.db"
    thread, run = f"t-{secrets.token_hex(4)}", f"r-idle-{secrets.token_hex(4)}"

    async def main() -> None:
        config = _config(tmp_path, db, agent, inactivity_timeout=300.0)
        async with httpx.AsyncClient(headers=client_headers(), timeout=30) as http:
            async with coordinator_server(config) as (url, coordinator):
                scheduler = coordinator.scheduler
                now = [1000.0]
                scheduler.clock = lambda: now[0]
                assert (await http.post(f"{url}/runs", json=trigger(thread, "quiet 120", run))).status_code == 202
                await asyncio.to_thread(wait_for, "the agent's line", lambda: stored_deltas(db, run), 60)
                assert await scheduler.watchdog_tick() == []
                await asyncio.sleep(0.5)
                assert await scheduler.watchdog_tick() == []  # whatever followed the line is seen by now
                now[0] += 301.0
                seen: list[str] = []
                stop = asyncio.Event()

                async def watch() -> None:
                    while True:  # one last read after the tick returned
                        done = stop.is_set()
                        seen.append(record_row(db, run)["status"])  # type: ignore[index]
                        if done:
                            return
                        await asyncio.sleep(0.005)

                watcher = asyncio.ensure_future(watch())
                try:
                    assert await scheduler.watchdog_tick() == [run]
                finally:
                    stop.set()
                    await watcher
                record = (await http.get(f"{url}/runs/{run}", params={"threadId": thread})).json()
                assert run not in coordinator.service.active_runs
        assert record["status"] == "failed" and record["cancelRequested"] is True, record
        assert record["error"] == {"message": WATCHDOG_MESSAGE, "code": WATCHDOG_CODE}, record
        assert set(seen) <= {"running", "failed"} and seen[-1] == "failed", sorted(set(seen))
        last = stored_events(db, run)[-1]
        assert isinstance(last, RunErrorEvent) and (last.message, last.code) == (WATCHDOG_MESSAGE, WATCHDOG_CODE), last
        assert not list((tmp_path / "local").glob("*")), "the idle run's sandbox outlived it"

    asyncio.run(main())


def test_a_run_failure_abort_reason_ends_an_unclaimed_run_failed_with_its_error() -> None:
    """Without a claim the pump itself sees the abort: a ``RunFailure`` reason (equal to the cancel reason, so the
    sandbox side treats it as a cancel) ends the run ``failed`` with its error, in the record and the log."""
    from boxwright.abort import AbortController
    from boxwright.events import TextMessageContentEvent
    from boxwright.runs import RUN_CANCEL_REASON, RunError, RunFailure, pipe_to_run_log
    from boxwright.stores.memory import memory_run_backend

    async def main() -> None:
        runs, log = memory_run_backend()
        abort = AbortController()
        error = RunError(message=WATCHDOG_MESSAGE, code=WATCHDOG_CODE)

        async def agent() -> Any:
            yield TextMessageContentEvent(message_id="m", delta="working")
            abort.abort(RunFailure(error))
            await asyncio.sleep(30)  # stopped here by the abort
            yield TextMessageContentEvent(message_id="m", delta="never")

        assert RunFailure(error) == RUN_CANCEL_REASON
        record = await pipe_to_run_log(agent(), runs, log, "r-fail", "t-fail", abort.signal)
        assert (record.status, record.error) == ("failed", error), record
        assert await runs.get("r-fail") == record
        last = (await log.snapshot("r-fail"))[-1]
        assert isinstance(last, RunErrorEvent) and (last.message, last.code) == (WATCHDOG_MESSAGE, WATCHDOG_CODE), last

    asyncio.run(main())


def test_a_database_made_before_the_profile_columns_gets_them(tmp_path: Path) -> None:
    """An existing ``runs`` table without the profile columns is migrated in place; its rows stay readable."""
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TABLE runs (run_id TEXT PRIMARY KEY, thread_id TEXT NOT NULL, status TEXT NOT NULL, "
            "started_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, finished_at INTEGER, error_message TEXT, "
            "error_code TEXT, usage TEXT, sandbox_key TEXT, detached_since INTEGER, cancel_requested INTEGER, "
            "driver_epoch INTEGER)"
        )
        conn.execute(
            "INSERT INTO runs (run_id, thread_id, status, started_at, updated_at) VALUES ('old', 't', 'running', 1, 1)"
        )

    async def main() -> None:
        sqlite = open_database(db)
        try:
            runs = SqliteRunStore(sqlite)
            old = await runs.get("old")
            assert old is not None and (old.status, old.sandbox_profile) == ("running", None)
            written = await runs.update("old", RunPatch(sandbox_profile="docker", harness_profile="claude-box"))
            assert written is not None and (written.sandbox_profile, written.harness_profile) == (
                "docker",
                "claude-box",
            )
            assert [r.run_id for r in await runs.list_running(10)] == ["old"]
        finally:
            await sqlite.close()

    asyncio.run(main())
    assert json.loads(json.dumps(record_row(db, "old")))["harness_profile"] == "claude-box"
