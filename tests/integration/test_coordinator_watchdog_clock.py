"""The inactivity watchdog counts idle time from the log's last event, and also fails runs nobody drives.

1. A run idle for 4 minutes before a replica adopts it is failed about 1 minute after the adoption (a
   5-minute timeout), not 5: the idle clock is the last stored event's timestamp, not the moment the
   adopter first looked.
2. With the sweep off, a SIGKILLed replica's idle run is still failed: the survivors' watchdogs adopt it
   through the one takeover path (the lease is the fence) and fail it. Two survivors ticking at once:
   one claims it (epoch 2), the other's probe is withdrawn; a live replica's idle run is left to it.

Real coordinators over one SQLite file (in-process under uvicorn, or a ``boxwright serve`` process for the
one that dies), the command harness's scripted agent in local-process sandboxes. Both clocks of the
scheduler are fakes the test moves: ``clock`` (monotonic) and ``wall_clock`` (what event stamps are
compared with).
"""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from boxwright.coordinator import CoordinatorConfig, StoreSet
from boxwright.coordinator.scheduler import WATCHDOG_CODE, WATCHDOG_MESSAGE, Scheduler
from boxwright.definition import define_sandbox
from boxwright.events import RunErrorEvent, RunStartedEvent, now_ms
from boxwright.harnesses.command import CommandHarness
from boxwright.providers import local_process_sandbox
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from tests.support.agent_procs import running_with_arg
from tests.support.coordinator import (
    CLIENT_TOKEN,
    CoordinatorProcess,
    client_headers,
    coordinator_server,
    coordinators,
    scripted_agent,
    trigger,
)
from tests.support.replicas import record_row, stored_deltas, stored_events, wait_for

LEASE_MS = 1500
TIMEOUT_S = 300.0


def _config(tmp: Path, db: Path, agent: str, **overrides: Any) -> CoordinatorConfig:
    """A replica over ``db`` with ``tests.support.coordinator``'s profiles ("local" + "command"), so any replica
    (a ``boxwright serve`` process among them) rebuilds the others' runs; no watchdog loop, no sweep: the test
    ticks the watchdog itself."""
    sqlite = open_database(db)
    runs, log = sqlite_run_backend(sqlite)
    settings: dict[str, Any] = {
        "inactivity_timeout": TIMEOUT_S,
        "watchdog_interval": 0.0,
        "sweep_interval": 0.0,
        "drain_timeout": 0.2,
        **overrides,
    }
    return CoordinatorConfig(
        sandboxes={"local": define_sandbox("coordinator-test", local_process_sandbox(base_dir=tmp / "sandboxes"))},
        harnesses={"command": CommandHarness(command=agent)},
        stores=StoreSet(runs, log, SqliteLockStore(sqlite), SqliteInstanceStore(sqlite), close=sqlite.close),
        client_token=CLIENT_TOKEN,
        lease_ttl_ms=LEASE_MS,
        **settings,
    )


class _Clocks:
    """The scheduler's two clocks, moved together: ``skip(s)`` is ``s`` seconds passing."""

    def __init__(self) -> None:
        self.monotonic = 1000.0
        self.skew = 0.0

    def install(self, scheduler: Scheduler) -> None:
        scheduler.clock = lambda: self.monotonic
        scheduler.wall_clock = lambda: time.time() + self.skew

    def skip(self, seconds: float) -> None:
        self.monotonic += seconds
        self.skew += seconds


def _sandboxes(tmp: Path) -> set[Path]:
    return set((tmp / "sandboxes").glob("*"))


def _quiet_agent_started(db: Path, run: str) -> Callable[[], object]:
    return lambda: stored_deltas(db, run) == ["started\n"]


def _sandbox_reentered(db: Path, run: str, since_ms: int) -> Callable[[], object]:
    """Whether a takeover of ``run`` has ensured its sandbox again since ``since_ms`` (its instance record says so)."""

    def check() -> bool:
        with sqlite3.connect(db) as conn:
            rows = conn.execute("SELECT updated_at FROM sandbox_instances WHERE latest_run_id = ?", (run,)).fetchall()
        return any(updated >= since_ms for (updated,) in rows)

    return check


