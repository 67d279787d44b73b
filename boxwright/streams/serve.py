"""``boxwright serve --streams [--store URL]``: the Durable Streams server standalone, under uvicorn."""

from __future__ import annotations

import os

import uvicorn

from boxwright.config import database_path
from boxwright.stores.open import REDIS_SCHEMES, open_store, sqlite_path
from boxwright.streams.app import StreamsApp, StreamsLimits
from boxwright.streams.runlog import RunStreams
from boxwright.streams.store import StreamPersistence, StreamStore
from boxwright.tool_bridge.guard import ServerLimits, guarded_protocol

# Read timeouts and a connection cap like every listener boxwright starts (tool_bridge.guard), with
# this server's own keep-alive; 1,024 connections leave room for SSE fan-out and long-polls.
STREAMS_SERVER_LIMITS = ServerLimits(keep_alive_timeout_s=75.0, max_connections=1024)


def streams_app(
    database: str | os.PathLike[str] | None = None,
    limits: StreamsLimits | None = None,
    *,
    store: str | None = None,
) -> StreamsApp:
    """The protocol app over ``store`` (a store URL: ``sqlite:///PATH`` or ``redis://HOST:PORT/DB``), or over
    SQLite at ``database`` (default: boxwright's database); starts on lifespan.

    ``/runs/{id}/stream`` serves the run logs of the same store read-only, so runs driven by
    other processes (or, on Redis, other hosts) can be tailed by any Durable Streams client.
    """
    limits = limits or StreamsLimits()
    url = (
        store
        if store is not None
        else f"sqlite:///{os.path.abspath(database_path() if database is None else database)}"
    )
    stores = open_store(url)
    run_streams = RunStreams(
        stores.runs, stores.events, long_poll_timeout=limits.long_poll_timeout, sse_max_age=limits.sse_max_age
    )
    persistence: StreamPersistence | str
    if url.startswith(REDIS_SCHEMES):
        from boxwright.streams.redis_store import RedisStreamPersistence

        persistence = RedisStreamPersistence(url)
    else:
        persistence = sqlite_path(url)
    return StreamsApp(StreamStore(persistence), limits, run_streams=run_streams, on_shutdown=stores.close)


def serve_streams(
    host: str,
    port: int,
    *,
    database: str | None = None,
    limits: StreamsLimits | None = None,
    store: str | None = None,
) -> None:
    config = uvicorn.Config(
        streams_app(database, limits, store=store),
        host=host,
        port=port,
        lifespan="on",
        log_level="warning",
        access_log=False,
        # Live SSE readers would otherwise hold a shutdown open for their whole max age.
        timeout_graceful_shutdown=2,
        # Longer than clients' idle reuse: with uvicorn's 5 s default, undici reuses a socket just as
        # the server closes it ("other side closed"); Node servers say "Keep-Alive: timeout=5", uvicorn does not.
        timeout_keep_alive=75,
        http=guarded_protocol(STREAMS_SERVER_LIMITS),
    )
    uvicorn.Server(config).run()
