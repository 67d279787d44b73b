"""A tiny TCP proxy on 127.0.0.1 that forwards each connection to the first upstream that accepts it.

    with failover_proxy([a_port, b_port]) as proxy:
        ...  # proxy.url is a deployment's public origin; proxy.accepted[b_port] counts what reached B

It stands for the load balancer in front of coordinator replicas in active/passive failover: while
replica A is alive every connection goes to A; once A is dead (its port refuses), to B. Bytes are
relayed as they come, both ways, so HTTP keep-alive, SSE and chunked bodies pass untouched; a
connection whose upstream dies is closed, and the client's next one goes to the next upstream.
The proxy runs its own event loop in a daemon thread, so synchronous tests can use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator, Sequence

from tests.support.replicas import free_port

HOST = "127.0.0.1"
CONNECT_TIMEOUT_S = 2.0
_CHUNK = 65536


class FailoverProxy:
    """See the module doc; ``accepted`` counts connections by the upstream port they went to."""

    def __init__(self, upstreams: Sequence[int], port: int | None = None) -> None:
        self.upstreams = list(upstreams)
        self.port = port or free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.accepted: dict[int, int] = dict.fromkeys(self.upstreams, 0)
        self.refused = 0  # connections no upstream took
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="failover-proxy", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, HOST, self.port)

    async def _connect(self) -> tuple[int, asyncio.StreamReader, asyncio.StreamWriter] | None:
        for port in self.upstreams:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError):
                continue
            return port, reader, writer
        return None

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            upstream = await self._connect()
            if upstream is None:
                self.refused += 1
                return
            port, reader, writer = upstream
            self.accepted[port] += 1
            try:
                # Either direction ending ends the connection: a dead upstream must not leave the client waiting.
                pumps = [
                    asyncio.ensure_future(_pump(client_reader, writer)),
                    asyncio.ensure_future(_pump(reader, client_writer)),
                ]
                try:
                    await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for pump in pumps:
                        pump.cancel()
                    await asyncio.gather(*pumps, return_exceptions=True)
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
        finally:
            client_writer.close()
            with contextlib.suppress(Exception):
                await client_writer.wait_closed()
            self._tasks.discard(task)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def close(self) -> None:
        if not self._loop.is_running():
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while chunk := await reader.read(_CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # a half-close passes through: the other direction may still be talking


@contextlib.contextmanager
def failover_proxy(upstreams: Sequence[int], port: int | None = None) -> Iterator[FailoverProxy]:
    proxy = FailoverProxy(upstreams, port)
    try:
        yield proxy
    finally:
        proxy.close()
