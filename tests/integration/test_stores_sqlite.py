"""SQLite instance store and lease lock on real files (spec §8-9: R39-R41, A33-A40), across real processes."""

import asyncio
import contextlib
import itertools
import json
import logging
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from boxwright.config import database_path
from boxwright.errors import LeaseLostError, StoreClosedError
from boxwright.stores import (
    InstanceRecord,
    LockStore,
    SandboxInstanceStore,
    SqliteInstanceStore,
    SqliteLockStore,
    open_database,
)
from boxwright.testkit.stores import lock_store_suite, run_instance_store_conformance

REPO = Path(__file__).resolve().parents[2]
TTL_MS = 300


@contextlib.asynccontextmanager
async def _fresh_instances():
    with tempfile.TemporaryDirectory() as tmp:
        async with open_database(Path(tmp) / "instances.db") as db:
            yield SqliteInstanceStore(db)


@contextlib.asynccontextmanager
async def _fresh_locks():
    with tempfile.TemporaryDirectory() as tmp:
        async with open_database(Path(tmp) / "locks.db") as db:
            yield SqliteLockStore(db)


# A33-A39
TestSqliteInstanceStore = run_instance_store_conformance("sqlite", _fresh_instances)
# A40
TestSqliteLockStore = lock_store_suite("sqlite", _fresh_locks)


def _record(**overrides):
    fields = {"key": "k", "provider": "p", "provider_sandbox_id": "s", "thread_id": "t", "updated_at": 1}
    return InstanceRecord(**(fields | overrides))


def _lease_rows(path):
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT key, token, expires_at FROM lock_leases").fetchall()


# -- the database ---------------------------------------------------------------------------------


def test_database_path_comes_from_env_or_defaults_under_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BOXWRIGHT_DB", raising=False)
    assert database_path() == str(tmp_path / ".boxwright" / "boxwright.db")
    monkeypatch.setenv("BOXWRIGHT_DB", "")
    assert database_path() == str(tmp_path / ".boxwright" / "boxwright.db")
    monkeypatch.setenv("BOXWRIGHT_DB", "rel/x.db")
    assert database_path() == str(tmp_path / "rel" / "x.db")
    monkeypatch.setenv("BOXWRIGHT_DB", str(tmp_path / "abs.db"))
    assert open_database().path == str(tmp_path / "abs.db")


