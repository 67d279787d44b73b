"""``boxwright serve`` replicas over one Redis (``--store redis://...``): shutdown and the watchdog across them.

A SIGTERMed mid-run (issue 14, A48): it drains, leaves the run ``running`` and releases its lease (it
had ten minutes to go), so B adopts it at once (a tail's takeover or the sweep, whichever comes first) and
completes it, every event stored once.

The inactivity watchdog across replicas (decision 4): a replica watches the runs it drives (only the
lease holder writes a run's status, decision 3); a run whose replica died is adopted by another's sweep
and from then on that replica's watchdog watches it. So an idle run whose replica was SIGKILLed is
failed by the survivor, with the watchdog's reason, its sandbox cancelled.

The module's redis-server is its own (tests/support/redis_server.py), each case under its own prefix.
"""

from __future__ import annotations

import json
import secrets
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from boxwright.coordinator.scheduler import WATCHDOG_CODE, WATCHDOG_MESSAGE
from tests.support.agent_procs import running_with_arg
from tests.support.coordinator import (
    CoordinatorProcess,
    coordinators,
    scripted_agent,
    sse_events,
    started_together,
    trigger,
)
from tests.support.redis_server import RedisServer, redis_server
from tests.support.replicas import wait_for

LINES = 30
# Paced past uvicorn's graceful window (3 s) plus the drain (0.5 s): the run is still going when A is gone.
GAP_S = 0.3
# Above a successor's quiet wait before its first append (fence_quiet_ms, 5 s): that wait is no inactivity.
INACTIVITY_S = 10.0
# Three interpreters starting side by side on a loaded 2-core machine: a hang bound, not a speed bound.
STARTUP_S = 180.0


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@dataclass
class _Replicas:
    """A (shut down gracefully by the first case), C (SIGKILLed by the second) and B, the survivor that sweeps and
    watches, over one store: started side by side once for the module (a replica's start is most of a case)."""

    prefix: str
    a: CoordinatorProcess
    b: CoordinatorProcess
    c: CoordinatorProcess


@pytest.fixture(scope="module")
def replicas(redis: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Replicas]:
    tmp = tmp_path_factory.mktemp("redis-replicas")
    prefix = redis.fresh_prefix()
    store = redis.url(prefix=prefix)
    agent = scripted_agent(tmp)
    watching = {"BWT_INACTIVITY_S": str(INACTIVITY_S), "BWT_WATCHDOG_S": "0.5", "BWT_SWEEP_S": "0.5"}
    try:
        with coordinators(
            *started_together(
                # A ten-minute lease: only a released one lets B in within the first case's bounds (120 s).
                lambda: CoordinatorProcess(
                    "a", tmp, agent, store=store, lease_ms=600_000, env={"BWT_DRAIN_S": "0.5"}, startup_s=STARTUP_S
                ),
                lambda: CoordinatorProcess(
                    "b", tmp, agent, store=store, lease_ms=1500, env=watching, startup_s=STARTUP_S
                ),
                lambda: CoordinatorProcess("c", tmp, agent, store=store, lease_ms=1500, startup_s=STARTUP_S),
            )
        ) as (a, b, c):
            yield _Replicas(prefix, a, b, c)
    finally:
        redis.delete_prefix(prefix)


def _record(replica: CoordinatorProcess, run: str, thread: str) -> dict[str, Any]:
    answer = replica.get(f"/runs/{run}?threadId={thread}")
    assert answer.status_code == 200, answer.text
    record: dict[str, Any] = answer.json()
    return record


def _deltas(frames: list[tuple[str | None, str | None, str]]) -> list[str]:
    decoded = [json.loads(data) for event, _, data in frames if event is None]
    return [d["delta"] for d in decoded if d["type"] == "TEXT_MESSAGE_CONTENT"]


def _lock_keys(redis: RedisServer, prefix: str, run: str) -> list[bytes]:
    import redis as redis_py

    client = redis_py.Redis(host="127.0.0.1", port=redis.port, socket_timeout=10)
    try:
        return [k for k in client.scan_iter(match=f"{prefix}*", count=1000) if b"lock" in k and run.encode() in k]
    finally:
        client.close()


