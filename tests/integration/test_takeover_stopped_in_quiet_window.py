"""A takeover stopped before it re-entered the sandbox still stops the agent in there.

A successor first waits for the dead driver's lease, then out the log's quiet window (5 s), and only
then re-enters the sandbox. A stop that reaches it meanwhile ends the run as that stop means, and
ends its sandbox too, as it does for a driver already in there:

1. a client's cancel (POST /runs/{id}/cancel on the successor): ``aborted``, the container gone;
   in the quiet window, and also earlier, while the successor still waits for the dead driver's lease;
2. the inactivity watchdog's failure (``fail_run``) right after the adoption: ``failed`` with the
   watchdog's error, the container gone.

A is a ``boxwright serve`` process (SIGKILLed while its agent sleeps in a Docker container of the
base image); B, in this process over the same SQLite file, adopts the run through POST /attach.
"""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from boxwright.coordinator import Coordinator, CoordinatorConfig, StoreSet
from boxwright.coordinator.scheduler import WATCHDOG_CODE, WATCHDOG_MESSAGE
from boxwright.definition import define_sandbox
from boxwright.events import RunErrorEvent, RunStartedEvent
from boxwright.harnesses.command import CommandHarness
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from tests.support.coordinator import (
    CLIENT_TOKEN,
    DOCKER_BASE_SANDBOX,
    CoordinatorProcess,
    client_headers,
    coordinator_server,
    coordinators,
    trigger,
)
from tests.support.docker import (
    BASE_IMAGE,
    CASE_LABEL,
    TEST_LABEL,
    base_image,
    labelled_containers,
    no_leaked_containers,
)
from tests.support.replicas import record_row, stored_deltas, stored_events, wait_for

LEASE_MS = 1500
# Long enough that a cancel surely reaches the successor while it still waits for the dead driver's lease.
LONG_LEASE_MS = 6000
# The agent: one line, then asleep for 10 minutes (it reads its prompt, "quiet 600", from stdin).
AGENT = 'read verb seconds; echo started; exec sleep "$seconds"'
TIMEOUT_S = 300.0

# The containers gone, and the after-setup snapshots the runs' ensure kept for their threads removed.
pytestmark = pytest.mark.usefixtures("no_leaked_containers", "base_image")
__all__ = ["base_image", "no_leaked_containers"]


def _config(db: Path, case: str, *, lease_ttl_ms: int = LEASE_MS, **overrides: Any) -> CoordinatorConfig:
    """B: the ``docker-base`` profile A serves (same definition name, image and labels: same instance key)."""
    from boxwright.providers.docker import docker_sandbox

    sqlite = open_database(db)
    runs, log = sqlite_run_backend(sqlite)
    box = docker_sandbox(BASE_IMAGE, labels={TEST_LABEL: "1", CASE_LABEL: case})
    settings: dict[str, Any] = {"watchdog_interval": 0.0, "sweep_interval": 0.0, "drain_timeout": 0.2, **overrides}
    return CoordinatorConfig(
        sandboxes={"docker-base": define_sandbox(DOCKER_BASE_SANDBOX, box)},
        harnesses={"command": CommandHarness(command=AGENT)},
        stores=StoreSet(runs, log, SqliteLockStore(sqlite), SqliteInstanceStore(sqlite), close=sqlite.close),
        client_token=CLIENT_TOKEN,
        lease_ttl_ms=lease_ttl_ms,
        **settings,
    )


def _first_driver(tmp: Path, case: str, *, lease_ms: int = LEASE_MS) -> CoordinatorProcess:
    env = {"BWT_DOCKER_BASE": BASE_IMAGE, "BWT_DOCKER_LABELS": f"{TEST_LABEL}=1,{CASE_LABEL}={case}"}
    return CoordinatorProcess("a", tmp, AGENT, lease_ms=lease_ms, env=env)


def _running_containers(case: str) -> list[str]:
    run = subprocess.run(
        ["docker", "ps", "-q", "--filter", f"label={CASE_LABEL}={case}"], capture_output=True, text=True, timeout=30
    )
    return run.stdout.split()


def _remove_containers(case: str) -> None:
    left = labelled_containers(f"{CASE_LABEL}={case}")
    if left:
        subprocess.run(["docker", "rm", "-f", *left], capture_output=True, timeout=60)


@dataclass
class Orphan:
    """The run A started and died driving, where it ran and where it is stored."""

    db: Path
    case: str
    thread: str
    run: str


# What the test does on B once A is dead: B's URL, B, and a client with the client token.
Adoption = Callable[[Orphan, httpx.AsyncClient, str, Coordinator], Awaitable[None]]


async def _orphan(a: CoordinatorProcess, orphan: Orphan) -> None:
    """A starts the run in a container, its agent prints its line; then A is SIGKILLed (its lease lapses)."""
    db, run = orphan.db, orphan.run
    body = trigger(orphan.thread, "quiet 600", run, sandbox="docker-base", harness="command")
    started = await asyncio.to_thread(a.post, "/runs", body)
    assert started.status_code == 202, started.text
    await asyncio.to_thread(wait_for, "the agent's line", lambda: stored_deltas(db, run) == ["started\n"], 120)
    assert len(_running_containers(orphan.case)) == 1, "the run's container is not where the test looks"
    await asyncio.to_thread(a.kill)


