"""``boxwright serve --streams``: the Durable Streams server standalone, under uvicorn."""

from __future__ import annotations

import os

import uvicorn

from boxwright.config import database_path
from boxwright.streams.app import StreamsApp, StreamsLimits
from boxwright.streams.store import StreamStore


def streams_app(database: str | os.PathLike[str] | None = None, limits: StreamsLimits | None = None) -> StreamsApp:
    """The protocol app over SQLite at ``database`` (default: boxwright's database); starts on lifespan."""
    return StreamsApp(StreamStore(database_path() if database is None else database), limits)


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
    )
    uvicorn.Server(config).run()
