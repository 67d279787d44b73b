"""Redis stores (redis-py asyncio, extra ``redis``): every process and host on one Redis server shares them.

``open_redis(url)`` returns a ``RedisDatabase``: one lazily opened client (a connection pool)
that all Redis stores of a process share, every key under one prefix (default ``boxwright:``,
``?prefix=`` in the URL), so several deployments or tests can share a server. One server, not
Redis Cluster: several scripts touch keys of more than one slot.

Runs and event logs (``redis_run_backend(db)``)
    A run record is a hash; an event log is a Redis Stream whose entry ids are ``<seq>-0``, so
    the offset ``<tag>_<seq>`` of ``boxwright.runs`` maps to an entry id without a lookup. An
    append is one Lua script: it compares the run's ``driver_epoch`` with the writer's, refuses
    a closed log, and only then ``XADD``s the batch, so a fenced writer's append is refused
    atomically (decision 3) and a batch lands whole or not at all. ``close`` sets the log's
    closed flag and adds a marker entry ``<last seq>-1``, which wakes every blocked reader.
    A reader that caught up waits on one ``XREAD BLOCK`` per run and process (``_RunWatch``),
    however many readers that process has: an append from any connection wakes it at once,
    with no polling, and is read from Redis once for all of them (they take it from the watch's
    buffer of recent entries). Commands share at most ``COMMAND_CONNECTIONS`` connections; the
    watches have their own pool, one connection per run tailed.

Locks
    ``SET key token NX PX ttl``; each acquisition also takes the next fencing token of the key
    (``INCR``), handed out as ``RedisLease.fencing_token``. The holder renews every ttl/3 with a
    token-checked ``PEXPIRE`` and releases with a token-checked ``DEL``. The renewal runs on the
    store's renewer thread over a blocking connection of its own (``boxwright.stores.leases``),
    so neither a busy event loop nor a command pool full of tailers' reads delays it. A renewal
    that finds another token (the holder stalled past the lease and another process took the
    key over), or that fails until the lease runs out, fires the ``LeaseSignal``, as
    ``SqliteLockStore``'s does.

Failures
    A server that is down or drops the connection raises ``StoreUnavailableError`` at once:
    nothing is retried, since a retried append could land twice. The pool reconnects on the
    next call, so a store outlives a server restart. Durability is the server's: run it with
    ``appendonly yes`` (``appendfsync always`` makes every acknowledged write survive a machine
    crash too; ``everysec`` survives a Redis crash or restart but may lose the last second if
    the host goes down).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from types import TracebackType
from typing import Any, Final, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import msgspec

from boxwright.abort import AbortSignal
from boxwright.errors import EventLogClosedError, InvalidRunStatusError, RunExistsError, StoreClosedError
from boxwright.errors import StoreUnavailableError as StoreUnavailableError
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
from boxwright.stores.base import InstanceRecord, Lease
from boxwright.stores.leases import LeasedLockStore

try:
    import redis as syncredis
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError
    from redis.retry import Retry as SyncRetry
except ImportError as exc:  # pragma: no cover - only without the extra
    raise ImportError("the Redis stores need redis-py: pip install 'boxwright[redis]'") from exc


log = logging.getLogger("boxwright.stores")

DEFAULT_PREFIX: Final = "boxwright:"
CONNECT_TIMEOUT_S: Final = 5.0
# No command but a blocking read takes long; a blocking read's own bound is WATCH_BLOCK_MS.
SOCKET_TIMEOUT_S: Final = 30.0
# How long one XREAD BLOCK waits before its watcher looks whether anyone still waits.
WATCH_BLOCK_MS: Final = 1_000
READ_PAGE: Final = 1024
# How many of a run's latest entries its watch keeps for this process's live readers.
WATCH_BUFFER: Final = 4096
# Commands share this many connections (a thousand tailers catching up at once queue for them);
# each run's blocking watch has its own, from a second pool.
COMMAND_CONNECTIONS: Final = 64
# A lease renewal's bound: well inside the 1.5 s of the shortest lease in use, so a lost answer leaves time to retry.
LEASE_SOCKET_TIMEOUT_S: Final = 0.4

_Errors = (RedisConnectionError, RedisTimeoutError, OSError)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _redacted(url: str) -> str:
    """``url`` without a password, fit for an error message or a log."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class RedisDatabase:
    """One shared redis-py asyncio client for ``url``, opened on first use; ``await close()`` ends it.

    ``url`` is ``redis://[:password@]host[:port][/db]`` (or ``rediss://``, ``unix://``), with an
    optional ``?prefix=`` for the keys' prefix. Use one object per event loop.
    """

    def __init__(self, url: str, *, prefix: str | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"not a Redis URL: {_redacted(url)!r} (expected redis://HOST:PORT/DB)")
        query = parse_qsl(parts.query, keep_blank_values=True)
        in_url = [value for name, value in query if name == "prefix"]
        self.prefix = prefix if prefix is not None else in_url[-1] if in_url else DEFAULT_PREFIX
        # redis-py refuses query arguments it does not know: ours is taken out before it sees the URL.
        self._client_url = urlunsplit(parts._replace(query=urlencode([(n, v) for n, v in query if n != "prefix"])))
        self.url = _redacted(url)
        self._client: aioredis.Redis | None = None
        self._blocking: aioredis.Redis | None = None
        self._lease: syncredis.Redis | None = None
        self._lease_guard = threading.Lock()
        self._closed = False
        self._scripts: dict[str, Any] = {}
        self._lease_scripts: dict[str, Any] = {}
        self.watches: dict[str, _RunWatch] = {}

    def _connect(self, pool_class: type[aioredis.ConnectionPool], **options: Any) -> aioredis.Redis:
        # Never retried: a retried append or create could land twice (see the module doc).
        retry = Retry(NoBackoff(), 0)
        pool = pool_class.from_url(
            self._client_url,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=SOCKET_TIMEOUT_S,
            retry=retry,
            health_check_interval=0,
            **options,
        )
        return aioredis.Redis(connection_pool=pool, retry=retry)

    @property
    def client(self) -> aioredis.Redis:
        """For commands: at most ``COMMAND_CONNECTIONS`` connections; a caller beyond them waits for one."""
        if self._closed:
            raise StoreClosedError(self.url)
        if self._client is None:
            self._client = self._connect(
                aioredis.BlockingConnectionPool, max_connections=COMMAND_CONNECTIONS, timeout=SOCKET_TIMEOUT_S
            )
        return self._client

    @property
    def blocking_client(self) -> aioredis.Redis:
        """For the runs' ``XREAD BLOCK`` watches: one connection each, so they never starve commands."""
        if self._closed:
            raise StoreClosedError(self.url)
        if self._blocking is None:
            self._blocking = self._connect(aioredis.ConnectionPool)
        return self._blocking

    @property
    def lease_client(self) -> syncredis.Redis:
        """For lease renewals only, from the lock store's renewer thread: a blocking client with a connection of
        its own, so a renewal neither queues behind the command pool nor waits for the event loop."""
        with self._lease_guard:
            if self._closed:
                raise StoreClosedError(self.url)
            if self._lease is None:
                self._lease = syncredis.Redis.from_url(
                    self._client_url,
                    socket_connect_timeout=LEASE_SOCKET_TIMEOUT_S,
                    socket_timeout=LEASE_SOCKET_TIMEOUT_S,
                    # Not retried here: the renewer retries itself, for as long as the lease runs.
                    retry=SyncRetry(NoBackoff(), 0),
                    health_check_interval=0,
                )
            return self._lease

    def lease_script(self, source: str) -> Any:
        """``script`` for ``lease_client``."""
        found = self._lease_scripts.get(source)
        if found is None:
            found = self._lease_scripts[source] = self.lease_client.register_script(source)
        return found

    def key(self, kind: str, name: str = "") -> str:
        return f"{self.prefix}{kind}:{name}"

    def script(self, source: str) -> Any:
        """The script object for ``source`` (EVALSHA, loaded again after a server restart lost it)."""
        found = self._scripts.get(source)
        if found is None:
            found = self._scripts[source] = self.client.register_script(source)
        return found

    async def run(self, action: str, call: Awaitable[Any]) -> Any:
        """Await ``call``, turning a lost or refused connection into ``StoreUnavailableError``."""
        try:
            return await call
        except _Errors as exc:
            raise StoreUnavailableError(self.url, action, f"{type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        self._closed = True
        watches, self.watches = list(self.watches.values()), {}
        for watch in watches:
            await watch.stop()
        clients, self._client, self._blocking = (self._client, self._blocking), None, None
        for client in clients:
            if client is not None:
                await client.aclose(close_connection_pool=True)
        with self._lease_guard:
            lease, self._lease = self._lease, None
            self._lease_scripts.clear()
        if lease is not None:
            lease.close()

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> RedisDatabase:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"RedisDatabase({self.url!r}, prefix={self.prefix!r}{', closed' if self._closed else ''})"


def open_redis(url: str, *, prefix: str | None = None) -> RedisDatabase:
    """The Redis database at ``url``; nothing is connected until first use."""
    return RedisDatabase(url, prefix=prefix)


def _pairs(flat: Sequence[bytes]) -> dict[str, str]:
    return {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat), 2)}


