"""Two ``boxwright serve`` replicas over one SQLite file: a run outlives the replica that drove it.

A SIGKILLed mid-run: a client that was tailing A reconnects through B with its last offset and
gets every event exactly once, B having adopted the run (epoch 2). While A is alive its lease
keeps B's ``/attach`` from driving (A40). A SIGTERMed mid-run drains, releases its lease and
leaves the run ``running`` (A48), and B's sweep adopts it at once.
"""

from __future__ import annotations

import json
import secrets
import signal
from pathlib import Path

import httpx

from tests.support.coordinator import (
    ADMIN_TOKEN,
    CoordinatorProcess,
    coordinators,
    scripted_agent,
    sse_events,
    trigger,
)
from tests.support.replicas import record_row, stored_deltas, stored_events, wait_for

LINES = 50
LEASE_MS = 1500


def _deltas(frames: list[tuple[str | None, str | None, str]]) -> list[str]:
    out = []
    for event, _, data in frames:
        if event is None:
            decoded = json.loads(data)
            if decoded["type"] == "TEXT_MESSAGE_CONTENT":
                out.append(decoded["delta"])
    return out


def test_a_client_reconnecting_through_b_after_a_was_killed_gets_every_event_once(tmp_path: Path) -> None:
    agent = scripted_agent(tmp_path)
    db = tmp_path / "coordinator.db"
    thread, run = f"t-{secrets.token_hex(4)}", f"r-kill-{secrets.token_hex(4)}"
    with coordinators(
        CoordinatorProcess("a", tmp_path, agent, lease_ms=LEASE_MS),
        CoordinatorProcess("b", tmp_path, agent, lease_ms=LEASE_MS),
    ) as (a, b):
        assert a.post("/runs", trigger(thread, f"lines {LINES} 0.1", run)).status_code == 202
        first = sse_events(a.url, run, thread, limit=12)
        assert len(first) == 12 and all(ident for _, ident, _ in first)
        # A holds a live lease: B's attach drives nothing and says why.
        held = b.post(f"/runs/{run}/attach?threadId={thread}")
        assert held.status_code == 200 and held.json() == {"driving": False, "reason": "lease-held"}, held.text
        assert (record_row(db, run) or {}).get("driver_epoch") == 1
        a.kill()
        failures = f"A: {a.stderr()}\nB: {b.stderr()}"
        # The client comes back through B from its last offset; B adopts the run (lease expired) and tails it.
        rest = sse_events(b.url, run, thread, last_event_id=first[-1][1], timeout=90)
        assert rest[-1][0] == "status" and json.loads(rest[-1][2])["status"] == "completed", (rest[-3:], failures)
        seen = [ident for _, ident, _ in first + rest if ident is not None]
        assert len(seen) == len(set(seen)), "an event was delivered twice"
        assert _deltas(first + rest) == [f"line {i}\n" for i in range(1, LINES + 1)], failures
        row = record_row(db, run)
        assert row is not None and row["status"] == "completed" and row["driver_epoch"] == 2, (row, failures)
        assert stored_deltas(db, run) == [f"line {i}\n" for i in range(1, LINES + 1)]
        assert [e.type for e in stored_events(db, run)].count("RUN_FINISHED") == 1
        # A client that reads the whole log through B sees exactly what the reconnecting one saw.
        assert [ident for _, ident, _ in sse_events(b.url, run, thread) if ident] == seen


def test_a_replica_shut_down_mid_run_leaves_it_running_and_another_adopts_it_on_sweep(tmp_path: Path) -> None:
    agent = scripted_agent(tmp_path)
    db = tmp_path / "coordinator.db"
    thread, run = f"t-{secrets.token_hex(4)}", f"r-drain-{secrets.token_hex(4)}"
    # A long lease: only a released one lets B in before the test's bound.
    lease_ms = 60_000
    a = CoordinatorProcess("a", tmp_path, agent, lease_ms=lease_ms, env={"BWT_DRAIN_S": "0.5"})
    with coordinators(a, CoordinatorProcess("b", tmp_path, agent, lease_ms=lease_ms)) as (a, b):
        assert a.post("/runs", trigger(thread, "lines 40 0.1", run)).status_code == 202
        sse_events(a.url, run, thread, limit=8)
        # uvicorn re-raises the SIGTERM once its shutdown (our lifespan's drain) is done.
        assert a.terminate(timeout=60) in (0, -signal.SIGTERM), a.stderr()
        assert "detached: its log stays open" in a.stderr()
        row = record_row(db, run)
        failures = f"A: {a.stderr()}\nB: {b.stderr()}"
        assert row is not None and row["status"] == "running" and row["detached_since"] is not None, (row, failures)
        with httpx.Client() as http:
            leases = http.post(b.url + "/admin/sweep", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
        assert leases["adopted"] == 1 and leases["runIds"] == [run], (leases, failures)
        final = wait_for("B's end", lambda: (r := record_row(db, run)) and r["status"] != "running" and r, 60)
        assert final["status"] == "completed" and final["driver_epoch"] == 2, (final, b.stderr())
        assert final["detached_since"] is None
        assert stored_deltas(db, run) == [f"line {i}\n" for i in range(1, 41)]
