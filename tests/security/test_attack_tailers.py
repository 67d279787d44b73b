"""Hostile tailers of a live coordinator run (uvicorn in this process, so its tasks and fds are countable).

An SSE and a WebSocket tailer that never read (a tiny receive buffer, so the server's writes block)
must cost bounded memory and never slow a tailer that reads; 200 SSE tailers opened and dropped
mid-stream must leave no task and no fd behind once the run ended.
"""

from __future__ import annotations

import asyncio
import base64
import os
import resource
import socket
import sys
import time
from pathlib import Path

import httpx

from boxwright.coordinator import CoordinatorConfig, StoreSet
from boxwright.definition import define_sandbox
from boxwright.harnesses.command import CommandHarness
from boxwright.providers import local_process_sandbox
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from tests.support.coordinator import CLIENT_TOKEN, client_headers, coordinator_server, trigger, wait_record

LINES = 4000  # of ~1 KiB: ~4 MiB of events, far more than any socket buffer
# Prints its lines once the go file exists, so every tailer is connected before the first one.
AGENT = r"""
import os, sys, time
go = sys.argv[1]
deadline = time.time() + 120
while not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.01)
pad = "x" * 1000
LINES = int(sys.argv[2])
for i in range(LINES):
    print(f"line {i} {pad}", flush=True)
"""


def _config(tmp: Path, agent: str) -> CoordinatorConfig:
    db = open_database(tmp / "c.db")
    runs, events = sqlite_run_backend(db)
    return CoordinatorConfig(
        sandboxes={"local": define_sandbox("tailers", local_process_sandbox(base_dir=tmp / "sb"))},
        harnesses={"command": CommandHarness(command=agent)},
        stores=StoreSet(runs, events, SqliteLockStore(db), SqliteInstanceStore(db), close=db.close),
        client_token=CLIENT_TOKEN,
        inactivity_timeout=0,
    )


def _agent(tmp: Path) -> tuple[str, Path]:
    script = tmp / "agent.py"
    script.write_text(AGENT)
    go = tmp / "go"
    return f"{sys.executable} {script} {go} {LINES}", go