# -- instances ------------------------------------------------------------------------------------

_INSTANCE_FIELDS = ("provider", "provider_sandbox_id", "thread_id", "updated_at", "latest_snapshot_id", "latest_run_id")


class RedisInstanceStore:
    """Instance records as hashes ``<prefix>instance:<key>``."""

    def __init__(self, db: RedisDatabase) -> None:
        self._db = db

    async def get(self, key: str) -> InstanceRecord | None:
        found = cast(
            dict[bytes, bytes], await self._db.run("get", self._db.client.hgetall(self._db.key("instance", key)))
        )
        if not found:
            return None
        fields = {_text(k): _text(v) for k, v in found.items()}
        return InstanceRecord(
            key=key,
            provider=fields["provider"],
            provider_sandbox_id=fields["provider_sandbox_id"],
            thread_id=fields["thread_id"],
            updated_at=int(fields["updated_at"]),
            latest_snapshot_id=fields.get("latest_snapshot_id"),
            latest_run_id=fields.get("latest_run_id"),
        )

    async def upsert(self, record: InstanceRecord) -> None:
        mapping: dict[str, str | int] = {
            name: value for name in _INSTANCE_FIELDS if (value := getattr(record, name)) is not None
        }
        mapping["updated_at"] = str(record.updated_at)
        key = self._db.key("instance", record.key)
        # One transaction, delete then write: a field merge would keep a snapshot id the caller meant to clear.
        pipe = self._db.client.pipeline(transaction=True)
        pipe.delete(key)
        pipe.hset(key, mapping=cast(Any, mapping))
        await self._db.run("upsert", pipe.execute())

    async def delete(self, key: str) -> None:
        await self._db.run("delete", self._db.client.delete(self._db.key("instance", key)))