@pytest.mark.timeout(300)
def test_a_replica_shut_down_mid_run_on_redis_releases_its_lease_and_another_adopts_it(
    replicas: _Replicas, redis: RedisServer
) -> None:
    a, b = replicas.a, replicas.b
    thread, run = f"t-{secrets.token_hex(4)}", f"r-drain-{secrets.token_hex(4)}"
    assert a.post("/runs", trigger(thread, f"lines {LINES} {GAP_S}", run)).status_code == 202
    assert len(sse_events(a.url, run, thread, limit=8)) == 8
    assert _lock_keys(redis, replicas.prefix, run), "A drives the run without a lease in Redis"
    assert _record(b, run, thread)["driverEpoch"] == 1
    assert a.terminate(timeout=60) in (0, -signal.SIGTERM), a.stderr()

    def failures() -> str:
        return f"A: {a.stderr()}\nB: {b.stderr()}"

    assert "detached: its log stays open" in a.stderr()
    # Released at shutdown: the lease had minutes to go, and B adopts the run now (the tail below, or its sweep).
    frames = sse_events(b.url, run, thread, timeout=120)
    assert frames[-1][0] == "status" and json.loads(frames[-1][2])["status"] == "completed", (frames[-3:], failures())
    assert _deltas(frames) == [f"line {i}\n" for i in range(1, LINES + 1)], failures()
    final = _record(b, run, thread)
    assert final["status"] == "completed" and final["driverEpoch"] == 2, (final, failures())
    assert final.get("detachedSince") is None, final
    idents = [ident for _, ident, _ in frames if ident is not None]
    assert len(idents) == len(set(idents)), "an event is stored twice"
    assert _lock_keys(redis, replicas.prefix, run) == [], "B's lease outlived the run"


@pytest.mark.timeout(300)
def test_an_idle_run_whose_replica_died_is_failed_by_the_survivors_watchdog(replicas: _Replicas) -> None:
    b, c = replicas.b, replicas.c
    thread, run = f"t-{secrets.token_hex(4)}", f"r-idle-{secrets.token_hex(4)}"
    sandboxes = c.tmp / "sandboxes"
    before = set(sandboxes.glob("*"))
    # The agent prints one line, then nothing for ten minutes.
    assert c.post("/runs", trigger(thread, "quiet 600", run)).status_code == 202
    first = sse_events(c.url, run, thread, limit=4)
    assert any("started" in data for _, _, data in first), first
    assert _record(b, run, thread)["driverEpoch"] == 1
    made = set(sandboxes.glob("*")) - before
    assert made, "the run's sandbox is not where the test looks"
    c.kill()

    def failures() -> str:
        return f"C: {c.stderr()}\nB: {b.stderr()}"

    final = wait_for(
        "B's watchdog", lambda: (r := _record(b, run, thread))["status"] != "running" and r, 120, interval=0.25
    )
    # Adopted first (epoch 2), then failed by the adopter: a dead replica's idle run is not left running.
    assert final["status"] == "failed" and final["driverEpoch"] == 2, (final, failures())
    assert final["error"] == {"message": WATCHDOG_MESSAGE, "code": WATCHDOG_CODE}, (final, failures())
    # The watchdog records the cancel after the driver wrote its failure: a moment later.
    wait_for("the watchdog's cancel", lambda: _record(b, run, thread).get("cancelRequested") is True, 30)
    assert "sweep adopted 1 run(s): " + run in b.stderr(), failures()
    frames = sse_events(b.url, run, thread, timeout=60)
    errors = [json.loads(d) for e, _, d in frames if e is None and json.loads(d)["type"] == "RUN_ERROR"]
    assert [(x["message"], x.get("code")) for x in errors] == [(WATCHDOG_MESSAGE, WATCHDOG_CODE)], frames[-3:]
    # The agent's sandbox went with the run (the watchdog cancels it), though C made it.
    wait_for("the sandbox's removal", lambda: not any(p.exists() for p in made), 60)
    # And the agent with it: C spawned it, B's destroy found it in the sandbox's process record.
    assert running_with_arg(c.tmp / "scripted_agent.py", settle=30) == [], failures()
