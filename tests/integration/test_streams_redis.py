"""The Durable Streams server over Redis (`boxwright serve --streams --store redis://...`): what it keeps there
survives a restart of the app and of the Redis server, and /runs/{id}/stream serves the Redis run logs."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from boxwright import events as ev
from boxwright.errors import StoreUnavailableError
from boxwright.stores.redis import open_redis, redis_run_backend
from boxwright.streams.serve import streams_app
from boxwright.tool_bridge.asgi import serve_asgi
from tests.support.redis_server import RedisServer, redis_server


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with redis_server(fsync="always") as started:
        yield started


@contextlib.asynccontextmanager
async def _served(store: str) -> AsyncIterator[httpx.AsyncClient]:
    """``streams_app(store=...)``, the app ``boxwright serve --streams --store`` runs, under uvicorn here."""
    app = streams_app(store=store)
    server = await serve_asgi(app, lifespan="on")
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            yield http
    finally:
        await server.close()


def test_streams_producers_closure_and_forks_survive_app_and_redis_restarts(server: RedisServer) -> None:
    store = server.url(prefix=server.fresh_prefix())
    text, json_path, fork, owned = (
        f"/v1/stream/{kind}-{uuid.uuid4().hex[:8]}" for kind in ("text", "json", "fork", "owned")
    )
    producer = {"content-type": "text/plain", "producer-id": "w", "producer-epoch": "2"}
    plain = {"content-type": "text/plain"}

    async def first() -> str:
        async with _served(store) as http:
            created = await http.put(text, headers={**plain, "stream-ttl": "3600"}, content=b"a")
            assert created.status_code == 201
            assert (await http.post(text, headers={**producer, "producer-seq": "0"}, content=b"b")).status_code == 200
            assert (await http.post(text, headers={**producer, "producer-seq": "1"}, content=b"c")).status_code == 200
            stream_seq = await http.post(text, headers={**plain, "stream-seq": "0005"}, content=b"d")
            assert stream_seq.status_code == 204
            body = b'[{"n":1},[2]]'
            assert (
                await http.put(json_path, headers={"content-type": "application/json"}, content=body)
            ).status_code == 201
            assert (await http.post(json_path, headers={"stream-closed": "true"})).status_code == 204
            assert (await http.put(fork, headers={"stream-forked-from": text})).status_code == 201
            assert (await http.post(fork, headers=plain, content=b"F")).status_code == 204
            assert (await http.delete(text)).status_code == 204  # soft: the fork still shares it
            assert (await http.put(owned, headers=plain)).status_code == 201
            assert (await http.post(owned, headers={**producer, "producer-seq": "0"}, content=b"x")).status_code == 200
            return str((await http.head(fork)).headers["stream-next-offset"])

    tail = asyncio.run(first())
    # A crash of the Redis server itself: only the AOF carries the streams over.
    server.kill()
    server.start()

    async def second() -> None:
        async with _served(store) as http:
            assert (await http.head(text)).status_code == 410
            assert (await http.put(text, headers=plain)).status_code == 409
            read = await http.get(f"{fork}?offset=-1")
            assert read.content == b"abcdF" and read.headers["stream-next-offset"] == tail
            assert (await http.head(fork)).headers["stream-ttl"] == "3600"
            assert (await http.get(f"{json_path}?offset=-1")).json() == [{"n": 1}, [2]]
            assert (await http.head(json_path)).headers["stream-closed"] == "true"
            # The producer's state came back: a retried append is a duplicate, an older epoch is fenced.
            duplicate = await http.post(owned, headers={**producer, "producer-seq": "0"}, content=b"x")
            assert duplicate.status_code == 204
            assert duplicate.headers["stream-next-offset"] == "0000000000000000_0000000000000001"
            stale = await http.post(
                owned, headers={**producer, "producer-epoch": "1", "producer-seq": "0"}, content=b"y"
            )
            assert stale.status_code == 403
            # Deleting the last fork removes the soft-deleted source too; its path is free again.
            assert (await http.delete(fork)).status_code == 204
            assert (await http.head(text)).status_code == 404
            assert (await http.put(text, headers=plain)).status_code == 201

        async with _served(store) as http:
            assert (await http.get(f"{text}?offset=-1")).content == b""  # the new stream, none of the old data

    asyncio.run(second())


def test_run_logs_on_redis_are_served_read_only_as_streams(server: RedisServer) -> None:
    store = server.url(prefix=server.fresh_prefix())

    async def scenario() -> None:
        async with open_redis(store) as db:
            runs, log = redis_run_backend(db)
            await runs.create_or_resume("run-1", "t")
            await log.append("run-1", [ev.TextMessageContentEvent(message_id="m", delta=str(i)) for i in range(3)])
            await log.close("run-1")
        async with _served(store) as http:
            read = await http.get("/runs/run-1/stream?offset=-1")
            assert read.status_code == 200, read.text
            assert [event["delta"] for event in read.json()] == ["0", "1", "2"]
            assert (await http.post("/runs/run-1/stream", content=b"x")).status_code in (403, 405)

    asyncio.run(scenario())


def test_a_redis_that_is_down_fails_the_apps_startup_with_a_clear_error(server: RedisServer) -> None:
    down = RedisServer()  # a port nothing listens on

    async def scenario() -> None:
        app = streams_app(store=down.url())
        with pytest.raises(StoreUnavailableError, match="unreachable"):
            await app.store.start()
        await app.store.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 30))
    finally:
        down.stop()


def test_appends_while_redis_is_down_get_503_and_memory_never_runs_ahead_of_redis(server: RedisServer) -> None:
    """A failed commit must not leave its data in memory: a later append would make it readable (and its
    offsets would shift once the server restarts). The store forgets the stream and reloads it as stored."""
    store = server.url(prefix=server.fresh_prefix())
    path = f"/v1/stream/outage-{uuid.uuid4().hex[:8]}"
    plain = {"content-type": "text/plain"}

    async def scenario() -> None:
        async with _served(store) as http:
            assert (await http.put(path, headers=plain, content=b"a")).status_code == 201
            await asyncio.to_thread(server.kill)
            refused = await http.post(path, headers=plain, content=b"LOST")
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert "127.0.0.1" not in refused.text  # the store's address stays in the server's log
            await asyncio.to_thread(server.start)
            assert (await http.post(path, headers=plain, content=b"b")).status_code == 204
            read = await http.get(f"{path}?offset=-1")
            assert read.content == b"ab", read.content
            assert read.headers["stream-next-offset"] == "0000000000000000_0000000000000002"
        async with _served(store) as http:  # and that is exactly what Redis holds
            assert (await http.get(f"{path}?offset=-1")).content == b"ab"

    asyncio.run(asyncio.wait_for(scenario(), 60))