# -- locks ----------------------------------------------------------------------------------------

_ACQUIRE_LUA = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return 0
"""
_RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisLease(Lease):
    """A ``Lease`` with the key's fencing token: strictly greater for every later holder of the key."""

    __slots__ = ("fencing_token",)

    def __init__(self, key: str, fencing_token: int) -> None:
        super().__init__(key)
        self.fencing_token = fencing_token


class RedisLockStore(LeasedLockStore):
    """Leases as token-valued keys ``<prefix>lock:<key>`` with fencing counters ``<prefix>fence:<key>``;
    acquired and released over the command pool, renewed from ``LeasedLockStore``'s thread over
    ``RedisDatabase.lease_client``."""

    def __init__(self, db: RedisDatabase) -> None:
        super().__init__(db.url)
        self._db = db

    def _new_lease(self, key: str, fencing_token: int) -> Lease:
        return RedisLease(key, fencing_token)

    async def _take(self, key: str, token: str, ttl_ms: int) -> int:
        script = self._db.script(_ACQUIRE_LUA)
        keys = [self._db.key("lock", key), self._db.key("fence", key)]
        return int(await self._db.run("lock", script(keys=keys, args=[token, ttl_ms])))

    def _extend(self, key: str, token: str, ttl_ms: int, loop: asyncio.AbstractEventLoop) -> bool:
        try:
            held = self._db.lease_script(_RENEW_LUA)(keys=[self._db.key("lock", key)], args=[token, ttl_ms])
        except _Errors as exc:
            raise StoreUnavailableError(self._db.url, "renew lock", f"{type(exc).__name__}: {exc}") from exc
        return bool(held)

    async def _delete(self, key: str, token: str) -> None:
        # Token-checked: a holder whose lease expired must not free the key its successor now holds.
        await self._db.run(
            "release lock", self._db.script(_RELEASE_LUA)(keys=[self._db.key("lock", key)], args=[token])
        )