def _stopped_in_takeover(
    tmp: Path, name: str, adopt: Adoption, status: str, code: str, *, lease_ms: int = LEASE_MS, **b_config: Any
) -> Orphan:
    """A (its lease ``lease_ms``) orphans a run; B, in this process with the same lease, comes up over the same file
    and ``adopt`` stops the run there. Then the run has ended once, ``status`` with the error ``code``, and the agent
    is gone with its container. Whatever the case left is removed in the end."""
    thread, run = f"t-{secrets.token_hex(4)}", f"r-{name}-{secrets.token_hex(4)}"
    orphan = Orphan(tmp / "coordinator.db", secrets.token_hex(6), thread, run)

    async def main(a: CoordinatorProcess) -> None:
        await _orphan(a, orphan)
        async with (
            httpx.AsyncClient(headers=client_headers(), timeout=30) as http,
            coordinator_server(_config(orphan.db, orphan.case, lease_ttl_ms=lease_ms, **b_config)) as (b_url, b),
        ):
            await adopt(orphan, http, b_url, b)
        _assert_ended_once(orphan.db, orphan.run, status, code)
        await asyncio.to_thread(_assert_agent_gone, orphan.case)

    try:
        with coordinators(_first_driver(tmp, orphan.case, lease_ms=lease_ms)) as (a,):
            asyncio.run(main(a))
    finally:
        _remove_containers(orphan.case)
    return orphan


async def _until_ended(http: httpx.AsyncClient, b_url: str, orphan: Orphan) -> None:
    url, params = f"{b_url}/runs/{orphan.run}", {"threadId": orphan.thread}
    deadline = time.monotonic() + 60
    while (await http.get(url, params=params)).json()["status"] == "running":
        assert time.monotonic() < deadline, "the cancelled run did not end"
        await asyncio.sleep(0.1)


def _assert_ended_once(db: Path, run: str, status: str, code: str) -> None:
    row = record_row(db, run)
    assert row is not None and (row["status"], row["driver_epoch"]) == (status, 2), row
    events = stored_events(db, run)
    assert stored_deltas(db, run) == ["started\n"], "the agent's output was stored twice"
    assert sum(isinstance(e, RunStartedEvent) for e in events) == 1, [e.type for e in events]
    errors = [e for e in events if isinstance(e, RunErrorEvent)]
    assert [e.code for e in errors] == [code], errors


def _assert_agent_gone(case: str) -> None:
    # The container is removed, so the agent in it is gone too: nothing of the case runs any more.
    wait_for("the container's removal", lambda: not labelled_containers(f"{CASE_LABEL}={case}"), 30)
    assert _running_containers(case) == []


def test_a_cancel_in_the_quiet_window_destroys_the_sandbox(tmp_path: Path) -> None:
    async def adopt(orphan: Orphan, http: httpx.AsyncClient, b_url: str, _b: Coordinator) -> None:
        thread, run = orphan.thread, orphan.run
        attached = await http.post(f"{b_url}/runs/{run}/attach", params={"threadId": thread})
        assert attached.status_code == 202 and attached.json()["driving"] is True, attached.text
        claimed_at = time.monotonic()
        # Claimed, and now in its quiet window: the sandbox is not re-entered yet.
        cancelled = await http.post(f"{b_url}/runs/{run}/cancel", params={"threadId": thread})
        assert cancelled.status_code in (200, 202), cancelled.text
        assert time.monotonic() - claimed_at < 3.0, "the cancel came after the quiet window"
        await _until_ended(http, b_url, orphan)

    _stopped_in_takeover(tmp_path, "quiet-cancel", adopt, "aborted", "cancelled")


def test_a_cancel_while_the_successor_waits_for_the_dead_drivers_lease_destroys_the_sandbox(tmp_path: Path) -> None:
    async def adopt(orphan: Orphan, http: httpx.AsyncClient, b_url: str, b: Coordinator) -> None:
        db, thread, run = orphan.db, orphan.thread, orphan.run
        # A's lease (6 s, renewed every 2 s) outlives A by 4 s or more.
        assert await b.service.take_over_if_orphaned(run) is True
        cancelled = await http.post(f"{b_url}/runs/{run}/cancel", params={"threadId": thread})
        assert cancelled.status_code in (200, 202), cancelled.text
        # Cancelled while B still waited for A's lease: nothing claimed, the sandbox untouched so far.
        assert run not in b.service.driving_runs and record_row(db, run)["driver_epoch"] == 1  # type: ignore[index]
        await _until_ended(http, b_url, orphan)

    _stopped_in_takeover(tmp_path, "lease-cancel", adopt, "aborted", "cancelled", lease_ms=LONG_LEASE_MS)


def test_a_watchdog_failure_right_after_the_adoption_destroys_the_sandbox(tmp_path: Path) -> None:
    async def adopt(orphan: Orphan, http: httpx.AsyncClient, b_url: str, b: Coordinator) -> None:
        thread, run = orphan.thread, orphan.run
        now = 1000.0
        b.scheduler.clock = lambda: now
        attached = await http.post(f"{b_url}/runs/{run}/attach", params={"threadId": thread})
        assert attached.status_code == 202 and attached.json()["driving"] is True, attached.text
        claimed_at = time.monotonic()
        assert await b.scheduler.watchdog_tick() == []  # first seen now: not idle yet
        now += TIMEOUT_S + 1  # then idle past the timeout, while the takeover is in its quiet window
        assert await b.scheduler.watchdog_tick() == [run]
        assert time.monotonic() - claimed_at < 30.0

    orphan = _stopped_in_takeover(tmp_path, "quiet-fail", adopt, "failed", WATCHDOG_CODE, inactivity_timeout=TIMEOUT_S)
    row = record_row(orphan.db, orphan.run)
    assert row is not None and row["error_message"] == WATCHDOG_MESSAGE, row
