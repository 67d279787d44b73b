"""The fake clouds' machines can be seen by the session-end leak check and do not outlive their fake.

A machine carries the test label and this session's (tests/conftest.py removes and reports what
is left with them); a cleanup removes also the machine a cancelled warm-up never recorded (found
by its fake's instance label); a drain (a test module's end) removes the idle warm pool.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from collections.abc import Iterator

import pytest

from tests.support.docker import BASE_IMAGE, SESSION_LABEL, TEST_LABEL, image_problem, labelled_containers
from tests.support.fake_cloud.backend import INSTANCE_LABEL, FakeCloud
from tests.support.require import missing

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop on a thread of its own, as a fake's server runs the backend."""
    problem = image_problem(BASE_IMAGE)
    if problem is not None:
        missing(problem)
    running = asyncio.new_event_loop()
    thread = threading.Thread(target=running.run_forever, name="fake-cloud-test-loop", daemon=True)
    thread.start()
    yield running
    running.call_soon_threadsafe(running.stop)
    thread.join(10)
    running.close()


def _mine(cloud: FakeCloud) -> list[str]:
    return labelled_containers(f"{INSTANCE_LABEL}={cloud.instance}")


def test_a_machine_carries_the_test_and_session_labels(loop: asyncio.AbstractEventLoop) -> None:
    cloud = FakeCloud(BASE_IMAGE, "user", "/home/user", warm_size=0)
    try:
        machine = asyncio.run_coroutine_threadsafe(cloud.create(), loop).result(120)
        inspected = subprocess.run(
            ["docker", "inspect", "--format", "{{json .Config.Labels}}", machine.container],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        labels = json.loads(inspected.stdout)
        session = labelled_containers()  # this session's, as the leak check lists them
        assert labels[TEST_LABEL] == "1"
        assert labels[SESSION_LABEL] and machine.container in session, (labels, session)
    finally:
        cloud.cleanup()
    assert _mine(cloud) == []


def test_a_cleanup_removes_a_machine_it_never_recorded(loop: asyncio.AbstractEventLoop) -> None:
    cloud = FakeCloud(BASE_IMAGE, "user", "/home/user", warm_size=0)
    machine = asyncio.run_coroutine_threadsafe(cloud.create(), loop).result(120)
    # What a warm-up cancelled between its container's create and its record leaves: a container only.
    cloud.machines.clear()
    cloud._all.clear()
    loop.call_soon_threadsafe(machine.close)  # its exec stream, so the removal ends no reader mid-read
    assert _mine(cloud) == [machine.container]
    given = cloud.cleanup()
    assert given == []
    assert _mine(cloud) == [], "the cleanup left the machine it had no record of"


def test_a_drain_removes_the_warm_pool_and_keeps_the_given_machines(loop: asyncio.AbstractEventLoop) -> None:
    cloud = FakeCloud(BASE_IMAGE, "user", "/home/user", warm_size=1)
    try:
        given = asyncio.run_coroutine_threadsafe(cloud.create(), loop).result(120)  # starts one warm machine
        cloud.drain()  # waits for that warm machine, then removes it
        assert _mine(cloud) == [given.container]
        left = cloud.cleanup()
        assert left == [f"{given.id} (container {given.container[:12]})"], "a sandbox never destroyed is reported"
    finally:
        cloud.cleanup()
    assert _mine(cloud) == []