# -- run records ----------------------------------------------------------------------------------
#
# A record is the hash <prefix>run:<id>: one field per set RunRecord field (an absent field is
# None), plus "order", a per-database creation counter and the run id ("<20 digits>:<id>"), the
# member under which the run is indexed. Indexes: <prefix>thread:<thread> (score started_at),
# <prefix>detached (score detached_since, only running runs) and <prefix>running (score started_at,
# only running runs); equal scores sort by member, so by creation, as SQLite's rowid does.

_ORDER_WIDTH = 20

_CREATE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {0, redis.call('HGETALL', KEYS[1])} end
local order = string.format('%020d', redis.call('INCR', KEYS[2])) .. ':' .. ARGV[1]
redis.call('HSET', KEYS[1], 'run_id', ARGV[1], 'thread_id', ARGV[2], 'status', 'running',
  'started_at', ARGV[3], 'updated_at', ARGV[4], 'order', order)
redis.call('ZADD', KEYS[3], ARGV[3], order)
redis.call('ZADD', KEYS[4], ARGV[3], order)
return {1, redis.call('HGETALL', KEYS[1])}
"""

# ARGV: expected epoch ('' for none), then field/value pairs; a value '' deletes, '=x' sets x.
_UPDATE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
if ARGV[1] ~= '' then
  local held = redis.call('HGET', KEYS[1], 'driver_epoch')
  if held ~= ARGV[1] then return {'fenced', held} end
end
for i = 2, #ARGV, 2 do
  if ARGV[i + 1] == '' then redis.call('HDEL', KEYS[1], ARGV[i])
  else redis.call('HSET', KEYS[1], ARGV[i], string.sub(ARGV[i + 1], 2)) end
end
local order = redis.call('HGET', KEYS[1], 'order')
local detached = redis.call('HGET', KEYS[1], 'detached_since')
local running = redis.call('HGET', KEYS[1], 'status') == 'running'
if detached and running then
  redis.call('ZADD', KEYS[2], detached, order)
else
  redis.call('ZREM', KEYS[2], order)
end
if running then
  redis.call('ZADD', KEYS[3], redis.call('HGET', KEYS[1], 'started_at'), order)
else
  redis.call('ZREM', KEYS[3], order)
end
return {'ok', redis.call('HGETALL', KEYS[1])}
"""

_ACTIVE_LUA = """
local members = redis.call('ZREVRANGE', KEYS[1], 0, -1)
for _, member in ipairs(members) do
  local key = ARGV[1] .. string.sub(member, ARGV[2] + 2)
  if redis.call('HGET', key, 'status') == 'running' then return redis.call('HGETALL', key) end
end
return false
"""

_usage_decoder = msgspec.json.Decoder(TokenUsage)
_error_decoder = msgspec.json.Decoder(RunError)


