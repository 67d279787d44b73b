"""Redis instance store and lease lock (spec A33-A40) on a real redis-server this module owns, across processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from boxwright.errors import LeaseLostError, StoreUnavailableError
from boxwright.stores import BlockLockStore, LockStore, SandboxInstanceStore, open_store
from boxwright.stores.redis import RedisDatabase, RedisInstanceStore, RedisLease, RedisLockStore, open_redis
from boxwright.testkit.stores import lock_store_suite, run_instance_store_conformance
from tests.support.redis_server import RedisServer, redis_server

REPO = Path(__file__).resolve().parents[2]
TTL_MS = 300
_server: RedisServer | None = None


@pytest.fixture(scope="module", autouse=True)
def server() -> Iterator[RedisServer]:
    global _server
    with redis_server() as started:
        _server = started
        yield started
        _server = None


@contextlib.asynccontextmanager
async def _fresh_db() -> AsyncIterator[RedisDatabase]:
    assert _server is not None
    prefix = _server.fresh_prefix()
    try:
        async with open_redis(_server.url(prefix=prefix)) as db:
            yield db
    finally:
        _server.delete_prefix(prefix)


@contextlib.asynccontextmanager
async def _fresh_instances() -> AsyncIterator[RedisInstanceStore]:
    async with _fresh_db() as db:
        yield RedisInstanceStore(db)


@contextlib.asynccontextmanager
async def _fresh_locks() -> AsyncIterator[RedisLockStore]:
    async with _fresh_db() as db:
        yield RedisLockStore(db)


# A33-A39
TestRedisInstanceStore = run_instance_store_conformance("redis", _fresh_instances)
# A40
TestRedisLockStore = lock_store_suite("redis", _fresh_locks)


def test_store_types_and_fencing_tokens_increase(server: RedisServer) -> None:
    async def scenario() -> None:
        async with _fresh_db() as db:
            locks = RedisLockStore(db)
            assert isinstance(locks, BlockLockStore) and isinstance(locks, LockStore) and locks.durable
            assert isinstance(RedisInstanceStore(db), SandboxInstanceStore)
            tokens = []
            for _ in range(3):
                async with locks.lock("k", ttl_ms=TTL_MS) as lease:
                    assert isinstance(lease, RedisLease)
                    tokens.append(lease.fencing_token)
            assert tokens == sorted(tokens) and len(set(tokens)) == 3, tokens
            assert await db.client.exists(db.key("lock", "k")) == 0
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(scenario())


def test_renewal_keeps_the_lease_beyond_its_ttl_and_a_stolen_key_fires_the_signal(server: RedisServer) -> None:
    async def scenario() -> None:
        async with _fresh_db() as db:
            locks = RedisLockStore(db)
            async with locks.lock("k", ttl_ms=TTL_MS) as lease:
                await asyncio.sleep(3 * TTL_MS / 1000)
                assert not lease.lost
                # Another holder took the key over (this one stalled past its lease): the next renewal sees it.
                await db.client.set(db.key("lock", "k"), "someone-else", px=10_000)
                await asyncio.wait_for(lease.wait(), 2 * TTL_MS / 1000)
                with pytest.raises(LeaseLostError, match="another holder"):
                    lease.raise_if_lost()
            # The release was token-checked: the successor's key is still there.
            assert await db.client.get(db.key("lock", "k")) == b"someone-else"

    asyncio.run(scenario())


WORKER = r"""
import asyncio, json, os, sys, time
from boxwright.stores.redis import RedisLockStore, open_redis

async def main(mode, url, key, cfg):
    cfg = json.loads(cfg)
    async with open_redis(url) as db:
        locks = RedisLockStore(db)
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