def test_a_run_idle_before_its_adoption_is_failed_when_its_timeout_is_up(tmp_path: Path) -> None:
    """Idle 4 min when B adopts it (A went away): B's watchdog fails it 61 s later, with the watchdog's reason."""
    agent = scripted_agent(tmp_path)
    db = tmp_path / "coordinator.db"
    thread, run = f"t-{secrets.token_hex(4)}", f"r-adopt-{secrets.token_hex(4)}"

    async def main() -> None:
        async with httpx.AsyncClient(headers=client_headers(), timeout=30) as http:
            async with coordinator_server(_config(tmp_path, db, agent)) as (a_url, _):
                assert (await http.post(f"{a_url}/runs", json=trigger(thread, "quiet 600", run))).status_code == 202
                await asyncio.to_thread(wait_for, "the agent's line", _quiet_agent_started(db, run), 60)
            # A went away (its lifespan detached the run, released its lease); the agent sleeps on.
            made = _sandboxes(tmp_path)
            assert made and record_row(db, run)["status"] == "running"  # type: ignore[index]
            async with coordinator_server(_config(tmp_path, db, agent)) as (b_url, b):
                clocks = _Clocks()
                clocks.install(b.scheduler)
                clocks.skip(240.0)  # nobody watched the run for 4 minutes
                adopted_at = now_ms()
                attached = await http.post(f"{b_url}/runs/{run}/attach", params={"threadId": thread})
                assert attached.status_code == 202 and attached.json()["driving"] is True, attached.text
                assert await b.scheduler.watchdog_tick() == []  # idle 4 min: not yet
                # The takeover waits out the log's quiet window, then re-enters the sandbox (in real time).
                await asyncio.to_thread(wait_for, "the re-entry", _sandbox_reentered(db, run, adopted_at), 60)
                clocks.skip(61.0)
                # 5 min 1 s since the agent's line; counted from the adoption it would be 61 s.
                assert await b.scheduler.watchdog_tick() == [run]
                record = (await http.get(f"{b_url}/runs/{run}", params={"threadId": thread})).json()
        assert record["status"] == "failed" and record["driverEpoch"] == 2, record
        assert record["error"] == {"message": WATCHDOG_MESSAGE, "code": WATCHDOG_CODE}, record
        assert record["cancelRequested"] is True, record
        last = stored_events(db, run)[-1]
        assert isinstance(last, RunErrorEvent) and last.code == WATCHDOG_CODE, last
        await asyncio.to_thread(wait_for, "the sandbox's removal", lambda: not any(p.exists() for p in made), 30)
        # A's agent too: B's new handle found it in the sandbox's process record and killed it.
        assert await asyncio.to_thread(running_with_arg, tmp_path / "scripted_agent.py", 30) == []

    asyncio.run(main())


def test_with_no_sweep_a_dead_replicas_idle_run_is_failed_once_by_the_survivors(tmp_path: Path) -> None:
    """A (a ``boxwright serve`` process) drives an idle run, then is SIGKILLed. B and C (sweep off) tick their
    watchdogs: while A lived its lease kept them out; after, one of them adopts and fails the run, once."""
    agent = scripted_agent(tmp_path)
    db = tmp_path / "coordinator.db"
    thread, run = f"t-{secrets.token_hex(4)}", f"r-orphan-{secrets.token_hex(4)}"

    async def main(a: CoordinatorProcess) -> None:
        assert (await asyncio.to_thread(a.post, "/runs", trigger(thread, "quiet 600", run))).status_code == 202
        await asyncio.to_thread(wait_for, "the agent's line", _quiet_agent_started(db, run), 60)
        made = _sandboxes(tmp_path)
        assert made, "the run's sandbox is not where the test looks"
        async with (
            coordinator_server(_config(tmp_path, db, agent)) as (_, b),
            coordinator_server(_config(tmp_path, db, agent)) as (_, c),
        ):
            clocks = _Clocks()
            clocks.install(b.scheduler)
            clocks.install(c.scheduler)
            clocks.skip(TIMEOUT_S + 1)
            # Idle past the timeout, but A is alive and renews its lease: its run, not theirs.
            assert list(await asyncio.gather(b.scheduler.watchdog_tick(), c.scheduler.watchdog_tick())) == [[], []]
            row = record_row(db, run)
            assert row is not None and row["status"] == "running" and row["driver_epoch"] == 1, row
            await asyncio.to_thread(a.kill)
            killed_at = now_ms()
            # Until A's lease lapses (1.5 s): both probe at once each round; one adopts the run.
            deadline = time.monotonic() + 60
            while record_row(db, run)["driver_epoch"] == 1 and time.monotonic() < deadline:  # type: ignore[index]
                assert list(await asyncio.gather(b.scheduler.watchdog_tick(), c.scheduler.watchdog_tick())) == [[], []]
            row = record_row(db, run)
            assert row is not None and row["driver_epoch"] == 2, (row, a.stderr())
            await asyncio.to_thread(wait_for, "the re-entry", _sandbox_reentered(db, run, killed_at), 60)
            # The adopter fails it as a run it drives; the other has nothing to do.
            failed = await asyncio.gather(b.scheduler.watchdog_tick(), c.scheduler.watchdog_tick())
            assert sorted(failed) == [[], [run]], (failed, a.stderr())
            # Failed for good: the next ticks do nothing more.
            assert list(await asyncio.gather(b.scheduler.watchdog_tick(), c.scheduler.watchdog_tick())) == [[], []]
        row = record_row(db, run)
        assert row is not None and (row["status"], row["driver_epoch"]) == ("failed", 2), row
        assert (row["error_message"], row["error_code"]) == (WATCHDOG_MESSAGE, WATCHDOG_CODE), row
        assert row["cancel_requested"] == 1, row
        events = stored_events(db, run)
        assert stored_deltas(db, run) == ["started\n"], "the agent's output was stored twice"
        assert sum(isinstance(e, RunStartedEvent) for e in events) == 1, [e.type for e in events]
        errors = [e for e in events if isinstance(e, RunErrorEvent)]
        assert [(e.message, e.code) for e in errors] == [(WATCHDOG_MESSAGE, WATCHDOG_CODE)], errors
        # The agent went with the run: the watchdog cancels its sandbox, though A made it.
        await asyncio.to_thread(wait_for, "the sandbox's removal", lambda: not any(p.exists() for p in made), 30)
        # A's agent too, though A was SIGKILLed: the adopter's destroy found it in the process record.
        assert await asyncio.to_thread(running_with_arg, tmp_path / "scripted_agent.py", 30) == [], a.stderr()

    with coordinators(CoordinatorProcess("a", tmp_path, agent, lease_ms=LEASE_MS)) as (a,):
        asyncio.run(main(a))