def _run_from_hash(fields: dict[str, str]) -> RunRecord:
    run_id = fields["run_id"]
    status = fields["status"]
    if not is_run_status(status):
        raise InvalidRunStatusError(run_id, status)

    def integer(name: str) -> int | None:
        value = fields.get(name)
        return None if value is None else int(value)

    usage = fields.get("usage")
    error = fields.get("error")
    cancel = fields.get("cancel_requested")
    return RunRecord(
        run_id=run_id,
        thread_id=fields["thread_id"],
        status=status,
        started_at=int(fields["started_at"]),
        updated_at=int(fields["updated_at"]),
        finished_at=integer("finished_at"),
        error=None if error is None else _error_decoder.decode(error),
        usage=None if usage is None else _usage_decoder.decode(usage),
        sandbox_key=fields.get("sandbox_key"),
        detached_since=integer("detached_since"),
        # Absent (never set) and "0" (explicitly False) are different answers.
        cancel_requested=None if cancel is None else cancel == "1",
        driver_epoch=integer("driver_epoch"),
        sandbox_profile=fields.get("sandbox_profile"),
        harness_profile=fields.get("harness_profile"),
        input_messages=fields.get("input_messages"),
    )


def _field_value(name: str, value: Any) -> str:
    if value is None:
        return ""
    if name in ("error", "usage"):
        return "=" + msgspec.json.encode(value).decode()
    if name == "cancel_requested":
        return "=1" if value else "=0"
    return f"={value}"


class RedisRunStore:
    """Run records in Redis hashes; every process on the server sees them (see the module doc)."""

    def __init__(self, db: RedisDatabase) -> None:
        self._db = db

    def _run_key(self, run_id: str) -> str:
        return self._db.key("run", run_id)

    async def _records(self, members: Sequence[bytes]) -> list[RunRecord]:
        if not members:
            return []
        pipe = self._db.client.pipeline(transaction=False)
        for member in members:
            pipe.hgetall(self._run_key(_text(member)[_ORDER_WIDTH + 1 :]))
        rows = cast(list[dict[bytes, bytes]], await self._db.run("list runs", pipe.execute()))
        return [_run_from_hash({_text(k): _text(v) for k, v in row.items()}) for row in rows if row]

    async def get(self, run_id: str) -> RunRecord | None:
        found = cast(
            dict[bytes, bytes],
            await self._db.run("get run", self._db.client.hgetall(self._run_key(check_run_id(run_id)))),
        )
        return _run_from_hash({_text(k): _text(v) for k, v in found.items()}) if found else None

    async def _create(self, run_id: str, thread_id: str, started_at: int | None) -> tuple[bool, RunRecord]:
        check_run_id(run_id)
        check_thread_id(thread_id)
        now = _now_ms()
        reply = await self._db.run(
            "create run",
            self._db.script(_CREATE_LUA)(
                keys=[
                    self._run_key(run_id),
                    self._db.key("run-counter"),
                    self._db.key("thread", thread_id),
                    self._db.key("running"),
                ],
                args=[run_id, thread_id, now if started_at is None else started_at, now],
            ),
        )
        return bool(reply[0]), _run_from_hash(_pairs(reply[1]))

    async def create_or_resume(self, run_id: str, thread_id: str, *, started_at: int | None = None) -> RunRecord:
        # Never an upsert: a finished run asked for again must stay finished.
        return (await self._create(run_id, thread_id, started_at))[1]

    async def create(self, run_id: str, thread_id: str, *, started_at: int | None = None) -> RunRecord:
        """A new ``running`` record; ``RunExistsError`` (naming the owner's thread) if the id has one (atomic)."""
        inserted, record = await self._create(run_id, thread_id, started_at)
        if not inserted:
            raise RunExistsError(run_id, record.thread_id)
        return record

    async def update(self, run_id: str, patch: RunPatch, *, expected_epoch: int | None = None) -> RunRecord | None:
        changes = patch_changes(check_run_id(run_id), patch)
        args: list[str] = ["" if expected_epoch is None else str(expected_epoch)]
        for name, value in changes.items():
            args += [name, _field_value(name, value)]
        args += ["updated_at", f"={_now_ms()}"]
        reply = await self._db.run(
            "update run",
            self._db.script(_UPDATE_LUA)(
                keys=[self._run_key(run_id), self._db.key("detached"), self._db.key("running")], args=args
            ),
        )
        if reply is None:
            return None
        if _text(reply[0]) == "fenced":
            stored = None if reply[1] is None else int(reply[1])
            check_epoch(run_id, cast(int, expected_epoch), stored, "update")
        return _run_from_hash(_pairs(reply[1]))

    async def find_active_run(self, thread_id: str) -> RunRecord | None:
        reply = await self._db.run(
            "find active run",
            self._db.script(_ACTIVE_LUA)(
                keys=[self._db.key("thread", thread_id)], args=[self._db.key("run"), _ORDER_WIDTH]
            ),
        )
        return None if reply is None else _run_from_hash(_pairs(reply))

    async def list_by_thread(self, thread_id: str) -> list[RunRecord]:
        members = cast(
            list[bytes],
            await self._db.run("list runs", self._db.client.zrange(self._db.key("thread", thread_id), 0, -1)),
        )
        return await self._records(members)

    async def list_reclaimable(self, now_ms: int, ttl_ms: int) -> list[RunRecord]:
        cutoff = now_ms - ttl_ms
        members: list[bytes] = await self._db.run(
            "list reclaimable runs", self._db.client.zrangebyscore(self._db.key("detached"), "-inf", cutoff)
        )
        return [
            r
            for r in await self._records(members)
            if r.status == "running" and r.detached_since is not None and r.detached_since <= cutoff
        ]

    async def list_running(self, limit: int) -> list[RunRecord]:
        # Indexed since this index exists: a run created by an older version is found once it is updated.
        if limit <= 0:
            return []
        members: list[bytes] = await self._db.run(
            "list running runs", self._db.client.zrange(self._db.key("running"), 0, limit - 1)
        )
        return [r for r in await self._records(members) if r.status == "running"]


