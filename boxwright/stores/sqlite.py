"""SQLite stores (aiosqlite): the embedded default, shared by every process that opens the same file.

``open_database`` returns one lazily opened connection in WAL mode that all SQLite
stores of a process share. Statements from different coroutines are serialised on
it, so one coroutine's transaction never swallows another's statements.

The lock is a lease row ``(key, token, expires_at)`` and so holds across processes:
a holder takes the row when it is absent or expired (``BEGIN IMMEDIATE``), renews it
every ttl/3 from the store's renewer thread (``boxwright.stores.leases``, a connection of
its own, so a busy event loop cannot delay it), and deletes it only while the row still
carries its own token. A holder whose renewal finds the row gone or taken (it stalled past the
lease and another process took the key over), or whose renewal fails, sees its
``LeaseSignal`` fire. Times are wall-clock epoch milliseconds, which every process on
one machine shares.

``SqliteRunStore`` and ``SqliteEventLog`` (``sqlite_run_backend(db)``) keep run records and
run event logs in the same database (see ``boxwright.runs``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import aiosqlite
import msgspec

from boxwright._faults import fault_point
from boxwright.abort import AbortSignal
from boxwright.config import database_path
from boxwright.errors import EventLogClosedError, InvalidRunStatusError, RunExistsError, StoreClosedError
from boxwright.events import Event, TokenUsage, decode_event, encode_event
from boxwright.runs import (
    START_OFFSET,
    RunError,
    RunPatch,
    RunRecord,
    check_epoch,
    check_run_id,
    check_thread_id,
    format_offset,
    is_run_status,
    offset_never_issued,
    parse_offset,
    patch_changes,
    wait_event_or_abort,
)
from boxwright.stores.base import InstanceRecord
from boxwright.stores.leases import LeasedLockStore

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

    async def ensure_schema(self, ddl: str, *, added: Mapping[str, Sequence[tuple[str, str]]] | None = None) -> None:
        """Run an idempotent ``CREATE ... IF NOT EXISTS`` once per database object.

        ``added``: columns (name, type) by table that a database made by an older version lacks;
        each missing one is added. The DDL's indexes may use them, so the tables are created (and
        migrated) before the rest of the script runs.
        """
        if ddl in self._schemas:
            return
        async with self.connection() as conn:
            if added:
                for table, columns in added.items():
                    rows = await conn.execute_fetchall(f"PRAGMA table_info({table})")
                    present = {row[1] for row in rows}
                    for name, kind in columns:
                        if present and name not in present:
                            try:
                                await conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
                            except sqlite3.OperationalError as exc:
                                # Another process on the file added it first.
                                if "duplicate column" not in str(exc):
                                    raise
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


class SqliteLockStore(LeasedLockStore):
    """Lease rows in ``lock_leases``, taken and released over the database's connection, renewed from
    ``LeasedLockStore``'s thread over a short-lived connection of its own (see ``_extend``)."""

    def __init__(self, db: SqliteDatabase) -> None:
        super().__init__(db.path)
        self._db = db

    async def _prepare(self) -> None:
        await self._db.ensure_schema(_LEASES_DDL)

    async def _take(self, key: str, token: str, ttl_ms: int) -> int:
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
        return 1 if taken else 0

    def _extend(self, key: str, token: str, ttl_ms: int, loop: asyncio.AbstractEventLoop) -> bool:
        bound = ttl_ms / 3000
        if self._db.closed:
            raise StoreClosedError(self._db.path)
        if self._db.path == ":memory:":
            # Only the shared connection sees an in-memory database: the renewal goes through its loop.
            future = asyncio.run_coroutine_threadsafe(self._extend_shared(key, token, ttl_ms), loop)
            try:
                return future.result(timeout=bound)
            except BaseException:
                future.cancel()
                raise
        # A connection for this one statement: the shared one is serialised behind the loop's statements.
        conn = sqlite3.connect(self._db.path, timeout=bound, isolation_level=None)
        try:
            cursor = conn.execute(
                "UPDATE lock_leases SET expires_at = ? WHERE key = ? AND token = ?", (_now_ms() + ttl_ms, key, token)
            )
            return cursor.rowcount == 1
        finally:
            conn.close()

    async def _extend_shared(self, key: str, token: str, ttl_ms: int) -> bool:
        async with self._db.transaction() as conn:
            cursor = await conn.execute(
                "UPDATE lock_leases SET expires_at = ? WHERE key = ? AND token = ?", (_now_ms() + ttl_ms, key, token)
            )
            held = cursor.rowcount == 1
            await cursor.close()
        return held

    async def _delete(self, key: str, token: str) -> None:
        async with self._db.transaction() as conn:
            # Token-checked: a holder whose lease expired must not free the key its successor now holds.
            await conn.execute("DELETE FROM lock_leases WHERE key = ? AND token = ?", (key, token))


