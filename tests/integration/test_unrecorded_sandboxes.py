"""A sandbox whose creator died before recording it is destroyed by the next ``ensure`` of its key.

A creator killed between the provider's create and the instance record's write (bootstrap and the
after-setup snapshot run in between) leaves a sandbox labelled with the key that no record names.
The successor, holding the key's durable lock, destroys it before creating its own: sandboxes of
another key and the one a record names stay. Real Docker, and Daytona's real SDK against its fake.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from boxwright.definition import EnsureContext, EnsureResult, Lifecycle, SandboxDefinition, define_sandbox
from boxwright.sandbox import CreateInput, SandboxProvider
from boxwright.stores.base import InstanceRecord
from boxwright.stores.memory import MemoryInstanceStore, MemoryLockStore
from boxwright.stores.sqlite import SqliteLockStore, open_database
from tests.support.cloud_providers import daytona_fake, daytona_fake_provider, fake_problem
from tests.support.cloud_rules import run
from tests.support.docker import CASE_LABEL, TEST_LABEL, base_image, labelled_containers, no_leaked_containers
from tests.support.require import missing

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leaked_containers")]
__all__ = ["base_image", "no_leaked_containers"]


@pytest.fixture
def case() -> Iterator[str]:
    """A label value of this test's own; whatever still carries it at the end is removed."""
    value = f"unrecorded-{secrets.token_hex(4)}"
    yield value
    if left := labelled_containers(f"{CASE_LABEL}={value}"):
        subprocess.run(["docker", "rm", "-f", *left], capture_output=True, timeout=60)


def _docker_of_key(key: str) -> set[str]:
    return set(labelled_containers(f"boxwright.sandbox={key}"))


def _ctx(thread: str, run_id: str, store: MemoryInstanceStore, locks: SqliteLockStore) -> EnsureContext:
    return EnsureContext(thread_id=thread, run_id=run_id, store=store, locks=locks)


@dataclass
class Leftover:
    """A dead creator's sandbox ``left`` under ``ctx``'s key, never recorded, and ``other`` under another key."""

    store: MemoryInstanceStore
    locks: SqliteLockStore
    ctx: EnsureContext
    key: str
    other_key: str
    left: Any
    other: Any
    # Every sandbox the test made or ensured: destroyed at the end.
    handles: list[Any] = field(default_factory=list)


@contextlib.asynccontextmanager
async def _left_by_a_dead_creator(
    sandbox: SandboxDefinition, provider: SandboxProvider, thread: str, tmp: Path
) -> AsyncIterator[Leftover]:
    store = MemoryInstanceStore()
    async with open_database(tmp / "locks.db") as db:
        locks = SqliteLockStore(db)
        ctx = _ctx(thread, "r1", store, locks)
        key = sandbox.instance_key(ctx)
        other_key = sandbox.instance_key(_ctx(f"{thread}-other", "r1", store, locks))
        handles: list[Any] = []
        try:
            # As a creator SIGKILLed inside _create leaves it: made under the key, never recorded.
            left = await provider.create(CreateInput(id=key))
            other = await provider.create(CreateInput(id=other_key))
            handles += [left, other]
            yield Leftover(store, locks, ctx, key, other_key, left, other, handles)
        finally:
            for handle in handles:
                await handle.destroy()


async def _ensure_destroys_the_left(
    leftover: Leftover, sandbox: SandboxDefinition, of_key: Callable[[str], set[str]], noun: str
) -> tuple[EnsureResult, InstanceRecord]:
    """The successor's ensure: its own sandbox created and recorded, the dead creator's gone, the other key's kept."""
    ensured = await sandbox.ensure(leftover.ctx)
    leftover.handles.append(ensured.handle)
    assert ensured.outcome == "created"
    assert of_key(leftover.key) == {ensured.handle.id}, f"the dead creator's {noun} is still there"
    record: InstanceRecord | None = await leftover.store.get(leftover.key)
    assert record is not None and record.provider_sandbox_id == ensured.handle.id
    assert of_key(leftover.other_key) == {leftover.other.id}, f"another key's {noun} was touched"
    return ensured, record


