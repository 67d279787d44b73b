"""Co-located chaos over one Redis: ten kill points of a replica whose run the runner in the container drives.

Each round starts a co-located run on replica A (the real ``claude`` in the runner image, against
the fake model; the coordinator only relays tool execution and records events), SIGKILLs A at one
kill point, and a client reconnecting through replica B with its last offset gets every event
exactly once and the completed status (tests/support/chaos_replicas.py). The points: right after
the 202 (no container or runner run exists yet: B starts the run through the runner's ``/run``
from the stored input), after the first event (the runner may not have the run yet: the same),
then mid-run points where B re-attaches to the runner's run, and after the last event (A finished
the run; epoch 1). A module of its own, so pytest-xdist (``--dist loadfile``) runs it on another
worker than the host-driven rounds (tests/e2e/test_coordinator_chaos.py).

The module's redis-server is its own; the module is bounded by ``BUDGET`` (each round by its own
timeout) and prints its rounds' durations.
"""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.fake_model import FakeModelServer
from tests.support.chaos_replicas import (
    KILL_POINTS,
    ROUND_TIMEOUT_S,
    KillPoint,
    ModuleBudget,
    Pair,
    bridge_model,
    budget_bound,
    kill_round,
    redis,
)
from tests.support.docker import CASE_LABEL, colocated_replica_env, labelled_containers, no_leaked_containers
from tests.support.redis_server import RedisServer
from tests.support.replicas import wait_for

# The rounds' replicas keep an after-setup snapshot per thread: removed after the module.
pytestmark = pytest.mark.usefixtures("no_leaked_containers")
__all__ = ["bridge_model", "no_leaked_containers", "redis"]

# at-trigger plus every point of the host-driven rounds: ten.
COLOCATED_KILL_POINTS: list[tuple[str, KillPoint | None]] = [("at-trigger", None), *KILL_POINTS]
# A round is ~15-25 s on two loaded cores; a round whose B never completes the run stops at its tail's bound.
TAIL_S = 90.0
BUDGET = ModuleBudget(600.0)
_bound = budget_bound(BUDGET)


def _no_container_left(rnd_name: str, case: str) -> None:
    """Wait until no container of the case is left: A's and B's both gone once the round ends.

    B's own container goes with the run's end (``destroy_on_complete``: destroyed, then its
    instance record forgotten). One A created and was SIGKILLed before recording (an early kill:
    between the engine's create and the record's write) is destroyed by B's ``ensure``, which holds
    the key's lock and finds it under the key with no record naming it (boxwright/definition.py
    ``_destroy_unrecorded``); before that, it stayed until the reaper's lease ran out.
    """
    label = f"{CASE_LABEL}={case}"
    wait_for(f"{rnd_name}: every container of the round to go", lambda: labelled_containers(label) == [], 60, 0.2)


@pytest.mark.timeout(ROUND_TIMEOUT_S * len(COLOCATED_KILL_POINTS))
def test_colocated_runs_survive_a_sigkill_of_their_replica_at_ten_kill_points(
    tmp_path: Path, redis: RedisServer, bridge_model: FakeModelServer
) -> None:
    case = f"chaos-{secrets.token_hex(4)}"
    env = colocated_replica_env(bridge_model.base_url, case)
    pair = Pair(tmp_path, redis.url(prefix=redis.fresh_prefix()), env)
    epochs: dict[str, int | None] = {}
    try:
        for name, stop in COLOCATED_KILL_POINTS:
            with BUDGET.timed(f"co-located {name}"):
                rnd = kill_round(pair, name, stop, "claude-box", "docker", tail_s=TAIL_S)
            assert rnd.record is not None
            epochs[name] = rnd.record.driver_epoch
            _no_container_left(name, case)
    finally:
        pair.close()
        try:
            wait_for("the runs' containers to go", lambda: labelled_containers(f"{CASE_LABEL}={case}") == [], 60, 0.2)
        finally:
            # A round that failed before its check: its containers go anyway (the module's check reports them).
            if left := labelled_containers(f"{CASE_LABEL}={case}"):
                subprocess.run(["docker", "rm", "-f", *left], capture_output=True, timeout=60)
    print(f"\nepochs by kill point: {epochs}")
    # Every kill before the run's end was a takeover (kill_round checks each epoch against the record at the kill).
    assert len(epochs) == 10 and all(epochs[name] == 2 for name, _ in COLOCATED_KILL_POINTS[:-2]), epochs


def test_zz_report_durations() -> None:
    BUDGET.report("co-located chaos")
