"""A replica SIGKILLed right after its 202, before its agent started: the successor starts the agent once.

Two ``boxwright serve`` replicas over one SQLite file, the command harness: A answers the trigger and
is killed at once, so the run has a record (with its stored input) but no journal. A client tailing
through B makes B adopt it (epoch 2); B's attach finds no journal and starts the agent from the
stored input. The agent appends to a side-effect file when it starts: one line, whoever started it.
"""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

from tests.support.coordinator import CoordinatorProcess, coordinators, sse_events, trigger
from tests.support.replicas import record_row, stored_deltas, stored_events

LEASE_MS = 1500
LINES = 5

# Records its start (an append, so two starts would leave two lines), then prints what it was asked.
AGENT = r"""
import sys, time
words = sys.stdin.read().split()
with open(sys.argv[1], "a") as out:
    out.write("started\n")
for i in range(int(words[1])):
    print(f"line {i + 1}", flush=True)
    time.sleep(0.05)
"""


def test_a_run_killed_right_after_its_202_is_started_once_by_the_successor(tmp_path: Path) -> None:
    script, starts = tmp_path / "counting_agent.py", tmp_path / "starts.log"
    script.write_text(AGENT)
    agent = f"{sys.executable} {script} {starts}"
    db = tmp_path / "coordinator.db"
    thread, run = f"t-{secrets.token_hex(4)}", f"r-fresh-{secrets.token_hex(4)}"
    with coordinators(
        CoordinatorProcess("a", tmp_path, agent, lease_ms=LEASE_MS),
        CoordinatorProcess("b", tmp_path, agent, lease_ms=LEASE_MS),
    ) as (a, b):
        started = a.post("/runs", trigger(thread, f"lines {LINES}", run, secret="metadata-value-never-stored"))
        assert started.status_code == 202, started.text
        a.kill()
        at_kill = record_row(db, run)
        assert at_kill is not None and at_kill["driver_epoch"] == 1, at_kill  # the 202 came once A held it
        assert json.loads(at_kill["input_messages"]) == [{"role": "user", "content": f"lines {LINES}", "id": None}]
        assert "metadata-value-never-stored" not in json.dumps(at_kill)
        failures = f"A: {a.stderr()}\nB: {b.stderr()}"
        frames = sse_events(b.url, run, thread, timeout=90)
        assert frames[-1][0] == "status" and json.loads(frames[-1][2])["status"] == "completed", (frames, failures)
        row = record_row(db, run)
        assert row is not None and row["status"] == "completed" and row["driver_epoch"] == 2, (row, failures)
        assert stored_deltas(db, run) == [f"line {i}\n" for i in range(1, LINES + 1)], failures
        assert [e.type for e in stored_events(db, run)].count("RUN_FINISHED") == 1
    # The agent ran exactly once: started by B (A died first) or, had A been quicker, replayed by B.
    assert starts.read_text() == "started\n", failures
