"""Durable Streams state in Redis: the ``StreamPersistence`` behind ``boxwright serve --streams --store redis://``.

The ``StreamStore`` keeps serving from memory and group-commits as it does over SQLite; this
writes each group commit as one ``MULTI``/``EXEC`` transaction, so a batch lands whole or not at
all and, with ``appendonly yes``, is in the AOF before the append is answered. Keys, under the
URL's prefix (``boxwright:`` by default) and ``ds:``:

- ``ds:last-id``: the highest stream id handed out;
- ``ds:path:<path>``: the id of the stream now at ``<path>`` (a soft-deleted one keeps its own id);
- ``ds:s:<id>``: the stream's fields (a hash; an absent field is ``None``);
- ``ds:m:<id>`` / ``ds:e:<id>``: its messages and the position after each (two lists, in order);
- ``ds:p:<id>``: its producers, ``<epoch> <last seq> <last offset>`` by producer id.

One process owns a prefix's streams, as one process owns a SQLite file's.
"""

from __future__ import annotations

from typing import Any

from boxwright.stores.redis import RedisDatabase, open_redis
from boxwright.streams.store import (
    CHILDREN_OP,
    CREATE_OP,
    DROP_OP,
    MESSAGE_OP,
    SOFT_DELETE_OP,
    STATE_OP,
    UPSERT_PRODUCER,
    Loaded,
    Statement,
    Steps,
)

# A path is freed only while it still names the dropped stream: a newer stream may have taken it.
_DROP_PATH_LUA = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"

_CREATE_FIELDS = (
    "id",
    "path",
    "content_type",
    "ttl",
    "expires_at",
    "closed",
    "touched_ms",
    "stream_seq",
    "closed_by",
    "parent",
    "fork_config",
)


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode()


def _number(value: bytes | None) -> int | None:
    return None if value is None else int(value)


class RedisStreamPersistence:
    """Durable Streams state on the Redis server at ``url`` (``redis://HOST:PORT/DB[?prefix=...]``)."""

    def __init__(self, url: str | RedisDatabase) -> None:
        self._db = url if isinstance(url, RedisDatabase) else open_redis(url)
        self._owned = not isinstance(url, RedisDatabase)

    @property
    def location(self) -> str:
        return self._db.url

    def _key(self, kind: str, name: object = "") -> str:
        return self._db.key("ds", f"{kind}:{name}" if name != "" else kind)

    async def open(self) -> int:
        # One round trip now, so a server that is down fails the app's startup with a clear error.
        last = await self._db.run("open streams", self._db.client.get(self._key("last-id")))
        return 0 if last is None else int(last)

    async def load(self, path: str) -> Loaded | None:
        found = await self._db.run("load stream", self._db.client.get(self._key("path", path)))
        if found is None:
            return None
        sid = int(found)
        pipe = self._db.client.pipeline(transaction=True)
        pipe.hgetall(self._key("s", sid))
        pipe.lrange(self._key("m", sid), 0, -1)
        pipe.lrange(self._key("e", sid), 0, -1)
        pipe.hgetall(self._key("p", sid))
        fields, items, ends, producers = await self._db.run("load stream", pipe.execute())
        if not fields:
            return None
        row = (
            sid,
            _text(fields.get(b"content_type")),
            _number(fields.get(b"ttl")),
            _text(fields.get(b"expires_at")),
            _number(fields.get(b"closed")) or 0,
            _number(fields.get(b"touched_ms")) or 0,
            _text(fields.get(b"stream_seq")),
            _text(fields.get(b"closed_by")),
            _text(fields.get(b"parent")),
            _text(fields.get(b"fork_config")),
            _number(fields.get(b"children")) or 0,
            _number(fields.get(b"soft_deleted")) or 0,
        )
        messages = [(int(end), bytes(item)) for end, item in zip(ends, items, strict=True)]
        owners = []
        for producer_id, state in producers.items():
            epoch, seq, offset = (int(part) for part in state.split())
            owners.append((producer_id.decode(), epoch, seq, offset))
        return row, messages, owners

    async def write(self, steps: Steps) -> None:
        pipe = self._db.client.pipeline(transaction=True)
        pending: tuple[int, list[bytes], list[int]] | None = None  # consecutive messages of one stream: one RPUSH

        def flush_messages() -> None:
            nonlocal pending
            if pending is not None:
                sid, items, ends = pending
                pipe.rpush(self._key("m", sid), *items)
                pipe.rpush(self._key("e", sid), *ends)
                pending = None

        for _, statements in steps:
            for op, params in statements:
                if op == MESSAGE_OP:
                    sid, _, end, data = params
                    if pending is not None and pending[0] != sid:
                        flush_messages()
                    if pending is None:
                        pending = (sid, [], [])
                    pending[1].append(data)
                    pending[2].append(end)
                    continue
                flush_messages()
                self._queue(pipe, (op, params))
        flush_messages()
        await self._db.run("commit streams", pipe.execute())

    def _queue(self, pipe: Any, statement: Statement) -> None:
        op, params = statement
        if op == CREATE_OP:
            fields = dict(zip(_CREATE_FIELDS, params, strict=True))
            sid = fields["id"]
            mapping = {name: value for name, value in fields.items() if value is not None}
            mapping.update(children=0, soft_deleted=0)
            pipe.hset(self._key("s", sid), mapping=mapping)
            pipe.set(self._key("path", fields["path"]), sid)
            pipe.set(self._key("last-id"), sid)
        elif op == UPSERT_PRODUCER:
            sid, producer_id, epoch, seq, offset = params
            pipe.hset(self._key("p", sid), producer_id, f"{epoch} {seq} {offset}")
        elif op == STATE_OP:
            closed, stream_seq, closed_by, touched_ms, sid = params
            key = self._key("s", sid)
            pipe.hset(key, mapping={"closed": closed, "touched_ms": touched_ms})
            for name, value in (("stream_seq", stream_seq), ("closed_by", closed_by)):
                if value is None:
                    pipe.hdel(key, name)
                else:
                    pipe.hset(key, name, value)
        elif op == CHILDREN_OP:
            children, sid = params
            pipe.hset(self._key("s", sid), "children", children)
        elif op == SOFT_DELETE_OP:
            (sid,) = params
            pipe.hset(self._key("s", sid), "soft_deleted", 1)
        elif op == DROP_OP:
            sid, path = params
            pipe.delete(self._key("s", sid), self._key("m", sid), self._key("e", sid), self._key("p", sid))
            # EVAL, not EVALSHA: inside MULTI a script the server lost (a restart) could not be reloaded.
            pipe.eval(_DROP_PATH_LUA, 1, self._key("path", path), sid)
        else:
            raise ValueError(f"unknown stream statement {op!r}")

    async def close(self) -> None:
        if self._owned:
            await self._db.close()


__all__ = ["RedisStreamPersistence"]