def test_docker_ensure_destroys_what_a_dead_creator_left_and_spares_other_keys_and_the_recorded(
    tmp_path: Path, case: str, caplog: pytest.LogCaptureFixture, base_image: str
) -> None:
    from boxwright.providers.docker import docker_sandbox

    provider = docker_sandbox(base_image, labels={TEST_LABEL: "1", CASE_LABEL: case})
    sandbox = define_sandbox("unrecorded", provider, lifecycle=Lifecycle(snapshot="none"))
    # The same sandbox under a max age: a record older than it is stale, so ensure creates again.
    aging = define_sandbox("unrecorded", provider, lifecycle=Lifecycle(snapshot="none", snapshot_max_age="1m"))
    thread = f"t-{case}"

    async def main() -> None:
        async with _left_by_a_dead_creator(sandbox, provider, thread, tmp_path) as leftover:
            store, locks, key, other_key = leftover.store, leftover.locks, leftover.key, leftover.other_key
            handles, left, other = leftover.handles, leftover.left, leftover.other
            assert _docker_of_key(key) == {left.id}

            with caplog.at_level(logging.WARNING, logger="boxwright.definition"):
                first, record = await _ensure_destroys_the_left(leftover, sandbox, _docker_of_key, "container")
            assert left.id in caplog.text, "the destroyed container's id is not logged"

            # A stale record: ensure creates anew, and spares the container the record still names.
            await store.upsert(msgspec.structs.replace(record, updated_at=0))
            left_again = await provider.create(CreateInput(id=key))
            handles.append(left_again)
            second = await aging.ensure(_ctx(thread, "r2", store, locks))
            handles.append(second.handle)
            assert second.outcome == "created"
            assert _docker_of_key(key) == {first.handle.id, second.handle.id}, "wrong containers of the key"
            now = await store.get(key)
            assert now is not None and now.provider_sandbox_id == second.handle.id
            assert _docker_of_key(other_key) == {other.id}

            # An in-process lock says nothing of another process, which may be creating under the key.
            mem_ctx = EnsureContext(thread_id=f"{thread}-mem", run_id="r1", store=store, locks=MemoryLockStore())
            mem_key = sandbox.instance_key(mem_ctx)
            someone_elses = await provider.create(CreateInput(id=mem_key))
            handles.append(someone_elses)
            mine = await sandbox.ensure(mem_ctx)
            handles.append(mine.handle)
            assert _docker_of_key(mem_key) == {someone_elses.id, mine.handle.id}, "swept under a non-durable lock"

    asyncio.run(asyncio.wait_for(main(), 180))


def test_daytona_ensure_destroys_what_a_dead_creator_left_and_spares_other_keys(tmp_path: Path) -> None:
    if (problem := fake_problem("daytona")) is not None:
        missing(problem)
    fake = daytona_fake()
    provider: SandboxProvider = daytona_fake_provider()
    sandbox = define_sandbox("unrecorded", provider, lifecycle=Lifecycle(snapshot="none"))
    thread = f"t-unrecorded-{secrets.token_hex(4)}"

    def of_key(key: str) -> set[str]:
        return {b.id for b in fake.boxes.values() if b.labels.get("boxwright.sandbox") == key}

    async def body() -> None:
        async with _left_by_a_dead_creator(sandbox, provider, thread, tmp_path) as leftover:
            # Daytona names a sandbox by its key: before the fix, the successor's create was a 409.
            await _ensure_destroys_the_left(leftover, sandbox, of_key, "sandbox")

    try:
        run(body, 180)
    finally:
        # The fake's idle warm machines, before the module's leak check (else drained at the module's end).
        fake.cloud.drain()
