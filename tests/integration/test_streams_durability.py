"""What `boxwright serve --streams` keeps in SQLite: everything survives a restart, and concurrent
unbatched appends are group-committed (fewer transactions than appends), none lost or doubled."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from pathlib import Path

import httpx
import pytest

from boxwright.streams.app import StreamsApp
from boxwright.streams.store import StreamStore
from boxwright.tool_bridge.asgi import serve_asgi
from tests.support.streams import streams_server

WRITERS = 16
PER_WRITER = 40


def test_streams_producers_closure_and_forks_survive_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "streams.db"
    text, json_path, fork = (f"/v1/stream/{kind}-{uuid.uuid4().hex[:8]}" for kind in ("text", "json", "fork"))
    producer = {"content-type": "text/plain", "producer-id": "w", "producer-epoch": "2"}
    with streams_server(db) as url, httpx.Client(base_url=url, timeout=10) as http:
        assert (
            http.put(text, headers={"content-type": "text/plain", "stream-ttl": "3600"}, content=b"a").status_code
            == 201
        )
        assert http.post(text, headers={**producer, "producer-seq": "0"}, content=b"b").status_code == 200
        assert http.post(text, headers={**producer, "producer-seq": "1"}, content=b"c").status_code == 200
        assert (
            http.post(text, headers={"content-type": "text/plain", "stream-seq": "0005"}, content=b"d").status_code
            == 204
        )
        assert (
            http.put(json_path, headers={"content-type": "application/json"}, content=b'[{"n":1},[2]]').status_code
            == 201
        )
        closed = http.post(json_path, headers={"stream-closed": "true"})
        assert closed.status_code == 204
        assert http.put(fork, headers={"stream-forked-from": text}).status_code == 201
        assert http.post(fork, headers={"content-type": "text/plain"}, content=b"F").status_code == 204
        assert http.delete(text).status_code == 204  # soft: the fork still shares it
        tail = http.head(fork).headers["stream-next-offset"]

    with streams_server(db) as url, httpx.Client(base_url=url, timeout=10) as http:
        assert http.head(text).status_code == 410
        assert http.put(text, headers={"content-type": "text/plain"}).status_code == 409
        read = http.get(f"{fork}?offset=-1")
        assert read.content == b"abcdF"
        assert read.headers["stream-next-offset"] == tail
        assert http.head(fork).headers["stream-ttl"] == "3600"  # inherited from its source
        assert http.get(f"{json_path}?offset=-1").json() == [{"n": 1}, [2]]
        assert http.head(json_path).headers["stream-closed"] == "true"
        again = http.post(json_path, headers={"content-type": "application/json"}, content=b"1")
        assert again.status_code == 409
        # Deleting the last fork removes the soft-deleted source too.
        assert http.delete(fork).status_code == 204
        assert http.head(text).status_code == 404
        assert http.put(text, headers={"content-type": "text/plain"}).status_code == 201

    with streams_server(db) as url, httpx.Client(base_url=url, timeout=10) as http:
        assert http.get(f"{text}?offset=-1").content == b""  # the re-created stream, none of the old data


def test_producer_state_survives_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "streams.db"
    path = f"/v1/stream/p-{uuid.uuid4().hex[:8]}"
    headers = {"content-type": "text/plain", "producer-id": "w", "producer-epoch": "4"}
    with streams_server(db) as url, httpx.Client(base_url=url, timeout=10) as http:
        assert http.put(path, headers={"content-type": "text/plain"}).status_code == 201
        assert http.post(path, headers={**headers, "producer-seq": "0"}, content=b"x").status_code == 200
    with streams_server(db) as url, httpx.Client(base_url=url, timeout=10) as http:
        duplicate = http.post(path, headers={**headers, "producer-seq": "0"}, content=b"x")
        assert duplicate.status_code == 204
        assert duplicate.headers["stream-next-offset"] == "0000000000000000_0000000000000001"
        stale = http.post(path, headers={**headers, "producer-epoch": "3", "producer-seq": "0"}, content=b"y")
        assert stale.status_code == 403
        assert http.post(path, headers={**headers, "producer-seq": "1"}, content=b"z").status_code == 200
        assert http.get(f"{path}?offset=-1").content == b"xz"


@pytest.mark.timeout(120)
def test_concurrent_unbatched_appends_are_group_committed_none_lost(tmp_path: Path) -> None:
    async def main() -> None:
        store = StreamStore(tmp_path / "streams.db")
        await store.start()
        server = await serve_asgi(StreamsApp(store))
        path = "/v1/stream/group"
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
                assert (await http.put(path, headers={"content-type": "application/json"})).status_code == 201
                before = store.commits

                async def writer(w: int) -> None:
                    for i in range(PER_WRITER):
                        body = f'{{"w":{w},"i":{i}}}'.encode()
                        answer = await http.post(path, headers={"content-type": "application/json"}, content=body)
                        assert answer.status_code == 204, answer.text

                await asyncio.gather(*(writer(w) for w in range(WRITERS)))
                commits = store.commits - before
                read = (await http.get(f"{path}?offset=-1")).json()
        finally:
            await server.close()
            await store.close()
        total = WRITERS * PER_WRITER
        assert len(read) == total
        for w in range(WRITERS):  # each writer's appends, once each, in its order
            assert [m["i"] for m in read if m["w"] == w] == list(range(PER_WRITER))
        assert commits < total * 0.75, f"{commits} transactions for {total} concurrent appends: no group commit"

        reopened = StreamStore(tmp_path / "streams.db")
        await reopened.start()
        try:
            stream = await reopened.get(path)
            assert stream is not None and len(stream.items) == total
        finally:
            await reopened.close()

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_an_append_waits_for_another_process_write_lock_instead_of_failing(tmp_path: Path) -> None:
    async def main() -> None:
        db = tmp_path / "streams.db"
        store = StreamStore(db)
        await store.start()
        server = await serve_asgi(StreamsApp(store))
        path = "/v1/stream/locked"
        other = sqlite3.connect(db, isolation_level=None)  # another writer of the same file (the runs, say)
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
                assert (await http.put(path, headers={"content-type": "text/plain"})).status_code == 201
                other.execute("BEGIN IMMEDIATE")
                append = asyncio.ensure_future(
                    http.post(path, headers={"content-type": "text/plain"}, content=b"after the lock")
                )
                await asyncio.sleep(0.5)
                assert not append.done(), "the append answered while another connection held the write lock"
                other.execute("COMMIT")
                answer = await append
                assert answer.status_code == 204, answer.text
                assert (await http.get(f"{path}?offset=-1")).content == b"after the lock"
        finally:
            other.close()
            await server.close()
            await store.close()

    asyncio.run(main())
