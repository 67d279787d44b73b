"""Issue 14's load point, bounded: 1,000 concurrent SSE tailers of one live run on one ``boxwright serve``
process over Redis all get every line exactly once and the run's status (bench/coordinator_tailers.py runs
the same and reports memory per tailer and delivery latency; nothing here is a speed limit)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.coordinator import CoordinatorProcess, coordinators
from tests.support.redis_server import redis_server
from tests.support.sse_tailers import allow_open_files, tail_one_run, timed_agent

TAILERS = 1000
LINES = 10


@pytest.mark.timeout(400)
def test_a_thousand_tailers_of_one_live_run_each_get_every_event(tmp_path: Path) -> None:
    allow_open_files(TAILERS)
    with redis_server(fsync="everysec") as server:
        # The production lease (30 s): what is measured is delivery, not a test lease under a connect burst.
        process = CoordinatorProcess(
            "tailers", tmp_path, timed_agent(tmp_path), store=server.url(prefix="tailers:"), lease_ms=30_000
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
                    timeout=120,
                )
            )
            said = coordinator.stderr()
    print("\n" + result.summary())
    assert result.complete == TAILERS, (result.failures, said)
    assert len(result.latencies) == TAILERS * LINES
