"""In-memory instance store and lock (spec §8-9: R39-R41, R43; A33-A40, A47 store side)."""

import asyncio
import contextlib
import logging
import random

import msgspec
import pytest

from boxwright.stores import (
    InstanceRecord,
    LeaseSignal,
    LockStore,
    MemoryInstanceStore,
    MemoryLockStore,
    SandboxInstanceStore,
    SqliteLockStore,
    open_database,
    warn_if_not_durable,
)
from boxwright.testkit.stores import lock_store_suite, run_instance_store_conformance

# A33-A39
TestMemoryInstanceStore = run_instance_store_conformance("memory", MemoryInstanceStore)
# A40 (the parts every lock store owes; order and idle keys below)
TestMemoryLockStore = lock_store_suite("memory", MemoryLockStore)


def _record(**overrides):
    fields = {"key": "k", "provider": "p", "provider_sandbox_id": "s", "thread_id": "t", "updated_at": 1}
    return InstanceRecord(**(fields | overrides))


def test_record_is_frozen_and_camel_case_on_the_wire():
    record = _record(latest_run_id="r1")
    with pytest.raises(AttributeError):
        record.latest_snapshot_id = "x"
    wire = msgspec.json.decode(msgspec.json.encode(record))
    assert wire == {
        "key": "k",
        "provider": "p",
        "providerSandboxId": "s",
        "threadId": "t",
        "updatedAt": 1,
        "latestRunId": "r1",
    }
    assert msgspec.json.decode(msgspec.json.encode(record), type=InstanceRecord) == record


def test_memory_stores_satisfy_the_protocols():
    assert isinstance(MemoryInstanceStore(), SandboxInstanceStore)
    assert isinstance(MemoryLockStore(), LockStore)
    assert MemoryLockStore().durable is False
    # An empty store must stay truthy: callers pick a store with `explicit or default`.
    assert bool(MemoryInstanceStore())


def test_memory_store_keeps_no_alias_of_the_callers_record():
    async def scenario():
        store = MemoryInstanceStore()
        first = _record(latest_snapshot_id="s1")
        await store.upsert(first)
        got = await store.get("k")
        with pytest.raises(AttributeError):
            got.provider_sandbox_id = "changed"
        await store.upsert(_record())
        assert first.latest_snapshot_id == "s1"
        assert (await store.get("k")).latest_snapshot_id is None

    asyncio.run(scenario())


def test_memory_lock_admits_holders_of_a_key_in_arrival_order():
    async def scenario():
        locks = MemoryLockStore()
        release = asyncio.Event()
        entered = []

        async def first(signal):
            entered.append("first")
            await release.wait()

        async def waiter(label):
            async def body(signal):
                entered.append(label)
                await asyncio.sleep(0)

            await locks.with_lock("k", body)

        holder = asyncio.create_task(locks.with_lock("k", first))
        await asyncio.sleep(0)
        labels = [f"w{i}" for i in range(8)]
        random.Random(7).shuffle(labels)
        waiters = []
        for label in labels:
            waiters.append(asyncio.create_task(waiter(label)))
            await asyncio.sleep(0.001)
        release.set()
        await asyncio.gather(holder, *waiters)
        assert entered == ["first", *labels]

    asyncio.run(scenario())


def test_memory_lock_drops_idle_keys():
    async def scenario():
        locks = MemoryLockStore()
        gate = asyncio.Event()
        seen_inside = []

        async def hold(signal):
            seen_inside.append(len(locks._keys))
            await gate.wait()

        tasks = [asyncio.create_task(locks.with_lock(f"k{i % 50}", hold)) for i in range(100)]
        await asyncio.sleep(0.01)
        assert len(locks._keys) == 50
        gate.set()
        await asyncio.gather(*tasks)
        assert len(locks._keys) == 0

        async def boom(signal):
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError):
            await locks.with_lock("raising", boom)
        assert len(locks._keys) == 0

        # A waiter cancelled in the queue and a holder cancelled inside both leave nothing behind.
        gate2 = asyncio.Event()

        async def hold2(signal):
            await gate2.wait()

        holder = asyncio.create_task(locks.with_lock("c", hold2))
        queued = asyncio.create_task(locks.with_lock("c", hold2))
        await asyncio.sleep(0.01)
        queued.cancel()
        holder.cancel()
        for task in (queued, holder):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert len(locks._keys) == 0

    asyncio.run(scenario())


def test_memory_lock_signal_never_fires():
    async def scenario():
        locks = MemoryLockStore()

        async def body(signal: LeaseSignal):
            # A ttl far shorter than the hold: an in-memory lock has no lease to lose.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(signal.wait(), 0.15)
            signal.raise_if_lost()
            return signal.lost

        assert await locks.with_lock("k", body, ttl_ms=1) is False

    asyncio.run(scenario())


def test_one_memory_lock_serves_successive_event_loops():
    # definition.py keeps one process-wide lock; each asyncio.run is a new loop.
    locks = MemoryLockStore()

    async def once(n):
        async def body(signal):
            await asyncio.sleep(0.001)
            return n

        return await asyncio.gather(locks.with_lock("k", body), locks.with_lock("k", body))

    assert asyncio.run(once(1)) == [1, 1]
    assert asyncio.run(once(2)) == [2, 2]
    assert len(locks._keys) == 0


def test_a47_durable_work_over_memory_or_absent_lock_warns(caplog):
    caplog.set_level(logging.WARNING, logger="boxwright.stores")
    assert warn_if_not_durable(MemoryLockStore(), "durable run r1") is True
    assert warn_if_not_durable(None, "durable run r2") is True
    records = [r for r in caplog.records if r.name == "boxwright.stores"]
    assert [r.levelno for r in records] == [logging.WARNING, logging.WARNING]
    assert "durable run r1" in records[0].getMessage() and "MemoryLockStore" in records[0].getMessage()
    assert "durable run r2" in records[1].getMessage() and "no lock store" in records[1].getMessage()


def test_a47_durable_lock_does_not_warn(caplog, tmp_path):
    caplog.set_level(logging.DEBUG, logger="boxwright.stores")
    db = open_database(tmp_path / "never-opened.db")
    assert warn_if_not_durable(SqliteLockStore(db), "durable run r3") is False
    assert [r for r in caplog.records if r.name == "boxwright.stores"] == []
    # Building a store opens nothing.
    assert not (tmp_path / "never-opened.db").exists()