# -- runs and event logs --------------------------------------------------------------------------
#
# Records and logs live in one database so an append can check the run's driver epoch in the
# same BEGIN IMMEDIATE transaction that writes it (decision 3). An event is stored as its
# compact JSON under (log, seq); its offset is derived from (run id, seq), never stored.

_RUNS_DDL = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    thread_id TEXT NOT NULL,
    status TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    finished_at INTEGER,
    error_message TEXT,
    error_code TEXT,
    usage TEXT,
    sandbox_key TEXT,
    detached_since INTEGER,
    cancel_requested INTEGER,
    driver_epoch INTEGER,
    sandbox_profile TEXT,
    harness_profile TEXT,
    input_messages TEXT
);
CREATE INDEX IF NOT EXISTS runs_by_thread ON runs (thread_id, started_at);
CREATE INDEX IF NOT EXISTS runs_detached ON runs (detached_since) WHERE detached_since IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_running ON runs (started_at) WHERE status = 'running';
CREATE TABLE IF NOT EXISTS run_logs (
    id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL UNIQUE,
    closed INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS run_log_events (
    log_id INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    event BLOB NOT NULL,
    PRIMARY KEY (log_id, seq)
) WITHOUT ROWID;
"""

# Columns added after a database may have been created: added (ALTER TABLE) when missing.
_RUNS_ADDED = {"runs": (("sandbox_profile", "TEXT"), ("harness_profile", "TEXT"), ("input_messages", "TEXT"))}
_RUN_COLUMNS = (
    "run_id, thread_id, status, started_at, updated_at, finished_at, error_message, error_code, usage, "
    "sandbox_key, detached_since, cancel_requested, driver_epoch, sandbox_profile, harness_profile, input_messages"
)
_usage_decoder = msgspec.json.Decoder(TokenUsage)


def _run_from_row(row: Sequence[Any]) -> RunRecord:
    (
        run_id,
        thread_id,
        status,
        started_at,
        updated_at,
        finished_at,
        error_message,
        error_code,
        usage,
        sandbox_key,
        detached_since,
        cancel_requested,
        driver_epoch,
        sandbox_profile,
        harness_profile,
        input_messages,
    ) = row
    if not is_run_status(status):
        raise InvalidRunStatusError(run_id, status)
    return RunRecord(
        run_id=run_id,
        thread_id=thread_id,
        status=status,
        started_at=started_at,
        updated_at=updated_at,
        finished_at=finished_at,
        error=None if error_message is None else RunError(message=error_message, code=error_code),
        usage=None if usage is None else _usage_decoder.decode(usage),
        sandbox_key=sandbox_key,
        detached_since=detached_since,
        # NULL (never set) and 0 (explicitly False) are different answers.
        cancel_requested=None if cancel_requested is None else bool(cancel_requested),
        driver_epoch=driver_epoch,
        sandbox_profile=sandbox_profile,
        harness_profile=harness_profile,
        input_messages=input_messages,
    )


def _set_clause(changes: dict[str, Any]) -> tuple[list[str], list[Any]]:
    columns: list[str] = []
    values: list[Any] = []
    for name, value in changes.items():
        if name == "error":
            columns += ["error_message = ?", "error_code = ?"]
            values += [None, None] if value is None else [value.message, value.code]
        elif name == "usage":
            columns.append("usage = ?")
            values.append(None if value is None else msgspec.json.encode(value).decode())
        elif name == "cancel_requested":
            columns.append("cancel_requested = ?")
            values.append(None if value is None else int(value))
        else:
            # None is written as NULL: dropping it would keep a value the caller meant to clear.
            columns.append(f"{name} = ?")
            values.append(value)
    return columns, values


class SqliteRunStore:
    """Run records in the ``runs`` table of a shared ``SqliteDatabase``; every process on the file sees them."""

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def _query(self, sql: str, params: Sequence[Any]) -> list[RunRecord]:
        await self._db.ensure_schema(_RUNS_DDL, added=_RUNS_ADDED)
        async with self._db.connection() as conn:
            rows = list(await conn.execute_fetchall(sql, params))
        return [_run_from_row(row) for row in rows]

    async def get(self, run_id: str) -> RunRecord | None:
        found = await self._query(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (check_run_id(run_id),))
        return found[0] if found else None

    async def create_or_resume(self, run_id: str, thread_id: str, *, started_at: int | None = None) -> RunRecord:
        check_run_id(run_id)
        check_thread_id(thread_id)
        await self._db.ensure_schema(_RUNS_DDL, added=_RUNS_ADDED)
        now = _now_ms()
        async with self._db.transaction() as conn:
            # INSERT OR IGNORE, never an upsert: a finished run asked for again must stay finished.
            await conn.execute(
                "INSERT OR IGNORE INTO runs (run_id, thread_id, status, started_at, updated_at) "
                "VALUES (?, ?, 'running', ?, ?)",
                (run_id, thread_id, now if started_at is None else started_at, now),
            )
            rows = list(await conn.execute_fetchall(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)))
        return _run_from_row(rows[0])

    async def create(self, run_id: str, thread_id: str, *, started_at: int | None = None) -> RunRecord:
        """A new ``running`` record; ``RunExistsError`` (naming the owner's thread) if the id has one.

        One transaction: the insert either lands or finds the row that won, so of many requests
        (and processes) creating one id at once, exactly one gets a record.
        """
        check_run_id(run_id)
        check_thread_id(thread_id)
        await self._db.ensure_schema(_RUNS_DDL, added=_RUNS_ADDED)
        now = _now_ms()
        async with self._db.transaction() as conn:
            cursor = await conn.execute(
                "INSERT OR IGNORE INTO runs (run_id, thread_id, status, started_at, updated_at) "
                "VALUES (?, ?, 'running', ?, ?)",
                (run_id, thread_id, now if started_at is None else started_at, now),
            )
            inserted = cursor.rowcount == 1
            rows = list(await conn.execute_fetchall(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)))
        record = _run_from_row(rows[0])
        if not inserted:
            raise RunExistsError(run_id, record.thread_id)
        return record

    async def update(self, run_id: str, patch: RunPatch, *, expected_epoch: int | None = None) -> RunRecord | None:
        changes = patch_changes(check_run_id(run_id), patch)
        columns, values = _set_clause(changes)
        columns.append("updated_at = ?")
        values.append(_now_ms())
        await self._db.ensure_schema(_RUNS_DDL, added=_RUNS_ADDED)
        async with self._db.transaction() as conn:
            if expected_epoch is not None:
                rows = list(await conn.execute_fetchall("SELECT driver_epoch FROM runs WHERE run_id = ?", (run_id,)))
                if not rows:
                    return None
                check_epoch(run_id, expected_epoch, rows[0][0], "update")
            rows = list(
                await conn.execute_fetchall(
                    f"UPDATE runs SET {', '.join(columns)} WHERE run_id = ? RETURNING {_RUN_COLUMNS}",
                    (*values, run_id),
                )
            )
        return _run_from_row(rows[0]) if rows else None

    async def find_active_run(self, thread_id: str) -> RunRecord | None:
        found = await self._query(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE thread_id = ? AND status = 'running' "
            "ORDER BY started_at DESC, rowid DESC LIMIT 1",
            (thread_id,),
        )
        return found[0] if found else None

    async def list_by_thread(self, thread_id: str) -> list[RunRecord]:
        return await self._query(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE thread_id = ? ORDER BY started_at, rowid", (thread_id,)
        )

    async def list_reclaimable(self, now_ms: int, ttl_ms: int) -> list[RunRecord]:
        return await self._query(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE status = 'running' AND detached_since IS NOT NULL "
            "AND detached_since <= ? ORDER BY detached_since, rowid",
            (now_ms - ttl_ms,),
        )

    async def list_running(self, limit: int) -> list[RunRecord]:
        return await self._query(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE status = 'running' ORDER BY started_at, rowid LIMIT ?",
            (max(limit, 0),),
        )


# How often a waiting reader's process looks for another process's commit (PRAGMA data_version):
# from the first interval after a change, backing off to the last; delivery across processes
# therefore takes at most about RUN_LOG_POLL_MAX_S plus one query.
RUN_LOG_POLL_MIN_S = 0.02
RUN_LOG_POLL_MAX_S = 0.05
RUN_LOG_READ_PAGE = 1024

_APPEND_STATE_SQL = (
    "SELECT r.driver_epoch, l.id, l.closed, (SELECT MAX(seq) FROM run_log_events WHERE log_id = l.id) "
    "FROM (SELECT ? AS run_id) AS q "
    "LEFT JOIN runs AS r ON r.run_id = q.run_id LEFT JOIN run_logs AS l ON l.run_id = q.run_id"
)
_LOG_STATE_SQL = (
    "SELECT id, closed, (SELECT MAX(seq) FROM run_log_events WHERE log_id = run_logs.id) FROM run_logs WHERE run_id = ?"
)


class _LogNotifier:
    """Wakes the readers of one database in this process.

    An append through this process's connection wakes them at once. Another process's commit
    cannot call us, so while anyone waits one watcher task per database polls ``PRAGMA
    data_version``, which changes exactly when another connection has committed: one cheap
    query per interval however many readers wait.
    """

    def __init__(self) -> None:
        self._changed: asyncio.Event | None = None
        self._waiters = 0
        self._watcher: asyncio.Task[None] | None = None

    def generation(self) -> asyncio.Event:
        # Taken BEFORE a reader queries, so a commit between its query and its wait still wakes it.
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def wait(self, db: SqliteDatabase, changed: asyncio.Event, signal: AbortSignal | None) -> bool:
        self._waiters += 1
        if self._watcher is None:
            # The database is passed, not kept: this object is a weak-keyed value of that database.
            self._watcher = asyncio.get_running_loop().create_task(
                self._watch(db), name=f"boxwright run-log watcher {db.path}"
            )
        try:
            return await wait_event_or_abort(changed, signal)
        finally:
            self._waiters -= 1

    async def _watch(self, db: SqliteDatabase) -> None:
        try:
            version = await self._data_version(db)
            # A commit that landed after a reader's query but before this baseline would never differ from
            # it: wake everyone once so they look again.
            self.notify()
            delay = RUN_LOG_POLL_MIN_S
            while self._waiters:
                await asyncio.sleep(delay)
                current = await self._data_version(db)
                if current != version:
                    version = current
                    self.notify()
                    delay = RUN_LOG_POLL_MIN_S
                else:
                    delay = min(delay * 1.5, RUN_LOG_POLL_MAX_S)
        except Exception:
            # Readers query again and meet the error themselves (e.g. the database was closed).
            self.notify()
        finally:
            self._watcher = None

    @staticmethod
    async def _data_version(db: SqliteDatabase) -> int:
        async with db.connection() as conn:
            rows = list(await conn.execute_fetchall("PRAGMA data_version"))
        return int(rows[0][0])


_notifiers: weakref.WeakKeyDictionary[SqliteDatabase, _LogNotifier] = weakref.WeakKeyDictionary()


def _notifier(db: SqliteDatabase) -> _LogNotifier:
    notifier = _notifiers.get(db)
    if notifier is None:
        notifier = _notifiers[db] = _LogNotifier()
    return notifier


class SqliteEventLog:
    """Run event logs in a shared ``SqliteDatabase``, readable and writable from every process on the file.

    Readers in this process are woken by an append at once; readers in other processes notice
    it within about 50 ms (see ``_LogNotifier``). Appends are fenced on the ``runs`` table of the
    same database, so give ``SqliteRunStore`` the same ``SqliteDatabase`` (``sqlite_run_backend``).
    """

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db
        self._notifier = _notifier(db)

    async def append(self, run_id: str, events: Sequence[Event], *, epoch: int | None = None) -> list[str]:
        check_run_id(run_id)
        if not events:
            return []
        blobs = [encode_event(event) for event in events]
        await self._db.ensure_schema(_RUNS_DDL, added=_RUNS_ADDED)
        async with self._db.transaction() as conn:
            state = list(await conn.execute_fetchall(_APPEND_STATE_SQL, (run_id,)))
            driver_epoch, log_id, closed, last_seq = state[0]
            if epoch is not None:
                check_epoch(run_id, epoch, driver_epoch, "append")
            if log_id is None:
                created = list(
                    await conn.execute_fetchall("INSERT INTO run_logs (run_id) VALUES (?) RETURNING id", (run_id,))
                )
                log_id = created[0][0]
            elif closed:
                raise EventLogClosedError(run_id)
            first = (last_seq or 0) + 1
            await conn.executemany(
                "INSERT INTO run_log_events (log_id, seq, event) VALUES (?, ?, ?)",
                [(log_id, first + i, blob) for i, blob in enumerate(blobs)],
            )
            fault_point("log.append")  # inside the transaction: a kill here lands none of the batch
        self._notifier.notify()
        return [format_offset(run_id, seq) for seq in range(first, first + len(blobs))]

    async def _state(self, run_id: str) -> tuple[int | None, bool, int]:
        await self._db.ensure_schema(_RUNS_DDL, added=_RUNS_ADDED)
        async with self._db.connection() as conn:
            rows = list(await conn.execute_fetchall(_LOG_STATE_SQL, (run_id,)))
        if not rows:
            return None, False, 0
        log_id, closed, last_seq = rows[0]
        return log_id, bool(closed), last_seq or 0

    async def _fetch(self, run_id: str, after: int) -> tuple[bool, list[tuple[int, bytes]]]:
        async with self._db.connection() as conn:
            state = list(await conn.execute_fetchall(_LOG_STATE_SQL, (run_id,)))
            if not state:
                return False, []
            log_id, closed, last_seq = state[0]
            # Closed was read first: a closed log takes no more appends, so these rows are all there is.
            if (last_seq or 0) <= after:
                return bool(closed), []
            rows = await conn.execute_fetchall(
                "SELECT seq, event FROM run_log_events WHERE log_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (log_id, after, RUN_LOG_READ_PAGE),
            )
        return bool(closed), [(seq, event) for seq, event in rows]

    async def read(
        self, run_id: str, after: str = START_OFFSET, *, signal: AbortSignal | None = None, live: bool = True
    ) -> AsyncIterator[tuple[str, Event]]:
        position = parse_offset(check_run_id(run_id), after)
        if position != 0:
            _, _, last_seq = await self._state(run_id)
            if position is None:
                position = last_seq
            elif position > last_seq:
                raise offset_never_issued(run_id, after, last_seq)
        await self._db.ensure_schema(_RUNS_DDL, added=_RUNS_ADDED)
        while signal is None or not signal.aborted:
            changed = self._notifier.generation()
            closed, rows = await self._fetch(run_id, position)
            for seq, blob in rows:
                position = seq
                yield format_offset(run_id, seq), decode_event(blob)
                if signal is not None and signal.aborted:
                    return
            if len(rows) == RUN_LOG_READ_PAGE:
                continue
            if closed or not live:
                return
            if not await self._notifier.wait(self._db, changed, signal):
                return

    async def snapshot(self, run_id: str, limit: int | None = None) -> list[Event]:
        check_run_id(run_id)
        await self._db.ensure_schema(_RUNS_DDL, added=_RUNS_ADDED)
        async with self._db.connection() as conn:
            rows = await conn.execute_fetchall(
                "SELECT e.event FROM run_logs AS l JOIN run_log_events AS e ON e.log_id = l.id "
                "WHERE l.run_id = ? ORDER BY e.seq LIMIT ?",
                (run_id, -1 if limit is None else max(limit, 0)),
            )
        return [decode_event(blob) for (blob,) in rows]

    async def tail(self, run_id: str) -> str:
        _, _, last_seq = await self._state(check_run_id(run_id))
        return format_offset(run_id, last_seq)

    async def close(self, run_id: str) -> None:
        check_run_id(run_id)
        await self._db.ensure_schema(_RUNS_DDL, added=_RUNS_ADDED)
        async with self._db.transaction() as conn:
            await conn.execute(
                "INSERT INTO run_logs (run_id, closed) VALUES (?, 1) ON CONFLICT(run_id) DO UPDATE SET closed = 1",
                (run_id,),
            )
        self._notifier.notify()

    async def is_closed(self, run_id: str) -> bool:
        _, closed, _ = await self._state(check_run_id(run_id))
        return closed


def sqlite_run_backend(db: SqliteDatabase) -> tuple[SqliteRunStore, SqliteEventLog]:
    """A run store and an event log on one database, so appends are fenced on the store's epochs."""
    return SqliteRunStore(db), SqliteEventLog(db)
