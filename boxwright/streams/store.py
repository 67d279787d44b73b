"""Durable Streams state: in memory for this process, durable in SQLite through one group-committing writer.

A stream is loaded from the database on first use and then served from memory: catch-up reads
are a slice, live readers wait on an ``asyncio.Event``. Every change is validated and applied
to the pending state synchronously (so producer and ``Stream-Seq`` checks see earlier requests
in order), then queued for the writer task, which commits everything queued so far in one
transaction; readers see data only once that commit returns (``visible``). Unbatched appends
from many writers thus cost one WAL commit per batch, not per request.

The store has its own ``sqlite3`` connections (WAL, ``synchronous=NORMAL``, like
``boxwright.stores.sqlite``). A batch is written on the event loop's thread through a connection
that never waits for a lock (``busy_timeout=0``): a WAL commit without fsync takes well under a
millisecond, less than handing the batch to a thread and winning the GIL back. When another
process holds the database's write lock, the batch goes instead to the store's own thread, whose
connection waits for it (``busy_timeout``), as loads always do.

One process owns a database's streams (``boxwright serve --streams``): the memory is the
authority between commits, so a second writer process on the same file is not supported.

Where the commits go is a ``StreamPersistence``: ``SqliteStreamPersistence`` (this module, the
default) or ``boxwright.streams.redis_store.RedisStreamPersistence``. A change is a list of
``Statement``s, ``(op, params)`` with ``op`` one of the ``*_OP`` names below; each persistence
writes a group commit's statements, in order, as one transaction.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from boxwright.stores.sqlite import BUSY_TIMEOUT_MS
from boxwright.streams.protocol import media_type, parse_expires_at

log = logging.getLogger("boxwright.streams")

_DDL = """
CREATE TABLE IF NOT EXISTS ds_streams (
  id INTEGER PRIMARY KEY,
  path TEXT NOT NULL,
  content_type TEXT NOT NULL,
  ttl INTEGER,
  expires_at TEXT,
  closed INTEGER NOT NULL DEFAULT 0,
  touched_ms INTEGER NOT NULL,
  stream_seq TEXT,
  closed_by TEXT,
  parent TEXT,
  fork_config TEXT,
  children INTEGER NOT NULL DEFAULT 0,
  soft_deleted INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS ds_streams_path ON ds_streams (path);
CREATE TABLE IF NOT EXISTS ds_messages (
  stream_id INTEGER NOT NULL,
  idx INTEGER NOT NULL,
  end_pos INTEGER NOT NULL,
  data BLOB NOT NULL,
  PRIMARY KEY (stream_id, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ds_producers (
  stream_id INTEGER NOT NULL,
  producer_id TEXT NOT NULL,
  epoch INTEGER NOT NULL,
  last_seq INTEGER NOT NULL,
  last_offset INTEGER NOT NULL,
  PRIMARY KEY (stream_id, producer_id)
) WITHOUT ROWID;
"""

# The change vocabulary, with each op's params.
# (id, path, content_type, ttl, expires_at, closed, touched_ms, stream_seq, closed_by, parent, fork_config)
CREATE_OP = "create"
MESSAGE_OP = "message"  # (stream_id, idx, end_pos, data)
UPSERT_PRODUCER = "producer"  # (stream_id, producer_id, epoch, last_seq, last_offset)
STATE_OP = "state"  # (closed, stream_seq, closed_by, touched_ms, id)
CHILDREN_OP = "children"  # (children, id)
SOFT_DELETE_OP = "soft-delete"  # (id,)
DROP_OP = "drop"  # (id, path): the stream, its messages and producers

Statement = tuple[str, tuple[Any, ...]]
# What ``StreamPersistence.load`` returns: the stream's row (id, content_type, ttl, expires_at, closed,
# touched_ms, stream_seq, closed_by, parent, fork_config, children, soft_deleted), its messages as
# (end_pos, data) in order, its producers as (producer_id, epoch, last_seq, last_offset).
Loaded = tuple[tuple[Any, ...], list[tuple[int, bytes]], list[tuple[str, int, int, int]]]
# A group commit: each change's statements, flagged when it is a plain append (mergeable with others).
Steps = list[tuple[bool, list[Statement]]]


@runtime_checkable
class StreamPersistence(Protocol):
    """Where a ``StreamStore`` commits; the store calls it from one writer task, one batch at a time."""

    @property
    def location(self) -> str:
        """What a log line names: a file path or a store URL without its password."""
        ...

    async def open(self) -> int:
        """Connect (creating the schema if needed) and return the highest stream id stored (0 if none)."""
        ...

    async def load(self, path: str) -> Loaded | None:
        """The newest stream stored at ``path``, or ``None``."""
        ...

    async def write(self, steps: Steps) -> None:
        """Write every statement of ``steps``, in order, as one transaction (all or nothing)."""
        ...

    async def close(self) -> None: ...


_SQL: dict[str, str] = {
    CREATE_OP: "INSERT INTO ds_streams (id, path, content_type, ttl, expires_at, closed, touched_ms, stream_seq, "
    "closed_by, parent, fork_config) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    MESSAGE_OP: "INSERT INTO ds_messages (stream_id, idx, end_pos, data) VALUES (?, ?, ?, ?)",
    UPSERT_PRODUCER: "INSERT INTO ds_producers (stream_id, producer_id, epoch, last_seq, last_offset) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (stream_id, producer_id) DO UPDATE SET epoch = excluded.epoch, "
    "last_seq = excluded.last_seq, last_offset = excluded.last_offset",
    STATE_OP: "UPDATE ds_streams SET closed = ?, stream_seq = ?, closed_by = ?, touched_ms = ? WHERE id = ?",
    CHILDREN_OP: "UPDATE ds_streams SET children = ? WHERE id = ?",
    SOFT_DELETE_OP: "UPDATE ds_streams SET soft_deleted = 1 WHERE id = ?",
}
_DROP_SQL = (
    "DELETE FROM ds_messages WHERE stream_id = ?",
    "DELETE FROM ds_producers WHERE stream_id = ?",
    "DELETE FROM ds_streams WHERE id = ?",
)


def _stream_id(statement: Statement) -> int:
    """The id of the stream a statement changes."""
    op, params = statement
    index = 4 if op == STATE_OP else 1 if op == CHILDREN_OP else 0
    return int(params[index])


def _sql(statement: Statement) -> list[tuple[str, tuple[Any, ...]]]:
    op, params = statement
    if op == DROP_OP:
        return [(sql, (params[0],)) for sql in _DROP_SQL]
    return [(_SQL[op], params)]


@dataclass
class Producer:
    epoch: int
    last_seq: int
    last_offset: int  # the tail right after its last accepted append, for a duplicate's Stream-Next-Offset


@dataclass(eq=False)
class Stream:
    id: int
    path: str
    content_type: str
    json: bool
    ttl: int | None = None
    expires_at: str | None = None
    expires_at_s: float | None = None
    closed: bool = False
    items: list[bytes] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # position after items[i]
    visible: int = 0  # how many items are committed (readable)
    closed_visible: bool = False
    touched: float = field(default_factory=time.time)
    producers: dict[str, Producer] = field(default_factory=dict)
    stream_seq: str | None = None
    closed_by: str | None = None  # "id/epoch/seq" of the producer append that closed the stream
    parent: str | None = None
    fork_config: str | None = None  # what an identical fork PUT repeats: "source|offset|sub"
    children: int = 0
    soft_deleted: bool = False
    gone: bool = False  # deleted or expired: readers end
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def tail(self) -> int:
        """The committed tail position."""
        return self.ends[self.visible - 1] if self.visible else 0

    @property
    def pending_tail(self) -> int:
        return self.ends[-1] if self.ends else 0

    def expired(self, now: float) -> bool:
        if self.expires_at_s is not None and now >= self.expires_at_s:
            return True
        return self.ttl is not None and now >= self.touched + self.ttl

    def touch(self) -> None:
        self.touched = time.time()

    def wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def slice(self, position: int, limit: int) -> tuple[list[bytes], int]:
        """Committed items from ``position`` (cut to the position in a byte stream), about ``limit`` bytes."""
        index = bisect.bisect_right(self.ends, position, 0, self.visible)
        out: list[bytes] = []
        size = 0
        end = position
        while index < self.visible and (not out or size < limit):
            item = self.items[index]
            start = self.ends[index] - len(item) if not self.json else None
            if start is not None and start < position:
                item = item[position - start :]
            out.append(item)
            size += len(item)
            end = self.ends[index]
            index += 1
        return out, end

    def push(self, items: list[bytes]) -> list[Statement]:
        end = self.pending_tail
        statements: list[Statement] = []
        for item in items:
            end = end + 1 if self.json else end + len(item)
            statements.append((MESSAGE_OP, (self.id, len(self.items), end, item)))
            self.items.append(item)
            self.ends.append(end)
        return statements

    def state_statement(self) -> Statement:
        return (STATE_OP, (int(self.closed), self.stream_seq, self.closed_by, int(self.touched * 1000), self.id))


class _Op:
    __slots__ = ("after", "done", "grouped", "statements")

    def __init__(self, statements: list[Statement], after: Callable[[], None] | None, grouped: bool) -> None:
        self.statements = statements
        self.after = after
        self.grouped = grouped
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class SqliteStreamPersistence:
    """Streams in the SQLite file at ``path`` (see the module doc: a fast connection on the loop's thread,
    and the store's own thread for loads and for batches that must wait for another process's lock)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="boxwright-streams-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._fast: sqlite3.Connection | None = None

    @property
    def location(self) -> str:
        return self.path

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _open(self) -> int:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # Autocommit: the writer opens its transactions itself. Only the store's thread touches it.
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.executescript(_DDL)
        self._conn = conn
        fast = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        fast.execute("PRAGMA busy_timeout = 0")
        fast.execute("PRAGMA synchronous = NORMAL")
        self._fast = fast
        return int(conn.execute("SELECT COALESCE(MAX(id), 0) FROM ds_streams").fetchone()[0])

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("the stream store is not open (start() it first)")
        return self._conn

    async def open(self) -> int:
        return int(await self._call(self._open))

    def _load_rows(self, path: str) -> Loaded | None:
        conn = self._connection()
        row = conn.execute(
            "SELECT id, content_type, ttl, expires_at, closed, touched_ms, stream_seq, closed_by, parent, "
            "fork_config, children, soft_deleted FROM ds_streams WHERE path = ? ORDER BY id DESC LIMIT 1",
            (path,),
        ).fetchone()
        if row is None:
            return None
        messages = conn.execute(
            "SELECT end_pos, data FROM ds_messages WHERE stream_id = ? ORDER BY idx", (row[0],)
        ).fetchall()
        producers = conn.execute(
            "SELECT producer_id, epoch, last_seq, last_offset FROM ds_producers WHERE stream_id = ?", (row[0],)
        ).fetchall()
        return tuple(row), [(end, bytes(data)) for end, data in messages], [tuple(p) for p in producers]

    async def load(self, path: str) -> Loaded | None:
        loaded: Loaded | None = await self._call(self._load_rows, path)
        return loaded

    async def write(self, steps: Steps) -> None:
        # Plain appends may share one executemany per statement; anything else runs in order, alone.
        try:
            if self._fast is None:
                raise RuntimeError("the stream store is not open (start() it first)")
            self._write_sync(steps, self._fast)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            # Another process is writing the file: wait for it on the store's thread, not here.
            await self._call(self._write_sync, steps, self._connection())

    @staticmethod
    def _write_sync(steps: Steps, conn: sqlite3.Connection) -> None:
        grouped: dict[str, list[tuple[Any, ...]]] = {}

        def flush() -> None:
            for sql, rows in grouped.items():
                conn.executemany(sql, rows)
            grouped.clear()

        conn.execute("BEGIN IMMEDIATE")
        try:
            for is_grouped, statements in steps:
                if is_grouped:
                    for statement in statements:
                        for sql, params in _sql(statement):
                            grouped.setdefault(sql, []).append(params)
                    continue
                flush()
                for statement in statements:
                    for sql, params in _sql(statement):
                        conn.execute(sql, params)
            flush()
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    async def close(self) -> None:
        if self._conn is not None:
            await self._call(self._conn.close)
            self._conn = None
        if self._fast is not None:
            await self._call(self._fast.close)
            self._fast = None
        self._thread.shutdown(wait=True)


class StreamStore:
    """Streams by path, committed to ``persistence`` (a ``StreamPersistence``, or the path of a SQLite file);
    ``await start()`` before use, ``await close()`` after."""

    def __init__(self, persistence: StreamPersistence | str | os.PathLike[str]) -> None:
        if not isinstance(persistence, StreamPersistence):
            persistence = SqliteStreamPersistence(persistence)
        self.persistence = persistence
        self.path = persistence.location
        self._streams: dict[str, Stream | None] = {}
        self._loading: dict[str, asyncio.Future[Stream | None]] = {}
        self._next_id = 1
        self._queue: list[_Op] = []
        self._wakeup = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._closing = False
        self.commits = 0  # transactions written: fewer than changes when group commit merges them

    async def start(self) -> None:
        self._next_id = await self.persistence.open() + 1
        self._writer = asyncio.get_running_loop().create_task(self._write_loop(), name="boxwright streams writer")

    async def close(self) -> None:
        self._closing = True
        self._wakeup.set()
        if self._writer is not None:
            await self._writer
            self._writer = None
        await self.persistence.close()

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    # -- lookup ------------------------------------------------------------------------------------

    async def get(self, path: str) -> Stream | None:
        """The stream at ``path`` (soft-deleted ones included), loading it once; an expired one is removed."""
        if path in self._streams:
            stream = self._streams[path]
        else:
            loading = self._loading.get(path)
            if loading is None:
                loading = self._loading[path] = asyncio.ensure_future(self._load(path))
                try:
                    stream = await loading
                finally:
                    del self._loading[path]
                if path not in self._streams:
                    self._streams[path] = stream
                stream = self._streams[path]
            else:
                stream = await loading
                stream = self._streams.get(path, stream)
        if stream is not None and not stream.soft_deleted and stream.expired(time.time()):
            await self.commit(self.remove(stream), after=lambda: self.forget_if_absent(path))
            return None
        return stream

    async def _load(self, path: str) -> Stream | None:
        found = await self.persistence.load(path)
        if found is None:
            return None
        row, messages, producers = found
        stream = Stream(
            id=row[0],
            path=path,
            content_type=row[1],
            json=media_type(row[1]) == "application/json",
            ttl=row[2],
            expires_at=row[3],
            expires_at_s=parse_expires_at(row[3]) if row[3] else None,
            closed=bool(row[4]),
            closed_visible=bool(row[4]),
            touched=row[5] / 1000,
            stream_seq=row[6],
            closed_by=row[7],
            parent=row[8],
            fork_config=row[9],
            children=row[10],
            soft_deleted=bool(row[11]),
        )
        stream.items = [bytes(data) for _, data in messages]
        stream.ends = [end for end, _ in messages]
        stream.visible = len(stream.items)
        stream.producers = {pid: Producer(epoch, seq, off) for pid, epoch, seq, off in producers}
        return stream

    # -- changes (synchronous: validate and apply in one step, then await ``commit``) ----------------

    def create(self, stream: Stream, items: list[bytes]) -> list[Statement]:
        self._streams[stream.path] = stream
        statements: list[Statement] = [
            (
                CREATE_OP,
                (
                    stream.id,
                    stream.path,
                    stream.content_type,
                    stream.ttl,
                    stream.expires_at,
                    int(stream.closed),
                    int(stream.touched * 1000),
                    stream.stream_seq,
                    stream.closed_by,
                    stream.parent,
                    stream.fork_config,
                ),
            )
        ]
        statements += stream.push(items)
        if stream.parent is not None:
            parent = self._streams.get(stream.parent)
            if parent is not None:
                parent.children += 1
                statements.append((CHILDREN_OP, (parent.children, parent.id)))
        return statements

    def remove(self, stream: Stream) -> list[Statement]:
        """Delete ``stream`` (soft when forks still share it), cascading to soft-deleted ancestors.

        Queues its own commit: a removal found lazily (expiry) has no request waiting on it.
        """
        statements: list[Statement] = []
        current: Stream | None = stream
        while current is not None:
            if current.children > 0:
                if not current.soft_deleted:
                    current.soft_deleted = True
                    statements.append((SOFT_DELETE_OP, (current.id,)))
                    current.wake()
                break
            current.gone = True
            self._streams[current.path] = None
            statements.append((DROP_OP, (current.id, current.path)))
            current.wake()
            parent = self._streams.get(current.parent) if current.parent is not None else None
            current = None
            if parent is not None:
                parent.children -= 1
                statements.append((CHILDREN_OP, (parent.children, parent.id)))
                if parent.soft_deleted and parent.children == 0:
                    current = parent
        return statements

    def forget_if_absent(self, path: str) -> None:
        # After a delete commits the database agrees that the path is empty: the tombstone can go.
        if path in self._streams and self._streams[path] is None:
            del self._streams[path]

    async def commit(self, statements: list[Statement], after: Callable[[], None] | None = None) -> None:
        """Queue ``statements`` for the next group commit and wait for it; ``after`` runs once committed."""
        await self._submit(statements, after, grouped=False)

    async def commit_append(self, statements: list[Statement], after: Callable[[], None] | None = None) -> None:
        """Like ``commit`` for plain appends, whose statements may be merged with other appends'."""
        await self._submit(statements, after, grouped=True)

    async def _submit(self, statements: list[Statement], after: Callable[[], None] | None, grouped: bool) -> None:
        if self._writer is None or self._closing:
            raise RuntimeError("the stream store is not running (start() it first, or it was closed)")
        op = _Op(statements, after, grouped)
        self._queue.append(op)
        self._wakeup.set()
        # Shielded: once queued the change is applied in memory, so the commit must finish even if
        # this request is cancelled (its client went away).
        await asyncio.shield(op.done)

    async def _write_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if not self._queue:
                if self._closing:
                    return
                continue
            batch, self._queue = self._queue, []
            try:
                await self._write(batch)
            except Exception as exc:
                log.error("streams: a group commit of %d changes failed: %s: %s", len(batch), type(exc).__name__, exc)
                self._evict(batch, exc)
                continue
            for op in batch:
                if op.after is not None:
                    op.after()
                if not op.done.done():
                    op.done.set_result(None)
            if self._queue:
                self._wakeup.set()

    def _evict(self, failed: list[_Op], exc: Exception) -> None:
        """After a failed commit, memory is ahead of what is stored: fail those changes and the ones queued
        since on the same streams (their positions count the lost ones), forget the streams (the next request
        loads them as stored, e.g. once a Redis server is back) and end their readers."""
        ids: set[int] = set()
        paths: set[str] = set()

        def touches(op: _Op) -> bool:
            return any(_stream_id(statement) in ids for statement in op.statements)

        def take(op: _Op) -> None:
            for statement in op.statements:
                ids.add(_stream_id(statement))
                if statement[0] in (CREATE_OP, DROP_OP):
                    paths.add(statement[1][1])
            if not op.done.done():
                op.done.set_exception(exc)

        for op in failed:
            take(op)
        while dependent := [op for op in self._queue if touches(op)]:
            self._queue = [op for op in self._queue if op not in dependent]
            for op in dependent:
                take(op)
        for path, stream in list(self._streams.items()):
            if (stream is None and path in paths) or (stream is not None and stream.id in ids):
                del self._streams[path]
                if stream is not None:
                    stream.gone = True
                    stream.wake()

    async def _write(self, batch: list[_Op]) -> None:
        await self.persistence.write([(op.grouped, op.statements) for op in batch])
        self.commits += 1
