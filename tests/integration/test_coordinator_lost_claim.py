"""A replica whose claim on an adopted run lapses adopts the run again (issue 14, the co-located chaos rounds).

Measured in the co-located chaos rounds: B adopted a run whose replica A was SIGKILLed (epoch 2), its lease
lapsed right after (its renewal was a task of a loop that lagged past the lease on a loaded machine), its
drive stopped, and nobody drove the run again while the client tailed B: a tail starts a takeover only as
it opens. Here the lapse is made on purpose, once B holds epoch 2: its lease row is deleted, which is what
an expired lease looks like to its renewal (the key is free, nobody else claimed the run). B adopts the run
again at epoch 3, and the client that was tailing B all along gets every event once and the completed status.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import secrets
import sqlite3
from pathlib import Path

import pytest

from boxwright.takeover import run_driver_lock_key
from tests.support.coordinator import CoordinatorProcess, coordinators, scripted_agent, sse_events, started_together
from tests.support.coordinator import trigger as trigger_body
from tests.support.replicas import record_row, stored_deltas, wait_for

LINES = 60
LEASE_MS = 1500
# Hang bounds on a loaded 2-core machine, not speed bounds.
STARTUP_S = 120.0
TAIL_S = 90.0


def _deltas(frames: list[tuple[str | None, str | None, str]]) -> list[str]:
    decoded = [json.loads(data) for event, _, data in frames if event is None]
    return [d["delta"] for d in decoded if d["type"] == "TEXT_MESSAGE_CONTENT"]


def _drop_lease(db: Path, run_id: str) -> int:
    with contextlib.closing(sqlite3.connect(db, timeout=10, isolation_level=None)) as conn:
        return conn.execute("DELETE FROM lock_leases WHERE key = ?", (run_driver_lock_key(run_id),)).rowcount


@pytest.mark.timeout(300)
def test_a_successor_whose_lease_lapses_right_after_adopting_adopts_the_run_again(tmp_path: Path) -> None:
    agent = scripted_agent(tmp_path)
    db = tmp_path / "coordinator.db"
    thread, run = f"t-{secrets.token_hex(4)}", f"r-lapse-{secrets.token_hex(4)}"
    # The pool outside the replicas: closing B ends a tail still open, so the pool's exit never hangs on it.
    with (
        concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool,
        coordinators(
            *started_together(
                lambda: CoordinatorProcess("a", tmp_path, agent, lease_ms=LEASE_MS, startup_s=STARTUP_S),
                lambda: CoordinatorProcess("b", tmp_path, agent, lease_ms=LEASE_MS, startup_s=STARTUP_S),
            )
        ) as (a, b),
    ):
        assert a.post("/runs", trigger_body(thread, f"lines {LINES} 0.1", run)).status_code == 202
        first = sse_events(a.url, run, thread, limit=6)
        assert len(first) == 6 and all(ident for _, ident, _ in first)
        a.kill()
        # The client comes back through B and stays: B's takeover starts as this tail opens, and only then.
        tail = pool.submit(sse_events, b.url, run, thread, last_event_id=first[-1][1], timeout=TAIL_S)
        wait_for("B's claim (epoch 2)", lambda: (record_row(db, run) or {}).get("driver_epoch") == 2, 60)
        # Within B's quiet window, before its first append: the claim lapses right after adopting.
        assert _drop_lease(db, run) == 1, "B held no lease on the run"
        # The tail's read timeout never fires (pings every 15 s): its end is bounded here.
        done, _ = concurrent.futures.wait([tail], timeout=TAIL_S)
        failures = f"A: {a.stderr()[-1500:]}\nB: {b.stderr()[-3000:]}"
        assert done, (
            f"the run's tail through B did not end in {TAIL_S} s: nobody drove it after B's claim lapsed",
            failures,
        )
        rest = tail.result()
        assert rest and rest[-1][0] == "status", (rest[-3:], failures)
        assert json.loads(rest[-1][2])["status"] == "completed", (rest[-1], failures)
        seen = [ident for _, ident, _ in first + rest if ident is not None]
        assert len(seen) == len(set(seen)), "an event was delivered twice"
        assert _deltas(first + rest) == [f"line {i}\n" for i in range(1, LINES + 1)], failures
        row = record_row(db, run)
        # Adopted again by B after the lapse: a third claim, nobody else's.
        assert row is not None and row["status"] == "completed" and row["driver_epoch"] == 3, (row, failures)
        assert stored_deltas(db, run) == [f"line {i}\n" for i in range(1, LINES + 1)]
        assert "adopting it again" in b.stderr(), failures
