"""One store URL to the whole store set: instances, locks, run records and run event logs on one backend.

``open_store(url)`` takes

- ``sqlite:///PATH`` (``sqlite:///rel.db`` relative to the working directory, ``sqlite:////abs.db``
  absolute, as SQLAlchemy spells them) or ``sqlite://`` for boxwright's default database
  (``$BOXWRIGHT_DB`` or ``./.boxwright/boxwright.db``): one machine;
- ``redis://HOST:PORT/DB`` (also ``rediss://``, ``unix://``; ``?prefix=`` sets the key prefix,
  default ``boxwright:``): every host that reaches the server.

and returns a ``StoreSet`` whose four stores share one connection, so event-log appends are
fenced on the same run records (decision 3). Nothing connects until first use; ``await
stores.close()`` (or ``async with``) ends the connection.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType

from boxwright.config import database_path
from boxwright.runs import EventLog, RunStore
from boxwright.stores.base import BlockLockStore, SandboxInstanceStore

SQLITE_SCHEME = "sqlite://"
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


@dataclass(frozen=True)
class StoreSet:
    """The stores of one backend; ``url`` is the one it was opened from, without a password."""

    url: str
    instances: SandboxInstanceStore
    locks: BlockLockStore
    runs: RunStore
    events: EventLog
    _close: Callable[[], Awaitable[None]] = field(repr=False)

    async def close(self) -> None:
        await self._close()

    async def __aenter__(self) -> StoreSet:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def sqlite_path(url: str) -> str:
    """The database file a ``sqlite://`` URL names (``sqlite://`` alone: boxwright's default)."""
    rest = url[len(SQLITE_SCHEME) :]
    if rest in ("", "/"):
        return database_path()
    if not rest.startswith("/"):
        raise ValueError(f"not a SQLite store URL: {url!r} (expected sqlite:///PATH or sqlite:////ABSOLUTE/PATH)")
    return os.path.abspath(rest[1:]) if not rest.startswith("//") else rest[1:]


def open_store(url: str | None = None) -> StoreSet:
    """The store set at ``url`` (default: the embedded SQLite database); see the module doc."""
    if url is None or url.startswith(SQLITE_SCHEME):
        from boxwright.stores.sqlite import (
            SqliteInstanceStore,
            SqliteLockStore,
            open_database,
            sqlite_run_backend,
        )

        path = database_path() if url is None else sqlite_path(url)
        db = open_database(path)
        runs, events = sqlite_run_backend(db)
        return StoreSet(f"sqlite:///{path}", SqliteInstanceStore(db), SqliteLockStore(db), runs, events, db.close)
    if url.startswith(REDIS_SCHEMES):
        from boxwright.stores.redis import RedisInstanceStore, RedisLockStore, open_redis, redis_run_backend

        rdb = open_redis(url)
        rruns, revents = redis_run_backend(rdb)
        return StoreSet(rdb.url, RedisInstanceStore(rdb), RedisLockStore(rdb), rruns, revents, rdb.close)
    raise ValueError(
        f"unknown store URL {url.split('://', 1)[0]!r}://...: expected sqlite:///PATH or redis://HOST:PORT/DB"
    )


__all__ = ["REDIS_SCHEMES", "SQLITE_SCHEME", "StoreSet", "open_store", "sqlite_path"]