asyncio.run(main(*sys.argv[1:5]))
"""


def _worker(mode: str, url: str, key: str, **cfg: object) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, mode, url, key, json.dumps(cfg)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_two_processes_never_hold_one_key_at_once(server: RedisServer, tmp_path: Path) -> None:
    prefix = server.fresh_prefix()
    url, log, go = server.url(prefix=prefix), tmp_path / "holds.log", tmp_path / "go"
    rounds = 3
    procs = [
        _worker("rounds", url, "k", go=str(go), log=str(log), rounds=rounds, hold=0.06, ttl_ms=TTL_MS) for _ in range(2)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        go.touch()
        for proc in procs:
            assert proc.wait(timeout=30) == 0
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        server.delete_prefix(prefix)
    lines = [line.split() for line in log.read_text().splitlines()]
    assert len(lines) == 2 * 2 * rounds
    assert {int(line[1]) for line in lines} == {proc.pid for proc in procs}
    for start, end in zip(lines[0::2], lines[1::2], strict=True):
        assert start[0] == "start" and end[0] == "end" and start[1] == end[1]
        assert end[3] == "0", "a holder's lease was lost while it held the key"


def test_a_killed_holders_lease_expires_and_another_process_takes_over(server: RedisServer) -> None:
    prefix = server.fresh_prefix()
    url = server.url(prefix=prefix)
    proc = _worker("hold-forever", url, "k", ttl_ms=TTL_MS)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        proc.kill()
        proc.wait()

        async def take_over() -> float:
            async with open_redis(url) as db:
                loop = asyncio.get_running_loop()
                started = loop.time()
                async with RedisLockStore(db).lock("k", ttl_ms=TTL_MS):
                    return loop.time() - started

        waited = asyncio.run(asyncio.wait_for(take_over(), 10))
        assert waited < 5 * TTL_MS / 1000, f"took {waited:.2f} s to take over an expired lease of {TTL_MS} ms"
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        server.delete_prefix(prefix)


def test_open_store_builds_the_redis_and_sqlite_sets(server: RedisServer, tmp_path: Path) -> None:
    from boxwright.stores.redis import RedisEventLog, RedisRunStore
    from boxwright.stores.sqlite import SqliteEventLog, SqliteInstanceStore, SqliteLockStore, SqliteRunStore

    prefix = server.fresh_prefix()

    async def scenario() -> None:
        async with open_store(server.url(db=3, prefix=prefix)) as stores:
            assert isinstance(stores.instances, RedisInstanceStore) and isinstance(stores.locks, RedisLockStore)
            assert isinstance(stores.runs, RedisRunStore) and isinstance(stores.events, RedisEventLog)
            await stores.runs.create_or_resume("r", "t")
            assert "password" not in repr(stores)
        async with open_store(f"sqlite:///{tmp_path / 'x.db'}") as stores:
            assert isinstance(stores.instances, SqliteInstanceStore) and isinstance(stores.locks, SqliteLockStore)
            assert isinstance(stores.runs, SqliteRunStore) and isinstance(stores.events, SqliteEventLog)
            await stores.runs.create_or_resume("r", "t")
        assert (tmp_path / "x.db").is_file()
        with pytest.raises(ValueError, match="store URL"):
            open_store("postgres://x")

    try:
        asyncio.run(scenario())
        import redis

        client = redis.Redis(port=server.port, db=3)
        assert client.exists(f"{prefix}run:r") == 1
        client.close()
    finally:
        import redis

        client = redis.Redis(port=server.port, db=3)
        for key in client.scan_iter(match=f"{prefix}*"):
            client.delete(key)
        client.close()


def test_a_password_in_the_url_never_reaches_a_repr_or_an_error() -> None:
    async def scenario() -> str:
        down = RedisServer()  # a free port nothing listens on
        try:
            async with open_store(f"redis://user:s3cret-pw@127.0.0.1:{down.port}/0?prefix=p:") as stores:
                assert "s3cret-pw" not in repr(stores) and "s3cret-pw" not in stores.url
                with pytest.raises(StoreUnavailableError) as caught:
                    await stores.runs.get("r")
                return str(caught.value)
        finally:
            down.stop()

    message = asyncio.run(scenario())
    assert "s3cret-pw" not in message and "user:***@127.0.0.1" in message, message
