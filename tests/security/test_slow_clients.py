"""Slow, idle, half-open and too many connections to the servers boxwright starts (issue 9, point 6).

Real sockets to real listeners under uvicorn on 127.0.0.1 (``start_host_tool_bridge``, and
``serve_tool_exec`` for tool-exec), with the shipped ``ServerLimits`` defaults: a stalled client is
closed within seconds of its deadline, a connection over a cap gets a 503 at once, and the same
listener answers a normal ``tools/call`` right after.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from boxwright.tool_bridge import (
    ServerLimits,
    ToolExecRun,
    serve_tool_exec,
    start_host_tool_bridge,
    tool,
    tool_exec_path,
)
from tests.support.streams import streams_server

pytestmark = pytest.mark.integration

LIMITS = ServerLimits()  # the defaults: what every listener gets unless told otherwise
# Slack on top of a deadline: the loop may be slowed by other tests on a shared machine.
SLACK_S = 3.0
ACCEPT = {"Accept": "application/json, text/event-stream"}


@tool
def echo(text: str) -> str:
    return text


def call_body(text: str) -> bytes:
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": text}},
    }
    return json.dumps(message).encode()


@dataclass
class Listener:
    """One listener and what a client needs to call it: a URL path, a token and a request body."""

    host: str
    port: int
    path: str
    token: str
    body: bytes

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.path}"

    def head(self, length: int | None = None) -> bytes:
        return (
            f"POST {self.path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n"
            f"authorization: Bearer {self.token}\r\ncontent-type: application/json\r\n"
            f"accept: application/json\r\ncontent-length: {len(self.body) if length is None else length}\r\n\r\n"
        ).encode()

    async def normal_call(self) -> None:
        """A well-behaved client, on a connection of its own: the listener still serves."""
        async with httpx.AsyncClient(timeout=10) as http:
            headers = {**ACCEPT, "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
            response = await http.post(self.url, content=self.body, headers=headers)
        assert response.status_code == 200, response.text
        assert b"hello" in response.content


@contextlib.asynccontextmanager
async def bridge_listener() -> AsyncIterator[Listener]:
    async with await start_host_tool_bridge() as bridge:
        registration = bridge.register(f"slow-{secrets.token_hex(4)}", [echo])
        path = registration.url.split(str(bridge.port), 1)[1]
        yield Listener(bridge.host, bridge.port, path, registration.token, call_body("hello"))


@contextlib.asynccontextmanager
async def tool_exec_listener() -> AsyncIterator[Listener]:
    token = secrets.token_hex(24)
    async with await serve_tool_exec({"r1": ToolExecRun(tools=[echo], token=token)}) as server:
        yield Listener(
            server.host, server.port, tool_exec_path("r1"), token, b'{"name":"echo","args":{"text":"hello"}}'
        )


LISTENERS = {"bridge": bridge_listener, "tool-exec": tool_exec_listener}


async def read_until_closed(reader: asyncio.StreamReader, within_s: float) -> bytes:
    """Everything the server sends until it closes; fails if it has not closed within ``within_s``."""
    data = b""
    deadline = time.monotonic() + within_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"the server kept the connection open past {within_s} s (got {data[:80]!r})")
        try:
            chunk = await asyncio.wait_for(reader.read(65536), remaining)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


async def open_raw(listener: Listener) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(listener.host, listener.port)


async def trickle(writer: asyncio.StreamWriter, reader: asyncio.StreamReader, data: bytes, every_s: float) -> None:
    """``data`` a byte at a time, ``every_s`` apart, until it is sent or the server hangs up."""
    for byte in data:
        if reader.at_eof() or writer.is_closing():
            return
        writer.write(bytes([byte]))
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        await asyncio.sleep(every_s)


# -- slow and idle clients ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(LISTENERS))
@pytest.mark.parametrize("after_a_request", [False, True], ids=["first-request", "keep-alive-request"])
def test_a_header_sent_a_byte_a_second_is_answered_408_and_closed(kind: str, after_a_request: bool) -> None:
    async def main() -> None:
        async with LISTENERS[kind]() as listener:
            reader, writer = await open_raw(listener)
            if after_a_request:
                # The deadline is re-armed for every request on a kept-alive connection.
                writer.write(listener.head() + listener.body)
                response = await reader.readuntil(b"\r\n\r\n")
                assert response.startswith(b"HTTP/1.1 200"), response
                length = int(response.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
            started = time.monotonic()
            sender = asyncio.ensure_future(trickle(writer, reader, listener.head(), every_s=1.0))
            try:
                answer = await read_until_closed(reader, LIMITS.header_timeout_s + SLACK_S)
            finally:
                sender.cancel()
                writer.close()
            elapsed = time.monotonic() - started
            assert answer.startswith(b"HTTP/1.1 408"), answer
            assert elapsed >= LIMITS.header_timeout_s - 0.5  # the head deadline, not something else
            await listener.normal_call()

    asyncio.run(main())


@pytest.mark.parametrize("kind", list(LISTENERS))
def test_a_body_sent_a_byte_a_second_is_cut_off(kind: str) -> None:
    async def main() -> None:
        async with LISTENERS[kind]() as listener:
            reader, writer = await open_raw(listener)
            writer.write(listener.head(length=10_000))
            started = time.monotonic()
            sender = asyncio.ensure_future(trickle(writer, reader, b"x" * 10_000, every_s=1.0))
            try:
                answer = await read_until_closed(reader, LIMITS.body_timeout_s + SLACK_S)
            finally:
                sender.cancel()
                writer.close()
            assert time.monotonic() - started >= LIMITS.body_timeout_s - 0.5
            assert not answer.startswith(b"HTTP/1.1 200"), answer
            await listener.normal_call()

    asyncio.run(main())


def test_an_idle_keep_alive_connection_is_closed() -> None:
    async def main() -> None:
        async with bridge_listener() as listener:
            reader, writer = await open_raw(listener)
            writer.write(listener.head() + listener.body)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200") and b"connection: close" not in head.lower()
            started = time.monotonic()
            rest = await read_until_closed(reader, LIMITS.keep_alive_timeout_s + SLACK_S)
            writer.close()
            assert b"hello" in rest
            assert time.monotonic() - started >= LIMITS.keep_alive_timeout_s - 1.0
            await listener.normal_call()

    asyncio.run(main())


def test_a_half_open_connection_is_closed_at_the_head_deadline() -> None:
    async def main() -> None:
        async with bridge_listener() as listener:
            reader, writer = await open_raw(listener)
            writer.write(listener.head()[:20])  # half a request line, then the client goes silent
            await writer.drain()
            started = time.monotonic()
            answer = await read_until_closed(reader, LIMITS.header_timeout_s + SLACK_S)
            writer.close()
            assert answer.startswith(b"HTTP/1.1 408"), answer
            assert time.monotonic() - started >= LIMITS.header_timeout_s - 0.5
            await listener.normal_call()

    asyncio.run(main())


def test_an_endless_head_is_answered_431_and_closed() -> None:
    async def main() -> None:
        async with bridge_listener() as listener:
            reader, writer = await open_raw(listener)
            head = listener.head()
            filler = b"".join(b"x-pad-%d: %s\r\n" % (i, b"y" * 1000) for i in range(200))  # 200 kB of headers
            writer.write(head[: head.index(b"\r\n") + 2] + filler)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            answer = await read_until_closed(reader, 5.0)
            writer.close()
            assert answer.startswith(b"HTTP/1.1 431"), answer[:80]
            await listener.normal_call()

    asyncio.run(main())


def test_boxwright_serve_streams_closes_a_slow_head_too(tmp_path: Path) -> None:
    """``boxwright serve --streams`` (a real process) has the same guard, with its own keep-alive."""

    async def main(url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        started = time.monotonic()
        sender = asyncio.ensure_future(trickle(writer, reader, b"GET /s HTTP/1.1\r\nhost: x\r\n\r\n", every_s=1.0))
        try:
            answer = await read_until_closed(reader, LIMITS.header_timeout_s + SLACK_S)
        finally:
            sender.cancel()
            writer.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert time.monotonic() - started >= LIMITS.header_timeout_s - 0.5
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(url + "/no-such-stream")).status_code == 404

    with streams_server(tmp_path / "streams.db") as url:
        asyncio.run(main(url))


# -- too many connections -------------------------------------------------------------------------


def test_300_idle_connections_hit_the_cap_get_503_and_are_all_closed() -> None:
    count = 300
    over = count - LIMITS.max_connections

    async def main() -> None:
        async with bridge_listener() as listener:
            opened = [await open_raw(listener) for _ in range(count)]
            started = time.monotonic()
            reads = [asyncio.ensure_future(read_until_closed(r, LIMITS.header_timeout_s + SLACK_S)) for r, _ in opened]
            try:
                # Over the cap: a 503 at once, never a hang.
                done, _ = await asyncio.wait(reads, timeout=2.0)
                assert len(done) >= over, f"{len(done)} of {count} closed at once; expected at least {over}"
                assert all(task.result().startswith(b"HTTP/1.1 503") for task in done)
                # A new client while the cap is full gets the 503 too, at once.
                extra_reader, extra_writer = await open_raw(listener)
                assert (await read_until_closed(extra_reader, 2.0)).startswith(b"HTTP/1.1 503")
                extra_writer.close()
                # The ones within the cap never sent a request: closed at the head deadline, all of them.
                answers = await asyncio.gather(*reads)
                assert time.monotonic() - started <= LIMITS.header_timeout_s + SLACK_S
                busy = sum(a.startswith(b"HTTP/1.1 503") for a in answers)
                timed_out = sum(a.startswith(b"HTTP/1.1 408") for a in answers)
                assert busy >= over and busy + timed_out == count, (busy, timed_out)
            finally:
                for task in reads:
                    task.cancel()
                for _, writer in opened:
                    writer.close()
            await listener.normal_call()

    asyncio.run(main())


def test_one_run_token_cannot_hold_more_than_its_requests_in_flight() -> None:
    limit = LIMITS.max_requests_per_run
    release = asyncio.Event()
    inside = 0

    @tool
    async def hold() -> str:
        nonlocal inside
        inside += 1
        await release.wait()
        return "held"

    async def main() -> None:
        nonlocal inside
        async with await start_host_tool_bridge() as bridge:
            greedy = bridge.register("greedy", [hold])
            other = bridge.register("other", [echo])
            message: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "hold"}}
            pool = httpx.Limits(max_connections=limit + 8, max_keepalive_connections=limit + 8)
            async with httpx.AsyncClient(timeout=30, limits=pool) as http:
                headers = {**ACCEPT, **greedy.headers}
                held = [
                    asyncio.ensure_future(http.post(greedy.url, json=message, headers=headers)) for _ in range(limit)
                ]
                deadline = time.monotonic() + 20
                while inside < limit and time.monotonic() < deadline:  # noqa: ASYNC110 - a counter, polled
                    await asyncio.sleep(0.02)
                assert inside == limit
                started = time.monotonic()
                refused = await http.post(greedy.url, json=message, headers=headers)
                assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
                assert time.monotonic() - started < 2.0
                # Another run on the same listener is not affected.
                answer = await http.post(
                    other.url,
                    content=call_body("hello"),
                    headers={**ACCEPT, **other.headers, "Content-Type": "application/json"},
                )
                assert answer.status_code == 200
                release.set()
                assert [r.status_code for r in await asyncio.gather(*held)] == [200] * limit
                # Slots come back when requests end.
                again = await http.post(greedy.url, json=message, headers=headers)
                assert again.status_code == 200

    asyncio.run(main())


# -- WebSocket upgrades on listeners that serve none ---------------------------------------------


def _upgrade_head(listener: Listener, padding: int) -> bytes:
    """A WebSocket handshake to ``listener``'s path with ``padding`` bytes of header (past websockets' 8 KiB
    line limit, the handshake cannot be parsed: uvicorn then answered nothing and held the socket open)."""
    return (
        f"GET {listener.path} HTTP/1.1\r\nhost: {listener.host}:{listener.port}\r\n"
        "upgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        f"sec-websocket-version: 13\r\nx-pad: {'a' * padding}\r\n\r\n"
    ).encode()


@pytest.mark.parametrize("kind", list(LISTENERS))
def test_websocket_upgrades_cannot_hold_the_listeners_connections(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    """The agent reaches these listeners: its upgrade requests, plain or unparseable, are answered as HTTP
    (no 101) and end, so a connection cap's worth of them (and more) leaves the listener serving every run,
    and none writes to the host's log."""

    async def main() -> None:
        async with LISTENERS[kind]() as listener:
            for padding in (16, 9000):
                reader, writer = await open_raw(listener)
                writer.write(_upgrade_head(listener, padding))
                answer = await asyncio.wait_for(reader.read(200), 10)
                writer.close()
                assert answer.startswith(b"HTTP/1.1 4"), (padding, answer)
            # More unparseable handshakes than the cap, all sent before any is answered.
            opened = [await open_raw(listener) for _ in range(LIMITS.max_connections + 20)]
            for _reader, writer in opened:
                writer.write(_upgrade_head(listener, 9000))
            answers = await asyncio.gather(*(asyncio.wait_for(r.read(200), 30) for r, _ in opened))
            for _reader, writer in opened:
                writer.close()
            assert not any(a.startswith(b"HTTP/1.1 101") for a in answers)
            assert all(a.startswith(b"HTTP/1.1 ") for a in answers), [a[:40] for a in answers if not a][:3]
            await listener.normal_call()

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    assert "upgrade" not in caplog.text.lower(), caplog.text[-500:]