def test_open_database_is_lazy_then_creates_parents_file_and_wal(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BOXWRIGHT_DB", raising=False)
    default = tmp_path / ".boxwright" / "boxwright.db"

    async def scenario():
        db = open_database()
        assert db.path == str(default)
        store = SqliteInstanceStore(db)
        assert isinstance(store, SandboxInstanceStore) and isinstance(SqliteLockStore(db), LockStore)
        assert SqliteLockStore(db).durable is True
        assert not default.parent.exists()
        assert await store.get("k") is None
        assert default.is_file()
        async with db.connection() as conn:
            assert list(await conn.execute_fetchall("PRAGMA busy_timeout")) == [(5000,)]
        await db.close()

    asyncio.run(scenario())
    with contextlib.closing(sqlite3.connect(default)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        columns = {row[1]: row for row in conn.execute("PRAGMA table_info(sandbox_instances)")}
    # (cid, name, type, notnull, default, pk)
    assert columns["key"][2:] == ("TEXT", 0, None, 1)
    assert columns["updated_at"][2:4] == ("INTEGER", 1)
    assert columns["latest_snapshot_id"][3] == 0 and columns["latest_run_id"][3] == 0


def test_records_survive_closing_and_another_connection_sees_them(tmp_path):
    path = tmp_path / "db" / "store.db"
    record = _record(latest_snapshot_id="snap", latest_run_id="run", updated_at=1_723_456_789_012)

    async def write():
        async with open_database(path) as db:
            await SqliteInstanceStore(db).upsert(record)

    async def read():
        async with open_database(path) as db:
            return await SqliteInstanceStore(db).get("k")

    asyncio.run(write())
    assert asyncio.run(read()) == record
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT updated_at, typeof(updated_at) FROM sandbox_instances").fetchone() == (
            1_723_456_789_012,
            "integer",
        )


def _threads_settle_at(expected, within=2.0):
    # aiosqlite's thread resolves close() just before it returns; give it that moment.
    deadline = time.monotonic() + within
    while threading.active_count() != expected and time.monotonic() < deadline:
        time.sleep(0.005)
    return threading.active_count()


def test_close_ends_the_connection_thread_and_later_use_raises(tmp_path):
    threads_before = _threads_settle_at(1, within=0.5)

    async def scenario():
        db = open_database(tmp_path / "x.db")
        try:
            store = SqliteInstanceStore(db)
            await store.upsert(_record())
            assert threading.active_count() == threads_before + 1
        finally:
            await db.close()
        with pytest.raises(StoreClosedError, match=r"x\.db"):
            await store.get("k")
        await db.close()

    asyncio.run(scenario())
    assert _threads_settle_at(threads_before) == threads_before


# -- the lock, in one process ---------------------------------------------------------------------


def test_renewal_keeps_the_lease_beyond_its_ttl(tmp_path):
    """Two connections to one file: B waits while A holds for 3 ttl, and A's signal never fires."""
    path = tmp_path / "locks.db"
    events = []

    async def scenario():
        async with open_database(path) as db_a, open_database(path) as db_b:
            a, b = SqliteLockStore(db_a), SqliteLockStore(db_b)
            a_inside = asyncio.Event()

            async def a_body(signal):
                a_inside.set()
                events.append(("a-in", time.monotonic()))
                await asyncio.sleep(3 * TTL_MS / 1000)
                events.append(("a-out", time.monotonic()))
                return signal.lost

            async def b_body(signal):
                events.append(("b-in", time.monotonic()))

            a_task = asyncio.create_task(a.with_lock("sandbox:k", a_body, ttl_ms=TTL_MS))
            await a_inside.wait()
            await b.with_lock("sandbox:k", b_body, ttl_ms=TTL_MS)
            assert await a_task is False
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(scenario())
    assert [name for name, _ in events] == ["a-in", "a-out", "b-in"]
    assert events[1][1] - events[0][1] >= 3 * TTL_MS / 1000 - 0.01
    assert _lease_rows(path) == []


def test_failed_renewal_fires_the_signal(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="boxwright.stores")

    async def scenario():
        db = open_database(tmp_path / "locks.db")
        locks = SqliteLockStore(db)

        async def body(signal):
            await db.close()
            await asyncio.wait_for(signal.wait(), 2 * TTL_MS / 1000)
            with pytest.raises(LeaseLostError, match="sandbox:k") as caught:
                signal.raise_if_lost()
            return caught.value

        error = await locks.with_lock("sandbox:k", body, ttl_ms=TTL_MS)
        assert error.key == "sandbox:k" and "renewal failed" in error.reason
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(scenario())
    assert any("could not release lock 'sandbox:k'" in r.getMessage() for r in caplog.records)


def test_cancelled_waiter_leaves_no_lease_behind(tmp_path):
    path = tmp_path / "locks.db"

    async def scenario():
        async with open_database(path) as db:
            locks = SqliteLockStore(db)
            inside = asyncio.Event()
            release = asyncio.Event()

            async def hold(signal):
                inside.set()
                await release.wait()

            holder = asyncio.create_task(locks.with_lock("k", hold, ttl_ms=TTL_MS))
            await inside.wait()
            waiters = [asyncio.create_task(locks.with_lock("k", hold, ttl_ms=TTL_MS)) for _ in range(3)]
            await asyncio.sleep(0.1)
            for waiter in waiters:
                waiter.cancel()
            release.set()
            await holder
            for waiter in waiters:
                with contextlib.suppress(asyncio.CancelledError):
                    await waiter
            assert locks._wakeups == {}

    asyncio.run(scenario())
    assert _lease_rows(path) == []


def test_ttl_must_be_positive(tmp_path):
    async def scenario():
        async with open_database(tmp_path / "x.db") as db:
            with pytest.raises(ValueError, match="ttl_ms"):
                await SqliteLockStore(db).with_lock("k", lambda s: asyncio.sleep(0), ttl_ms=0)

    asyncio.run(scenario())


# -- the lock, across processes -------------------------------------------------------------------

WORKER = r"""
import asyncio, json, os, sys, time
from boxwright.stores import SqliteLockStore, open_database

async def main(mode, db_path, key, cfg):
    cfg = json.loads(cfg)
    async with open_database(db_path) as db:
        locks = SqliteLockStore(db)
        if mode == "rounds":
            print("ready", flush=True)
            while not os.path.exists(cfg["go"]):
                await asyncio.sleep(0.002)
            for _ in range(cfg["rounds"]):
                async def body(signal):
                    with open(cfg["log"], "a") as f:
                        f.write(f"start {os.getpid()} {time.time_ns()}\n")
                    await asyncio.sleep(cfg["hold"])
                    with open(cfg["log"], "a") as f:
                        f.write(f"end {os.getpid()} {time.time_ns()} {int(signal.lost)}\n")
                await locks.with_lock(key, body, ttl_ms=cfg["ttl_ms"])
        elif mode == "hold-forever":
            async def body(signal):
                print("held", flush=True)
                await asyncio.Event().wait()
            await locks.with_lock(key, body, ttl_ms=cfg["ttl_ms"])
        elif mode == "take-over":
            print("waiting", flush=True)
            async def body(signal):
                print("acquired", flush=True)
                await asyncio.sleep(cfg["hold"])
                print("lost" if signal.lost else "still-held", flush=True)
            await locks.with_lock(key, body, ttl_ms=cfg["ttl_ms"])

asyncio.run(main(*sys.argv[1:5]))
"""


def _worker(mode, db_path, key, **cfg):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, mode, str(db_path), key, json.dumps(cfg)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_two_processes_never_hold_one_key_at_once(tmp_path):
    db_path, log, go = tmp_path / "shared.db", tmp_path / "holds.log", tmp_path / "go"
    rounds = 3
    procs = [
        _worker("rounds", db_path, "sandbox:k", go=str(go), log=str(log), rounds=rounds, hold=0.06, ttl_ms=TTL_MS)
        for _ in range(2)
    ]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        go.touch()
        for proc in procs:
            assert proc.wait(timeout=30) == 0
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
            proc.stdout.close()

    lines = [line.split() for line in log.read_text().splitlines()]
    assert len(lines) == 2 * 2 * rounds
    pids = {int(line[1]) for line in lines}
    assert pids == {proc.pid for proc in procs}
    # Each start is followed by the end of the same holder, never by another start.
    for start, end in zip(lines[0::2], lines[1::2], strict=True):
        assert start[0] == "start" and end[0] == "end" and start[1] == end[1]
        assert end[3] == "0", "a holder's lease was lost while it held the key"
    intervals = sorted((int(s[2]), int(e[2])) for s, e in zip(lines[0::2], lines[1::2], strict=True))
    for (_, end), (next_start, _) in itertools.pairwise(intervals):
        assert end <= next_start, f"holds overlap: one ended at {end}, the next started at {next_start}"
    assert _lease_rows(db_path) == []


def test_a_killed_holders_lease_expires_and_another_process_takes_over(tmp_path):
    db_path = tmp_path / "shared.db"
    proc = _worker("hold-forever", db_path, "sandbox:k", ttl_ms=TTL_MS)
    try:
        assert proc.stdout.readline().strip() == "held"
        proc.kill()
        proc.wait(timeout=10)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    killed_at = time.monotonic()
    assert len(_lease_rows(db_path)) == 1

    async def scenario():
        async with open_database(db_path) as db:

            async def body(signal):
                return time.monotonic(), signal.lost

            return await SqliteLockStore(db).with_lock("sandbox:k", body, ttl_ms=TTL_MS)

    acquired_at, lost = asyncio.run(scenario())
    waited = acquired_at - killed_at
    # The dead holder's lease still had up to one ttl to run; then polling (cap 200 ms) finds it expired.
    assert 0.05 < waited < TTL_MS / 1000 + 1.0, waited
    assert lost is False
    assert _lease_rows(db_path) == []


def test_a_stalled_holder_loses_its_lease_to_another_process_and_cannot_free_it(tmp_path):
    """A (here) stalls its event loop past its lease; B (another process) takes the key over.

    When A's loop runs again its renewal finds B's token, so A's signal fires, and A's
    release on exit deletes nothing: B keeps holding and never sees a loss.
    """
    db_path = tmp_path / "shared.db"

    async def scenario():
        async with open_database(db_path) as db:
            locks = SqliteLockStore(db)

            async def body(signal):
                proc = _worker("take-over", db_path, "sandbox:k", ttl_ms=TTL_MS, hold=0.8)
                # Blocking reads on purpose: they stall this loop, so no renewal runs and the lease expires.
                assert proc.stdout.readline().strip() == "waiting"
                assert proc.stdout.readline().strip() == "acquired"
                assert not signal.lost
                await asyncio.wait_for(signal.wait(), 2 * TTL_MS / 1000)
                with pytest.raises(LeaseLostError, match="sandbox:k"):
                    signal.raise_if_lost()
                return proc

            proc = await locks.with_lock("sandbox:k", body, ttl_ms=TTL_MS)
            assert asyncio.all_tasks() == {asyncio.current_task()}
            return proc

    proc = asyncio.run(scenario())
    try:
        rows = _lease_rows(db_path)
        assert len(rows) == 1, "A's stale release removed B's lease"
        assert rows[0][2] > time.time() * 1000
        out, _ = proc.communicate(timeout=10)
        assert out.strip() == "still-held"
        assert proc.returncode == 0
    finally:
        proc.kill()
        proc.wait()
    assert _lease_rows(db_path) == []