# -- event logs -----------------------------------------------------------------------------------
#
# <prefix>log:<id> is the log's state (seq: the last event's position; closed: "1"), <prefix>events:<id>
# the stream: event n is the entry "<n>-0" with the field "e" (its compact JSON); the close
# marker is the entry "<last n>-1". Appends, closes and the epoch check are each one script.

_APPEND_LUA = """
if ARGV[1] ~= '' then
  local held = redis.call('HGET', KEYS[1], 'driver_epoch')
  if held ~= ARGV[1] then return {'fenced', held} end
end
if redis.call('HGET', KEYS[2], 'closed') == '1' then return {'closed'} end
local seq = tonumber(redis.call('HGET', KEYS[2], 'seq') or '0')
local first = seq + 1
for i = 2, #ARGV do
  seq = seq + 1
  redis.call('XADD', KEYS[3], seq .. '-0', 'e', ARGV[i])
end
redis.call('HSET', KEYS[2], 'seq', seq)
return {'ok', first}
"""
_CLOSE_LUA = """
if redis.call('HGET', KEYS[1], 'closed') == '1' then return 0 end
redis.call('HSET', KEYS[1], 'closed', '1')
redis.call('XADD', KEYS[2], (redis.call('HGET', KEYS[1], 'seq') or '0') .. '-1', 'closed', '1')
return 1
"""


def _entry_seq(entry_id: bytes) -> tuple[int, bool]:
    """``(seq, is_close_marker)`` of a stream entry id ``<seq>-<0|1>``."""
    ms, _, part = _text(entry_id).partition("-")
    return int(ms), part != "0"