def _stuck_socket(url: str, request: bytes) -> socket.socket:
    """A connection that sends ``request`` and then never reads (its receive buffer as small as allowed)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(request)
    return sock


def _head(method_path: str, extra: str = "") -> bytes:
    return (
        f"{method_path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {CLIENT_TOKEN}\r\n{extra}\r\n"
    ).encode()


def _fds() -> dict[str, str]:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # the listing's own fd, closed meanwhile
    return out


def _server_side(fds: dict[str, str], port: int) -> dict[str, str]:
    """The fds that are the server's: every one but the TCP sockets of this process's own clients.

    A client's pooled keep-alive socket the server closed sits in CLOSE_WAIT until the pool next
    looks at it: that is the test's, not a leak of the server's.
    """
    rows = [r.split() for r in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    ours = {r[9] for r in rows if int(r[2].split(":")[1], 16) == port}  # remote port = the server's
    return {k: v for k, v in fds.items() if not (v.startswith("socket:[") and v[8:-1] in ours)}


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / (1 << 20)


async def _read_to_status(http: httpx.AsyncClient, path: str) -> int:
    """The text deltas an SSE tail reads until its status frame."""
    lines = 0
    async with http.stream("GET", path) as response:
        async for line in response.aiter_lines():
            lines += line.startswith("data:") and '"TEXT_MESSAGE_CONTENT"' in line
            if line.startswith("event: status"):
                break
    return lines


def test_tailers_that_never_read_cost_bounded_memory_and_never_slow_a_reader(tmp_path: Path) -> None:
    agent, go = _agent(tmp_path)

    async def main() -> None:
        async with (
            coordinator_server(_config(tmp_path, agent)) as (url, _),
            httpx.AsyncClient(base_url=url, timeout=60, headers=client_headers()) as http,
        ):
            # A first run read to its end with nobody stuck: what a reader alone costs (caches, the log).
            go.write_text("go")
            assert (await http.post("/runs", json=trigger("t-w", "go", "r-w"))).status_code == 202
            assert await _read_to_status(http, "/runs/r-w/events?threadId=t-w&offset=-1") >= LINES
            go.unlink()
            assert (await http.post("/runs", json=trigger("t-s", "go", "r-s"))).status_code == 202
            q = "?threadId=t-s&offset=-1"
            key = base64.b64encode(os.urandom(16)).decode()
            upgrade = f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            upgrade += "Sec-WebSocket-Version: 13\r\n"
            stuck = [
                _stuck_socket(url, _head(f"GET /runs/r-s/events{q}")),
                _stuck_socket(url, _head(f"GET /runs/r-s/stream{q}", upgrade)),
                _stuck_socket(url, _head(f"GET /runs/r-s/ws{q}", upgrade)),
            ]
            try:
                await asyncio.sleep(0.5)
                rss_before = _rss_mib()
                started = time.monotonic()
                go.write_text("go")
                lines = await _read_to_status(http, f"/runs/r-s/events{q}")
                reader_s = time.monotonic() - started
                grew = _rss_mib() - rss_before
            finally:
                for sock in stuck:
                    sock.close()
            assert lines >= LINES, lines
            print(f"\nreader beside 3 stuck tailers: {LINES} lines in {reader_s:.1f} s, RSS grew {grew:.1f} MiB")
            # The run's events are ~4 MiB per tailer: a server buffering them for the stuck ones would grow
            # by 3 x 4 MiB and more (they are JSON-framed twice over); bounded, it keeps a socket buffer each.
            assert grew < 8, f"RSS grew {grew:.1f} MiB while 3 tailers never read"
            assert reader_s < 60

    asyncio.run(main())


def test_200_tailers_dropped_mid_stream_leave_no_task_and_no_fd(tmp_path: Path) -> None:
    agent, go = _agent(tmp_path)

    async def main() -> None:
        async with (
            coordinator_server(_config(tmp_path, agent)) as (url, _),
            httpx.AsyncClient(base_url=url, timeout=60, headers=client_headers()) as http,
        ):
            # A first run, tailed to its end: what is made once (sse-starlette's shutdown watcher, the WAL).
            go.write_text("go")
            assert (await http.post("/runs", json=trigger("t-w", "go", "r-w"))).status_code == 202
            assert await _read_to_status(http, "/runs/r-w/events?threadId=t-w&offset=-1") >= LINES
            await asyncio.sleep(0.2)
            port = int(url.rsplit(":", 1)[1])
            tasks_before, fds_before = len(asyncio.all_tasks()), _server_side(_fds(), port)
            assert (await http.post("/runs", json=trigger("t-d", "go", "r-d"))).status_code == 202
            host = url.removeprefix("http://").split(":")[0]
            request = _head("GET /runs/r-d/events?threadId=t-d&offset=-1")

            async def drop(i: int) -> None:
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(request)
                await writer.drain()
                # Some hang up on the head, some mid-stream after reading a little.
                if i % 2:
                    await reader.read(1 + 97 * i)
                writer.transport.abort()

            for batch in range(4):
                await asyncio.gather(*(drop(batch * 50 + i) for i in range(50)))
            await wait_record(url, "r-d", "t-d", status=("completed",))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                tasks, fds = len(asyncio.all_tasks()), _server_side(_fds(), port)
                if tasks <= tasks_before and len(fds) <= len(fds_before):
                    break
                await asyncio.sleep(0.2)
            print(f"\n200 dropped tailers: tasks {tasks_before} -> {tasks}, fds {len(fds_before)} -> {len(fds)}")
            assert tasks <= tasks_before, "\n".join(repr(t.get_coro()) for t in asyncio.all_tasks())
            new = {k: v for k, v in fds.items() if fds_before.get(k) != v}
            where = [
                f"{table}: {line}"
                for table in ("tcp", "tcp6", "unix", "udp")
                for line in Path(f"/proc/net/{table}").read_text().splitlines()
                for v in new.values()
                if v.startswith("socket:[") and f" {v[8:-1]} " in f" {line} "
            ]
            assert len(fds) <= len(fds_before), (url, new, where)

    asyncio.run(main())
