"""A run's driver keeps its lease while hundreds of clients connect: 300 SSE tailers open on one
``boxwright serve`` process over Redis during a live command-harness run with a 1.5 s lease.

Before the renewal had a thread and a connection of its own, this connect burst lagged the event
loop's timers by over a second and queued the renewal behind the tailers' commands for seconds:
the driver lost its lease, the run was detached at epoch 1 with nobody to drive it, and no tailer
got a line. Now the epoch stays 1, the run completes, and every tailer gets every line once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.coordinator import CoordinatorProcess, coordinators
from tests.support.redis_server import redis_server
from tests.support.sse_tailers import tail_one_run, timed_agent

TAILERS = 300
LINES = 10
LEASE_MS = 1_500


@pytest.mark.timeout(240)
def test_three_hundred_connecting_tailers_do_not_cost_the_driver_its_short_lease(tmp_path: Path) -> None:
    with redis_server(fsync="everysec") as server:
        process = CoordinatorProcess(
            "lease", tmp_path, timed_agent(tmp_path), store=server.url(prefix="lease:"), lease_ms=LEASE_MS
        )
        with coordinators(process) as (coordinator,):
            result = asyncio.run(
                tail_one_run(
                    coordinator.url,
                    pid=coordinator.proc.pid,
                    headers=coordinator.headers(),
                    go_file=tmp_path / "go",
                    tailers=TAILERS,
                    lines=LINES,
                    # A hang bound, not a speed bound: the machine may be shared with other suites.
                    timeout=150,
                )
            )
            answer = coordinator.get(f"/runs/{result.run_id}?threadId={result.thread_id}")
            said = coordinator.stderr()
    print("\n" + result.summary())
    assert answer.status_code == 200, answer.text
    record = answer.json()
    # Epoch 1 is the first driver's: a lost lease means a detach, and any successor would be epoch 2.
    assert record["driverEpoch"] == 1, (record, said)
    assert record["status"] == "completed", (record, said)
    assert "detached" not in said, said
    assert result.complete == TAILERS, (result.failures, said)
    assert len(result.latencies) == TAILERS * LINES
