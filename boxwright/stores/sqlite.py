"""SQLite stores (aiosqlite): the embedded default, shared by every process that opens the same file.

``open_database`` returns one lazily opened connection in WAL mode that all SQLite
stores of a process share. Statements from different coroutines are serialised on
it, so one coroutine's transaction never swallows another's statements.

The lock is a lease row ``(key, token, expires_at)`` and so holds across processes:
a holder takes the row when it is absent or expired (``BEGIN IMMEDIATE``), renews it
every ttl/3 from a task it owns, and deletes it only while the row still carries its
own token. A holder whose renewal finds the row gone or taken (it stalled past the
lease and another process took the key over), or whose renewal fails, sees its
``LeaseSignal`` fire. Times are wall-clock epoch milliseconds, which every process on
one machine shares.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import aiosqlite

from boxwright.config import database_path
from boxwright.errors import StoreClosedError
from boxwright.stores.base import DEFAULT_LEASE_TTL_MS, InstanceRecord, Lease, LeaseSignal

T = TypeVar("T")

log = logging.getLogger("boxwright.stores")

BUSY_TIMEOUT_MS = 5_000
POLL_START_S = 0.010
POLL_CAP_S = 0.200


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


async def _rollback(conn: aiosqlite.Connection) -> None:
    try:
        await conn.execute("ROLLBACK")
    except sqlite3.OperationalError as exc:
        # BEGIN failed, or SQLite already rolled back on its own: nothing is open.
        if "no transaction is active" not in str(exc):
            raise


async def _enable_wal(conn: aiosqlite.Connection) -> None:
    # Switching a new file to WAL while another process does the same can fail with "database is locked"
    # without SQLite consulting busy_timeout, so the switch is retried here within the same budget.
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    delay = POLL_START_S
    while True:
        try:
            await conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() >= deadline:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, POLL_CAP_S)


class SqliteDatabase:
    """One shared aiosqlite connection, opened on first use; ``await close()`` ends it and its thread.

    Use one object per event loop: its statements are serialised with an asyncio lock.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._conn: aiosqlite.Connection | None = None
        self._opening: asyncio.Future[aiosqlite.Connection] | None = None
        self._closed = False
        self._lock = asyncio.Lock()
        self._schemas: set[str] = set()

    async def _open_locked(self) -> aiosqlite.Connection:
        if self._closed:
            raise StoreClosedError(self.path)
        if self._conn is None:
            if self._opening is None:
                self._opening = asyncio.ensure_future(self._connect())
            try:
                # Shielded: an opener cancelled mid-connect leaves the connection to the next user or to close().
                self._conn = await asyncio.shield(self._opening)
            except asyncio.CancelledError:
                raise
            except BaseException:
                self._opening = None
                raise
        return self._conn

    async def _connect(self) -> aiosqlite.Connection:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # Autocommit: transactions are opened explicitly, never implicitly by the sqlite3 module.
        conn = await aiosqlite.connect(self.path, isolation_level=None)
        try:
            await conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            await _enable_wal(conn)
            await conn.execute("PRAGMA synchronous = NORMAL")
        except BaseException:
            await conn.close()
            raise
        return conn

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[aiosqlite.Connection]:
        """Exclusive use of the connection in autocommit mode, for single statements."""
        async with self._lock:
            yield await self._open_locked()

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """A ``BEGIN IMMEDIATE`` transaction: the write lock is taken up front, committed on success."""
        async with self._lock:
            conn = await self._open_locked()
            committed = False
            try:
                await conn.execute("BEGIN IMMEDIATE")
                yield conn
                await conn.execute("COMMIT")
                committed = True
            finally:
                if not committed:
                    # A cancelled await does not stop a statement already queued on the connection's thread, so
                    # BEGIN may still run after we gave up on it: always queue a ROLLBACK behind it. Shielded, so
                    # a second cancellation cannot leave the shared connection inside a transaction.
                    await asyncio.shield(_rollback(conn))

    async def ensure_schema(self, ddl: str) -> None:
        """Run an idempotent ``CREATE ... IF NOT EXISTS`` once per database object."""
        if ddl in self._schemas:
            return
        async with self.connection() as conn:
            await conn.executescript(ddl)
        self._schemas.add(ddl)

    async def close(self) -> None:
        async with self._lock:
            self._closed = True
            opening, self._opening, self._conn = self._opening, None, None
            if opening is None:
                return
            try:
                conn = await opening
            except Exception:
                return
            await conn.close()

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> SqliteDatabase:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"SqliteDatabase({self.path!r}{', closed' if self._closed else ''})"


def open_database(path: str | os.PathLike[str] | None = None) -> SqliteDatabase:
    """The database at ``path`` (default ``boxwright.config.database_path()``); nothing is opened until first use."""
    return SqliteDatabase(database_path() if path is None else path)


_INSTANCES_DDL = """
CREATE TABLE IF NOT EXISTS sandbox_instances (
    key TEXT PRIMARY KEY,
    provider TEXT NOT NULL,
    provider_sandbox_id TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    updated_at INTEGER NOT NULL,
    latest_snapshot_id TEXT,
    latest_run_id TEXT
);
"""