class _RunWatch:
    """This process's view of one run's stream while anyone here tails it: one ``XREAD BLOCK`` loop.

    The loop reads every new entry once, keeps the last ``WATCH_BUFFER`` of them, and wakes the
    readers, who take what they have not seen from that buffer: an append costs one read however
    many readers this process has (a thousand SSE tailers of one run are one connection, not a
    thousand queries). A reader the buffer cannot serve (behind it, or ahead of the loop) reads
    the stream itself. Readers take ``generation()`` BEFORE they look, so an entry that lands
    between their look and their wait still wakes them.
    """

    def __init__(self, db: RedisDatabase, key: str) -> None:
        self._db = db
        self._key = key
        self._changed: asyncio.Event | None = None
        self._waiters = 0
        self._task: asyncio.Task[None] | None = None
        self._seen = 0  # the loop has read every entry up to this seq
        self._recent: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=WATCH_BUFFER)
        self._closed_at: int | None = None  # the seq the close marker follows, once the loop read it

    def generation(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def after(self, position: int) -> tuple[bool, list[tuple[int, bytes]]] | None:
        """``(closed, entries after position)`` as the running loop has read them, or ``None`` if it cannot say."""
        if self._task is None or position > self._seen:
            return None
        base = self._recent[0][0] - 1 if self._recent else self._seen
        if position < base:
            return None
        # The buffer holds consecutive seqs (the append script numbers entries one by one), so position's
        # successor is at index position - base: each reader copies what it lacks instead of scanning
        # the whole buffer (a thousand readers x 4096 entries on every wake).
        rows = list(itertools.islice(self._recent, position - base, None)) if position < self._seen else []
        return self._closed_at is not None and self._closed_at <= position + len(rows), rows

    async def wait(self, position: int, changed: asyncio.Event, signal: AbortSignal | None) -> bool:
        self._waiters += 1
        if self._task is None:
            self._seen, self._closed_at = position, None
            self._recent.clear()
            self._task = asyncio.get_running_loop().create_task(
                self._watch(), name=f"boxwright run-log watch {self._key}"
            )
        try:
            return await wait_event_or_abort(changed, signal)
        finally:
            self._waiters -= 1

    async def _watch(self) -> None:
        try:
            while self._waiters:
                # RESP2 (the client's default): [[key, [(id, fields), ...]]].
                reply: Any = await self._db.blocking_client.xread(
                    {self._key: f"{self._seen}-0" if self._closed_at is None else f"{self._seen}-1"},
                    count=READ_PAGE,
                    block=WATCH_BLOCK_MS,
                )
                if not reply:
                    continue
                for entry_id, fields in reply[0][1]:
                    seq, marker = _entry_seq(entry_id)
                    if marker:
                        self._closed_at = seq
                    else:
                        self._recent.append((seq, fields[b"e"]))
                        self._seen = seq
                self.notify()
        except asyncio.CancelledError:
            raise
        except Exception:
            # Readers look again and meet the error themselves (the server went away, the store was closed).
            pass
        finally:
            self._task = None
            self.notify()
            if self._waiters == 0 and self._db.watches.get(self._key) is self:
                del self._db.watches[self._key]  # nobody tails this run here any more

    async def stop(self) -> None:
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.wait([task])


class RedisEventLog:
    """Run event logs as Redis Streams, readable and writable from every process on the server.

    Appends are fenced on the run records of the same ``RedisDatabase`` (``redis_run_backend``).
    """

    def __init__(self, db: RedisDatabase) -> None:
        self._db = db

    def _keys(self, run_id: str) -> tuple[str, str, str]:
        return self._db.key("run", run_id), self._db.key("log", run_id), self._db.key("events", run_id)

    def _watch(self, run_id: str) -> _RunWatch:
        key = self._db.key("events", run_id)
        watch = self._db.watches.get(key)
        if watch is None:
            watch = self._db.watches[key] = _RunWatch(self._db, key)
        return watch

    def _forget_idle(self, run_id: str) -> None:
        key = self._db.key("events", run_id)
        watch = self._db.watches.get(key)
        if watch is not None and watch._waiters == 0 and watch._task is None:
            del self._db.watches[key]

    async def append(self, run_id: str, events: Sequence[Event], *, epoch: int | None = None) -> list[str]:
        check_run_id(run_id)
        if not events:
            return []
        blobs = [encode_event(event) for event in events]
        reply = await self._db.run(
            "append",
            self._db.script(_APPEND_LUA)(
                keys=list(self._keys(run_id)), args=["" if epoch is None else str(epoch), *blobs]
            ),
        )
        outcome = _text(reply[0])
        if outcome == "fenced":
            check_epoch(run_id, cast(int, epoch), None if reply[1] is None else int(reply[1]), "append")
        if outcome == "closed":
            raise EventLogClosedError(run_id)
        first = int(reply[1])
        # No local wake-up: this process's readers learn of it from their watch's XREAD, like everyone's.
        return [format_offset(run_id, seq) for seq in range(first, first + len(blobs))]

    async def _state(self, run_id: str) -> tuple[bool, int]:
        closed, seq = await self._db.run(
            "read log state", self._db.client.hmget(self._db.key("log", run_id), ["closed", "seq"])
        )
        return closed == b"1", 0 if seq is None else int(seq)

    async def _fetch(self, run_id: str, after: int) -> tuple[bool, list[tuple[int, bytes]]]:
        entries: list[tuple[bytes, dict[bytes, bytes]]] = await self._db.run(
            "read log",
            self._db.client.xrange(self._db.key("events", run_id), min=f"({after}-0", max="+", count=READ_PAGE),
        )
        rows: list[tuple[int, bytes]] = []
        for entry_id, fields in entries:
            seq, marker = _entry_seq(entry_id)
            if marker:
                return True, rows
            rows.append((seq, fields[b"e"]))
        return False, rows

    async def read(
        self, run_id: str, after: str = START_OFFSET, *, signal: AbortSignal | None = None, live: bool = True
    ) -> AsyncIterator[tuple[str, Event]]:
        position = parse_offset(check_run_id(run_id), after)
        if position != 0:
            _, last_seq = await self._state(run_id)
            if position is None:
                position = last_seq
            elif position > last_seq:
                raise offset_never_issued(run_id, after, last_seq)
        watch = self._watch(run_id)
        try:
            while signal is None or not signal.aborted:
                changed = watch.generation()
                # A live reader takes what the run's watch already read; anyone else asks the stream.
                cached = watch.after(position) if live else None
                closed, rows = cached if cached is not None else await self._fetch(run_id, position)
                for seq, blob in rows:
                    position = seq
                    yield format_offset(run_id, seq), decode_event(blob)
                    if signal is not None and signal.aborted:
                        return
                if len(rows) == READ_PAGE:
                    continue
                if closed or not live:
                    return
                if not await watch.wait(position, changed, signal):
                    return
        finally:
            self._forget_idle(run_id)

    async def snapshot(self, run_id: str, limit: int | None = None) -> list[Event]:
        check_run_id(run_id)
        if limit is not None and limit <= 0:
            return []
        entries: list[tuple[bytes, dict[bytes, bytes]]] = await self._db.run(
            "snapshot", self._db.client.xrange(self._db.key("events", run_id), min="-", max="+", count=limit)
        )
        return [decode_event(fields[b"e"]) for entry_id, fields in entries if not _entry_seq(entry_id)[1]]

    async def tail(self, run_id: str) -> str:
        _, last_seq = await self._state(check_run_id(run_id))
        return format_offset(run_id, last_seq)

    async def close(self, run_id: str) -> None:
        check_run_id(run_id)
        _, log_key, events_key = self._keys(run_id)
        # The marker entry wakes every watch, in this process too.
        await self._db.run("close log", self._db.script(_CLOSE_LUA)(keys=[log_key, events_key], args=[]))

    async def is_closed(self, run_id: str) -> bool:
        closed, _ = await self._state(check_run_id(run_id))
        return closed


def redis_run_backend(db: RedisDatabase) -> tuple[RedisRunStore, RedisEventLog]:
    """A run store and an event log on one database, so appends are fenced on the store's epochs."""
    return RedisRunStore(db), RedisEventLog(db)


__all__ = [
    "DEFAULT_PREFIX",
    "RedisDatabase",
    "RedisEventLog",
    "RedisInstanceStore",
    "RedisLease",
    "RedisLockStore",
    "RedisRunStore",
    "StoreUnavailableError",
    "open_redis",
    "redis_run_backend",
]
