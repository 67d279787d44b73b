"""``boxwright serve --streams``: the Durable Streams server standalone, under uvicorn."""

from __future__ import annotations

import os

import uvicorn

from boxwright.config import database_path
from boxwright.stores.sqlite import open_database, sqlite_run_backend
from boxwright.streams.app import StreamsApp, StreamsLimits
from boxwright.streams.runlog import RunStreams
from boxwright.streams.store import StreamStore
from boxwright.tool_bridge.guard import ServerLimits, guarded_protocol

# Read timeouts and a connection cap like every listener boxwright starts (tool_bridge.guard), with
# this server's own keep-alive; 1,024 connections leave room for SSE fan-out and long-polls.
STREAMS_SERVER_LIMITS = ServerLimits(keep_alive_timeout_s=75.0, max_connections=1024)


def streams_app(database: str | os.PathLike[str] | None = None, limits: StreamsLimits | None = None) -> StreamsApp:
    """The protocol app over SQLite at ``database`` (default: boxwright's database); starts on lifespan.

    ``/runs/{id}/stream`` serves the run logs of the same database read-only, so runs driven by
    other processes on that file can be tailed by any Durable Streams client.
    """
    path = database_path() if database is None else os.fspath(database)
    limits = limits or StreamsLimits()
    db = open_database(path)
    runs, log = sqlite_run_backend(db)
    run_streams = RunStreams(runs, log, long_poll_timeout=limits.long_poll_timeout, sse_max_age=limits.sse_max_age)
    return StreamsApp(StreamStore(path), limits, run_streams=run_streams, on_shutdown=db.close)


def serve_streams(host: str, port: int, *, database: str | None = None, limits: StreamsLimits | None = None) -> None:
    config = uvicorn.Config(
        streams_app(database, limits),
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