class SqliteInstanceStore:
    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def get(self, key: str) -> InstanceRecord | None:
        await self._db.ensure_schema(_INSTANCES_DDL)
        async with self._db.connection() as conn:
            rows = list(
                await conn.execute_fetchall(
                    "SELECT provider, provider_sandbox_id, thread_id, updated_at, latest_snapshot_id, latest_run_id "
                    "FROM sandbox_instances WHERE key = ?",
                    (key,),
                )
            )
        if not rows:
            return None
        provider, sandbox_id, thread_id, updated_at, snapshot_id, run_id = rows[0]
        return InstanceRecord(
            key=key,
            provider=provider,
            provider_sandbox_id=sandbox_id,
            thread_id=thread_id,
            updated_at=updated_at,
            latest_snapshot_id=snapshot_id,
            latest_run_id=run_id,
        )

    async def upsert(self, record: InstanceRecord) -> None:
        await self._db.ensure_schema(_INSTANCES_DDL)
        async with self._db.transaction() as conn:
            # Every column is written: a field merge would keep a stale snapshot id the caller meant to clear.
            await conn.execute(
                "INSERT INTO sandbox_instances "
                "(key, provider, provider_sandbox_id, thread_id, updated_at, latest_snapshot_id, latest_run_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET provider = excluded.provider, "
                "provider_sandbox_id = excluded.provider_sandbox_id, thread_id = excluded.thread_id, "
                "updated_at = excluded.updated_at, latest_snapshot_id = excluded.latest_snapshot_id, "
                "latest_run_id = excluded.latest_run_id",
                (
                    record.key,
                    record.provider,
                    record.provider_sandbox_id,
                    record.thread_id,
                    record.updated_at,
                    record.latest_snapshot_id,
                    record.latest_run_id,
                ),
            )

    async def delete(self, key: str) -> None:
        await self._db.ensure_schema(_INSTANCES_DDL)
        async with self._db.transaction() as conn:
            await conn.execute("DELETE FROM sandbox_instances WHERE key = ?", (key,))


_LEASES_DDL = """
CREATE TABLE IF NOT EXISTS lock_leases (
    key TEXT PRIMARY KEY,
    token TEXT NOT NULL,
    expires_at INTEGER NOT NULL
);
"""


class _Wakeup:
    __slots__ = ("event", "waiters")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.waiters = 0


class SqliteLockStore:
    durable = True

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db
        # Waiters in this process are woken by a local release instead of sleeping out their backoff.
        self._wakeups: dict[str, _Wakeup] = {}

    async def with_lock(
        self, key: str, fn: Callable[[LeaseSignal], Awaitable[T]], *, ttl_ms: int = DEFAULT_LEASE_TTL_MS
    ) -> T:
        if ttl_ms <= 0:
            raise ValueError(f"ttl_ms must be positive, got {ttl_ms}")
        await self._db.ensure_schema(_LEASES_DDL)
        token = secrets.token_hex(16)
        await self._acquire(key, token, ttl_ms)
        lease = Lease(key)
        renewer = asyncio.create_task(self._renew(key, token, ttl_ms, lease), name=f"boxwright lease renewal {key}")
        try:
            return await fn(lease)
        finally:
            # A renewal racing the release is harmless: it only updates a row carrying our token.
            renewer.cancel()
            # Shielded so a cancelled holder still frees the key instead of leaving it to expire.
            await asyncio.shield(self._release(key, token))
            await asyncio.wait([renewer])

    async def _acquire(self, key: str, token: str, ttl_ms: int) -> None:
        delay = POLL_START_S
        while not await self._try_take(key, token, ttl_ms):
            await self._pause(key, delay)
            delay = min(delay * 2, POLL_CAP_S)

    async def _try_take(self, key: str, token: str, ttl_ms: int) -> bool:
        attempt = asyncio.ensure_future(self._take(key, token, ttl_ms))
        try:
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            # The insert may still commit after we stop waiting; a lease nobody holds would block the key for a ttl.
            with contextlib.suppress(Exception):
                if await attempt:
                    await self._delete(key, token)
            raise

    async def _take(self, key: str, token: str, ttl_ms: int) -> bool:
        async with self._db.transaction() as conn:
            now = _now_ms()
            cursor = await conn.execute(
                "INSERT INTO lock_leases (key, token, expires_at) VALUES (?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at "
                "WHERE lock_leases.expires_at <= ?",
                (key, token, now + ttl_ms, now),
            )
            taken = cursor.rowcount == 1
            await cursor.close()
        return taken

    async def _pause(self, key: str, delay: float) -> None:
        wakeup = self._wakeups.get(key)
        if wakeup is None:
            wakeup = self._wakeups[key] = _Wakeup()
        wakeup.waiters += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await wakeup.event.wait()
        finally:
            wakeup.waiters -= 1
            if wakeup.waiters == 0 and self._wakeups.get(key) is wakeup:
                del self._wakeups[key]

    async def _renew(self, key: str, token: str, ttl_ms: int, lease: Lease) -> None:
        interval = ttl_ms / 3 / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                async with self._db.transaction() as conn:
                    cursor = await conn.execute(
                        "UPDATE lock_leases SET expires_at = ? WHERE key = ? AND token = ?",
                        (_now_ms() + ttl_ms, key, token),
                    )
                    held = cursor.rowcount == 1
                    await cursor.close()
            except Exception as exc:
                # Without a renewal nobody can vouch for the lease any more; the holder must assume it gone.
                lease.mark_lost(f"renewal failed: {exc}")
                return
            if not held:
                lease.mark_lost("the lease expired and another holder took the key over")
                return

    async def _delete(self, key: str, token: str) -> None:
        async with self._db.transaction() as conn:
            # Token-checked: a holder whose lease expired must not free the key its successor now holds.
            await conn.execute("DELETE FROM lock_leases WHERE key = ? AND token = ?", (key, token))

    async def _release(self, key: str, token: str) -> None:
        try:
            await self._delete(key, token)
        except Exception as exc:
            log.warning("could not release lock %r (%s); it frees itself when its lease expires", key, exc)
        wakeup = self._wakeups.pop(key, None)
        if wakeup is not None:
            wakeup.event.set()
