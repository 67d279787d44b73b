"""A local-process sandbox's destroy ends the processes a dead host started in it (and only those).

A durable agent outlives its host on purpose (its own session). Here the host is a real Python process
that spawns into a local-process sandbox and is SIGKILLed; this test process then plays the successor:
the provider's destroy by id, or a new handle for the same identity, must kill that orphaned group
(its backgrounded child too), found through the record in the sandbox's state dir. A recorded pid that
now names another process (recycled: its start time differs) is never signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers._posix import RecordedGroup, group_members, recorded_group
from boxwright.providers.bubblewrap import probe
from boxwright.providers.local_process import LocalProcessHandle
from boxwright.sandbox import CreateInput, DestroyInput, ResumeInput
from tests.support.require import missing

ROOT = Path(__file__).resolve().parents[2]
# Generous: the host imports boxwright on a 2-core machine other tests load too.
HOST_START_S = 60.0

_HOST = textwrap.dedent(
    """
    import asyncio, sys
    sys.path.insert(0, {root!r})
    from boxwright.providers import {factory}
    from boxwright.sandbox import CreateInput

    async def main():
        handle = await {factory}(base_dir={base!r}).create(CreateInput(id={ident!r}))
        # A backgrounded child in the group, as an agent's tool call would leave one.
        agent = await handle.process.spawn("sleep 600 & sleep 600; echo {marker}")
        print(handle.id, agent.pid, flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


class _Orphan:
    def __init__(self, root: str, pgid: int) -> None:
        self.root = root
        self.pgid = pgid


@pytest.fixture
def orphan(tmp_path: Path) -> Iterator[_Orphan]:
    """An agent group spawned by a local-process host that was then SIGKILLed (it never killed its agent)."""
    with _orphaned(tmp_path, "local_process_sandbox") as found:
        yield found


@contextlib.contextmanager
def _orphaned(tmp_path: Path, factory: str) -> Iterator[_Orphan]:
    base, ident = str(tmp_path / "sandboxes"), f"orphan-{uuid.uuid4().hex[:8]}"
    script = _HOST.format(root=str(ROOT), base=base, ident=ident, marker=f"marker-{ident}", factory=factory)
    host = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pgid = 0
    try:
        assert host.stdout is not None
        line = _read_line(host, HOST_START_S)
        root, pid = line.split()
        pgid = int(pid)
        host.kill()
        host.wait(timeout=30)
        # Two sleeps and their shell (under bwrap, bwrap too): the agent lives on without its host. The host
        # printed once the spawn returned, not once the shell had forked its sleeps (under bwrap, later).
        deadline = time.monotonic() + HOST_START_S
        while len(group_members(pgid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(group_members(pgid)) >= 3, group_members(pgid)
        yield _Orphan(root, pgid)
    finally:
        if host.poll() is None:
            host.kill()
            host.wait(timeout=30)
        if pgid and group_members(pgid):
            os.killpg(pgid, signal.SIGKILL)


def _read_line(host: subprocess.Popen[str], timeout: float) -> str:
    """The host's one line (written whole, then flushed), or a failure naming why it never came."""
    assert host.stdout is not None
    ready, _, _ = select.select([host.stdout], [], [], timeout)
    line = host.stdout.readline() if ready else ""
    if not line.endswith("\n"):
        raise AssertionError(f"the host spawned nothing within {timeout} s (exit code {host.poll()})")
    return line


def test_the_providers_destroy_by_id_kills_a_dead_hosts_agent(orphan: _Orphan, tmp_path: Path) -> None:
    provider = local_process_sandbox(base_dir=tmp_path / "sandboxes")
    asyncio.run(provider.destroy(DestroyInput(id=orphan.root)))
    assert group_members(orphan.pgid) == [], "the agent outlived its sandbox's destroy"
    assert not os.path.exists(orphan.root)


def test_a_new_handle_for_the_same_identity_kills_the_agent_in_kill_all(orphan: _Orphan, tmp_path: Path) -> None:
    provider = local_process_sandbox(base_dir=tmp_path / "sandboxes")

    async def main() -> list[RecordedGroup]:
        # local-process does not resume by id: a successor creates again under the same identity.
        handle = await provider.create(CreateInput(id=os.path.basename(orphan.root)))
        assert handle.id == orphan.root
        assert handle.process.record is not None
        assert [e.pgid for e in handle.process.record.entries()] == [orphan.pgid]
        # What this handle runs and ends by itself leaves no entry behind.
        assert (await handle.process.exec("true")).exit_code == 0
        await handle.process.kill_all()
        return handle.process.record.entries()

    assert asyncio.run(main()) == [], "an ended group stayed in the record"
    assert group_members(orphan.pgid) == [], "the agent outlived a new handle's kill_all"
    assert os.path.isdir(orphan.root), "kill_all is not destroy: the workspace stays"


def test_a_recorded_pid_that_now_names_another_process_is_not_killed(tmp_path: Path) -> None:
    provider = local_process_sandbox(base_dir=tmp_path / "sandboxes")
    # Outside any sandbox, leading its own group: what a recycled pid would name.
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        found = recorded_group(bystander.pid)
        assert found is not None

        async def record_it(ident: str) -> LocalProcessHandle:
            handle = await provider.create(CreateInput(id=ident))
            assert handle.process.record is not None
            # The same pid, but the process recorded under it started earlier: another one.
            handle.process.record.write(RecordedGroup(found.pgid, found.start - 1, found.boot))
            return handle

        async def main() -> None:
            first = await record_it("recycled-a")
            await first.process.kill_all()
            assert first.process.record is not None and first.process.record.entries() == []
            second = await record_it("recycled-b")
            await provider.destroy(DestroyInput(id=second.id))

        asyncio.run(main())
        time.sleep(0.2)  # a stray signal would have landed by now
        assert bystander.poll() is None, "a process the sandbox never spawned was killed"
    finally:
        bystander.kill()
        bystander.wait(timeout=30)


def test_a_resumed_bubblewrap_handles_kill_all_ends_a_dead_hosts_agent(tmp_path: Path) -> None:
    """bubblewrap shares the spawner: a handle resumed by id finds the record (no argv sweep in kill_all)."""
    found = probe()
    if not found.available:
        missing(found.reason)
    provider = bubblewrap_sandbox(base_dir=tmp_path / "sandboxes")
    with _orphaned(tmp_path, "bubblewrap_sandbox") as orphan:

        async def main() -> None:
            handle = await provider.resume(ResumeInput(id=orphan.root))
            assert handle is not None
            await handle.process.kill_all()
            assert group_members(orphan.pgid) == [], "the agent outlived a resumed handle's kill_all"
            await handle.destroy()

        asyncio.run(main())


def test_a_kill_all_waits_for_a_spawn_in_flight_of_another_handle_and_kills_it(tmp_path: Path) -> None:
    provider = local_process_sandbox(base_dir=tmp_path / "sandboxes")

    async def main() -> None:
        first = await provider.create(CreateInput(id="in-flight"))
        second = await provider.create(CreateInput(id="in-flight"))
        spawning = asyncio.ensure_future(first.process.spawn("sleep 600"))
        try:
            await asyncio.sleep(0)  # the spawn holds the record's lock, inside create_subprocess_exec
            assert not spawning.done()
            # Read before the entry is written, the record would be empty and the sleep would live on.
            await second.process.kill_all()
            process = await spawning
            assert group_members(process.pid) == [], "a process spawned while kill_all ran outlived it"
        finally:
            await first.destroy()

    asyncio.run(main())


def test_gc_of_a_state_whose_sandbox_folder_is_gone_kills_the_agent_it_records(orphan: _Orphan, tmp_path: Path) -> None:
    """``boxwright gc`` removes the private state of a sandbox whose folder is gone; an agent a dead host left
    running there is named only by that state's record, so it is killed first, not orphaned for good."""
    from boxwright.gc import collect_garbage
    from boxwright.stores.sqlite import SqliteInstanceStore, open_database

    shutil.rmtree(orphan.root)  # the folder went (by hand, or a crash mid-destroy); the state stayed

    async def main() -> None:
        async with open_database(tmp_path / "gc.db") as db:
            await SqliteInstanceStore(db).get("none")  # the file and its schema, as a used database has them
            # A clock a little ahead: the state changed a moment ago, and "older than 0 s" must hold for it.
            later = time.time() + 5
            result = await collect_garbage(db, sandbox_dirs=[str(tmp_path / "sandboxes")], min_age=0, now=later)
        assert [e.reason for e in result.removed] == ["the state of a sandbox that is gone"], result

    asyncio.run(main())
    assert group_members(orphan.pgid) == [], "gc removed the state and left its agent running"
