"""Durable Streams (https://github.com/durable-streams/durable-streams) served by boxwright.

``StreamsApp`` is the protocol as an ASGI app over a ``StreamStore`` (SQLite, group-committed);
``run_stream_response`` serves one run's event log as a read-only JSON stream.
"""

from boxwright.streams.app import StreamsApp, StreamsLimits
from boxwright.streams.store import StreamStore

__all__ = ["StreamStore", "StreamsApp", "StreamsLimits"]
