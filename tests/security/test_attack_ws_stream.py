"""Hostile WebSocket clients of the coordinator's tails (``WS /runs/{id}/stream`` and ``/ws``).

Most cases run against ``boxwright serve`` (a real process: its uvicorn, its WebSocket protocol,
its RSS and fds readable from /proc); the auth hook's run against the app under uvicorn in this
process, with a hook of the test's own. Every case ends in a status code or a close code with a
reason, and after it the server answers ``/healthz`` and a plain tailer reads every event of the run.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import resource
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import HTTPConnection
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from boxwright.coordinator import AuthScope, CoordinatorConfig, StoreSet
from boxwright.definition import define_sandbox
from boxwright.harnesses.command import CommandHarness
from boxwright.providers import local_process_sandbox
from boxwright.stores.sqlite import SqliteInstanceStore, SqliteLockStore, open_database, sqlite_run_backend
from tests.support.coordinator import (
    CLIENT_TOKEN,
    CoordinatorProcess,
    client_headers,
    coordinator_server,
    scripted_agent,
    trigger,
    wait_record,
)

pytestmark = pytest.mark.integration

LINES = 30  # the finished run's text lines: every tailer must read all of them
SOCKET_TIMEOUT_S = 10.0  # any answer a raw client waits for; a hang fails the case instead of the suite


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    tmp = tmp_path_factory.mktemp("ws-attack")
    process = CoordinatorProcess("ws-attack", tmp, scripted_agent(tmp))
    try:
        assert process.post("/runs", trigger("t-done", f"lines {LINES} 0", "r-done")).status_code == 202
        assert process.post("/runs", trigger("t-other", "lines 2 0", "r-other")).status_code == 202
        asyncio.run(wait_record(process.url, "r-done", "t-done", status=("completed",)))
        asyncio.run(wait_record(process.url, "r-other", "t-other", status=("completed",)))
        yield process
    finally:
        process.close()


# -- raw clients ----------------------------------------------------------------------------------


def _handshake(
    path: str, *, extra: str = "", key: str | None = "", version: str | None = "13", auth: bool = True
) -> bytes:
    """A WebSocket upgrade request for ``path``; ``key=None`` / ``version=None`` leave that header out."""
    head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    if key is not None:
        head += f"Sec-WebSocket-Key: {key or base64.b64encode(os.urandom(16)).decode()}\r\n"
    if version is not None:
        head += f"Sec-WebSocket-Version: {version}\r\n"
    if auth:
        head += f"Authorization: Bearer {CLIENT_TOKEN}\r\n"
    return (head + extra + "\r\n").encode()


def _connect(url: str, *, rcvbuf: int | None = None) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(SOCKET_TIMEOUT_S)
    sock.connect((host, int(port)))
    return sock


def _answer(url: str, request: bytes) -> tuple[int, bytes]:
    """The status and body the server answers ``request`` with (raises on a hang)."""
    with _connect(url) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"closed without an answer: {data!r}"
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status == 101:
            return status, body
        length = next(
            (int(v) for k, _, v in (h.partition(b":") for h in head.split(b"\r\n")) if k.lower() == b"content-length"),
            0,
        )
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        return status, body


def _frame(opcode: int, payload: bytes, *, fin: bool = True) -> bytes:
    """One client frame (clients must mask)."""
    mask = os.urandom(4)
    first = (0x80 if fin else 0) | opcode
    size = len(payload)
    if size < 126:
        head = bytes([first, 0x80 | size])
    elif size < 1 << 16:
        head = bytes([first, 0x80 | 126]) + struct.pack("!H", size)
    else:
        head = bytes([first, 0x80 | 127]) + struct.pack("!Q", size)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + masked


def _frame_head(opcode: int, size: int) -> bytes:
    """The head of a masked frame that declares ``size`` bytes of payload (none follows)."""
    return bytes([0x80 | opcode, 0x80 | 127]) + struct.pack("!Q", size) + os.urandom(4)


def _ws_url(server: CoordinatorProcess, path: str) -> str:
    return server.url.replace("http://", "ws://") + path


async def _read_all(ws: ClientConnection) -> list[dict[str, Any]]:
    frames = []
    with pytest.raises(ConnectionClosed):
        while True:
            frames.append(json.loads(await asyncio.wait_for(ws.recv(), SOCKET_TIMEOUT_S)))
    return frames


async def _tail(server: CoordinatorProcess, run_id: str = "r-done", thread_id: str = "t-done") -> list[dict[str, Any]]:
    """A well-behaved tailer's frames of ``run_id``, checked whole: every seq once, in order, then the status."""
    url = _ws_url(server, f"/runs/{run_id}/stream?threadId={thread_id}")
    async with connect(url, additional_headers=client_headers(), open_timeout=SOCKET_TIMEOUT_S) as ws:
        frames = await _read_all(ws)
        assert (ws.close_code, ws.close_reason) == (1000, "run complete")
    seqs = [f["seq"] for f in frames[:-1]]
    assert seqs == list(range(len(seqs))), seqs
    assert frames[-1]["type"] == "status" and frames[-1]["record"]["lastSeq"] == seqs[-1]
    return frames


def _text_lines(frames: list[dict[str, Any]]) -> int:
    return sum(f.get("chunk", {}).get("type") == "TEXT_MESSAGE_CONTENT" for f in frames)


def _healthy(server: CoordinatorProcess) -> None:
    assert server.get("/healthz").json()["ok"] is True
    assert _text_lines(asyncio.run(_tail(server))) == LINES


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / (1 << 20)


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# -- handshakes -----------------------------------------------------------------------------------


def test_a_handshake_websockets_cannot_parse_is_answered_not_left_hanging(server: CoordinatorProcess) -> None:
    q = "?threadId=t-done"
    # Lines over websockets' 8 KiB, or too many of them: uvicorn used to drop websockets' answer and hold the socket.
    cases = {
        "a 20 KiB header line": (_handshake(f"/runs/r-done/stream{q}", extra=f"X-Pad: {'a' * 20_000}\r\n"), 431),
        "200 headers": (_handshake(f"/runs/r-done/stream{q}", extra="".join(f"X-{i}: v\r\n" for i in range(200))), 431),
        "a 60 KiB path": (_handshake(f"/runs/{'a' * 60_000}/stream{q}"), 414),
        "a 50 KiB lastSeq": (_handshake(f"/runs/r-done/stream{q}&lastSeq={'9' * 50_000}"), 414),
    }
    for name, (request, expected) in cases.items():
        status, _ = _answer(server.url, request)
        assert status == expected, name
    _healthy(server)


def test_malformed_handshake_headers_get_a_400_naming_them(server: CoordinatorProcess) -> None:
    path = "/runs/r-done/stream?threadId=t-done"
    cases = {
        "two versions": (_handshake(path, extra="Sec-WebSocket-Version: 8\r\n"), b"Sec-WebSocket-Version"),
        "version 8": (_handshake(path, version="8"), b"Sec-WebSocket-Version"),
        "no version": (_handshake(path, version=None), b"Sec-WebSocket-Version"),
        "a short key": (_handshake(path, key="c2hvcnQ="), b"Sec-WebSocket-Key"),
        "a key that is not base64": (_handshake(path, key="!!!!"), b"Sec-WebSocket-Key"),
        "no key": (_handshake(path, key=None), b"Sec-WebSocket-Key"),
        "two keys": (
            _handshake(path, extra=f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\n"),
            b"Sec-WebSocket-Key",
        ),
    }
    for name, (request, named) in cases.items():
        status, body = _answer(server.url, request)
        assert status in (400, 426), (name, status, body)
        assert named in body, (name, body)
    # A Sec-WebSocket-Key header on a plain request (a proxy dropped the Upgrade) is told so, not streamed.
    plain = f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CLIENT_TOKEN}\r\nSec-WebSocket-Key: a\r\n\r\n"
    assert _answer(server.url, plain.encode()) == (
        426,
        b'{"error":"expected websocket upgrade","code":"upgrade_required"}',
    )
    _healthy(server)


def test_an_offered_subprotocol_is_not_chosen_and_the_tail_goes_on(server: CoordinatorProcess) -> None:
    async def main() -> None:
        url = _ws_url(server, "/runs/r-done/stream?threadId=t-done")
        async with connect(url, additional_headers={**client_headers(), "Sec-WebSocket-Protocol": "evil, x"}) as ws:
            assert ws.subprotocol is None
            frames = await _read_all(ws)
        assert _text_lines(frames) == LINES and frames[-1]["type"] == "status"

    asyncio.run(main())


BAD_CURSORS = {
    "lastSeq=-2": "below -1",
    "lastSeq=" + "1" + "0" * 30: "10^30",
    "lastSeq=%202": "outer whitespace",
    "lastSeq=2%20": "outer whitespace",
    "lastSeq=%2B2": "a sign",
    "lastSeq=1_0": "an underscore",
    "lastSeq=%D9%A3": "an Arabic-Indic digit three",
    "lastSeq=%C3%A9": "non-ASCII",
    "lastSeq=": "empty",
    "lastSeq=1e3": "a float",
    "offset=a%00b": "NUL",
    "offset=-2": "not an offset",
    "offset=now%20": "outer whitespace",
    "offset=" + "9" * 4000: "4,000 digits",
}


def test_cursors_no_log_issued_are_refused_with_400_before_the_handshake(server: CoordinatorProcess) -> None:
    other = server.get("/runs/r-other/poll?threadId=t-other&offset=-1").json()["events"][0]["offset"]
    past = server.get("/runs/r-done/poll?threadId=t-done&offset=-1").json()["nextOffset"]
    cursors = {**BAD_CURSORS, f"offset={other}": "another run's offset", f"lastSeq={10**6}": "past the tail"}
    cursors[f"offset={past[:-1]}{int(past[-1]) + 1}"] = "one past the tail"
    for route in ("stream", "ws"):
        for cursor, what in cursors.items():
            status, body = _answer(server.url, _handshake(f"/runs/r-done/{route}?threadId=t-done&{cursor}"))
            if route == "ws":
                # /ws speaks in close codes after accept: 4400 and the reason.
                assert status == 101, (cursor, what)
                code, reason = asyncio.run(_closed_with(server, f"/runs/r-done/ws?threadId=t-done&{cursor}"))
                assert code == 4400 and reason.startswith("invalid offset"), (cursor, what, code, reason)
                continue
            assert status == 400, (cursor, what, body)
            answer = json.loads(body)
            assert answer["code"] == "invalid_offset" and len(answer["error"]) < 300, (cursor, answer)
            assert b"TEXT_MESSAGE" not in body
    # The same values that are good resume where they say.
    frames = asyncio.run(_tail_from(server, "lastSeq=3"))
    assert frames[0]["seq"] == 4


async def _closed_with(server: CoordinatorProcess, path: str) -> tuple[int | None, str]:
    async with connect(_ws_url(server, path), additional_headers=client_headers()) as ws:
        frames = await _read_all(ws)
        assert frames == [], frames
        return ws.close_code, ws.close_reason or ""


async def _tail_from(server: CoordinatorProcess, cursor: str) -> list[dict[str, Any]]:
    url = _ws_url(server, f"/runs/r-done/stream?threadId=t-done&{cursor}")
    async with connect(url, additional_headers=client_headers()) as ws:
        return await _read_all(ws)


def test_route_refusals_keep_their_own_status_on_a_websocket(server: CoordinatorProcess) -> None:
    for route in ("stream", "ws"):
        cases = {
            f"/runs/r-done/{route}": (400, "thread_id_required"),
            f"/runs/r-done/{route}?threadId=t-other": (404, "unknown_run"),
            f"/runs/r-nobody/{route}?threadId=t-done": (404 if route == "stream" else 101, "unknown_run"),
        }
        for path, (expected, code) in cases.items():
            status, body = _answer(server.url, _handshake(path))
            assert status == expected, (path, status, body)
            if status != 101:
                assert json.loads(body)["code"] == code, (path, body)
        anonymous = _answer(server.url, _handshake(f"/runs/r-done/{route}?threadId=t-done", auth=False))
        assert anonymous == (401, b'{"error":"unauthorized","code":"unauthorized"}'), anonymous
        wrong = _handshake(f"/runs/r-done/{route}?threadId=t-done", auth=False, extra="Authorization: Bearer nope\r\n")
        assert _answer(server.url, wrong) == (403, b'{"error":"forbidden","code":"forbidden"}')
    _healthy(server)


def test_200_concurrent_handshakes_to_an_unknown_run_each_get_404_and_leave_nothing(
    server: CoordinatorProcess,
) -> None:
    pid = server.proc.pid
    fds_before = _fd_count(pid)
    errors_before = server.stderr().count("ERROR")
    host, port = server.url.removeprefix("http://").split(":")

    async def one(i: int) -> int:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(_handshake(f"/runs/r-unknown-{i % 7}/stream?threadId=t-done"))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), SOCKET_TIMEOUT_S)
            return int(head.split(b" ", 2)[1])
        finally:
            writer.close()

    async def main() -> list[int]:
        return await asyncio.gather(*(one(i) for i in range(200)))

    assert set(asyncio.run(main())) == {404}
    deadline = time.monotonic() + 30
    while _fd_count(pid) > fds_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _fd_count(pid) <= fds_before, (fds_before, _fd_count(pid))
    assert server.get("/healthz").json() == {"ok": True, "driving": 0}
    # A refusal that went as meant is no error: 200 of them must not write 200 ERROR lines.
    assert server.stderr().count("ERROR") == errors_before, server.stderr()[-2000:]
    _healthy(server)


# -- what a client does once connected ------------------------------------------------------------


def test_a_client_flooding_pings_without_reading_costs_bounded_memory(server: CoordinatorProcess) -> None:
    pid = server.proc.pid
    sock = _connect(server.url, rcvbuf=4096)
    try:
        sock.sendall(_handshake("/runs/r-done/stream?threadId=t-done"))
        time.sleep(0.3)
        before = _rss_mib(pid)
        pings = _frame(0x9, b"p" * 125) * 1000
        sent = 0
        while sent < 40_000_000:
            sock.sendall(pings)  # a server that stopped reading would time this out
            sent += len(pings)
        time.sleep(0.5)
        grew = _rss_mib(pid) - before
    finally:
        sock.close()
    print(f"\n{sent / 1e6:.0f} MB of pings never read: server RSS grew {grew:.1f} MiB")
    # Answered one by one they are 40 MB of pongs held in the server (it grew by 34 MiB so).
    assert grew < 8, f"server RSS grew {grew:.1f} MiB"
    _healthy(server)


def test_frames_a_client_sends_on_a_push_stream_are_ignored(server: CoordinatorProcess) -> None:
    async def chatty(kind: str) -> list[dict[str, Any]]:
        url = _ws_url(server, "/runs/r-done/stream?threadId=t-done")
        async with connect(url, additional_headers=client_headers(), ping_interval=None) as ws:
            if kind == "text":
                for i in range(100):
                    await ws.send(f"hello {i}")
            elif kind == "binary":
                for _ in range(100):
                    await ws.send(os.urandom(1000))
            elif kind == "fragmented":
                await ws.send(iter(["a" * 10_000] * 50))
            elif kind == "pings":
                for _ in range(500):
                    await ws.ping()
            elif kind == "a close first":
                pass
            frames = await _read_all(ws)
            assert (ws.close_code, ws.close_reason) == (1000, "run complete"), kind
        return frames

    async def main() -> None:
        kinds = ["text", "binary", "fragmented", "pings"]
        results = await asyncio.gather(*(chatty(kind) for kind in kinds), _tail(server))
        for kind, frames in zip([*kinds, "reader"], results, strict=True):
            assert _text_lines(frames) == LINES, kind
            assert frames[-1]["type"] == "status", kind

    asyncio.run(main())
    _healthy(server)


def _server_frames(sock: socket.socket, then: bytes) -> Iterator[tuple[int, bytes]]:
    """``(opcode, payload)`` of what the server sends after its 101, until it closes; ``then`` is sent after the 101.

    Not before it: bytes that share the handshake's packet are dropped by uvicorn (RFC 6455 has a client wait).
    """
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, data = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    sock.sendall(then)

    def need(count: int) -> bytes:
        nonlocal data
        while len(data) < count:
            chunk = sock.recv(65536)
            if not chunk:
                raise EOFError
            data += chunk
        taken, data = data[:count], data[count:]
        return taken

    with contextlib.suppress(EOFError):
        while True:
            first, second = need(2)
            size = second & 0x7F
            if size == 126:
                size = struct.unpack("!H", need(2))[0]
            elif size == 127:
                size = struct.unpack("!Q", need(8))[0]
            yield first & 0x0F, need(size)


def test_messages_a_tail_cannot_take_close_it_with_their_code(server: CoordinatorProcess) -> None:
    # A live run, so the tail is still open when the message lands (a finished one closes 1000 first).
    assert server.post("/runs", trigger("t-live", "quiet 60", "r-live")).status_code == 202
    logged_before = server.stderr().count("Traceback")
    try:
        asyncio.run(wait_record(server.url, "r-live", "t-live", status=("running",)))
        path = "/runs/r-live/stream?threadId=t-live"
        cases = {
            # Only the head of a frame over the cap: its declared length is refused before any payload is read.
            "a message over the 16 MiB cap": (_frame_head(0x2, 16 * 2**20 + 1), 1009),
            "fragments adding up over the cap": (
                _frame(0x2, b"x" * 2**20, fin=False) + _frame_head(0x0, 15 * 2**20 + 1),
                1009,
            ),
            "a text message that is not UTF-8": (_frame(0x1, b"\xff\xfe not utf-8"), 1007),
            "a continuation with nothing to continue": (_frame(0x0, b"x"), 1002),
            "a ping over 125 bytes": (_frame(0x9, b"p" * 200), 1002),
        }
        for name, (frames, expected) in cases.items():
            with _connect(server.url) as sock:
                sock.sendall(_handshake(path))
                closes = [payload for opcode, payload in _server_frames(sock, frames) if opcode == 0x8]
            assert closes, name
            code = struct.unpack("!H", closes[0][:2])[0]
            assert code == expected and closes[0][2:], (name, code, closes[0])
        assert server.get("/runs/r-live?threadId=t-live").json()["status"] == "running"
        # The client's fault, told to the client: no traceback per hostile connection in the server's log.
        assert server.stderr().count("Traceback") == logged_before, server.stderr()[-2000:]
    finally:
        server.post("/runs/r-live/cancel?threadId=t-live")
        asyncio.run(wait_record(server.url, "r-live", "t-live", status=("aborted", "completed", "failed")))
    _healthy(server)


def test_a_half_closed_client_ends_its_own_tail_only(server: CoordinatorProcess) -> None:
    # After the handshake, and before it: neither holds the server or another tailer.
    for when in ("after", "before"):
        with _connect(server.url) as sock:
            request = _handshake("/runs/r-done/stream?threadId=t-done")
            if when == "before":
                sock.sendall(request[:40])
            else:
                sock.sendall(request)
            sock.shutdown(socket.SHUT_WR)
            received = b""
            while chunk := sock.recv(65536):  # ends: the server closes its side too
                received += chunk
        assert len(received) < 10 * 2**20
    _healthy(server)


# -- the auth hook --------------------------------------------------------------------------------


def _hook_config(tmp: Path, asked: list[tuple[str, AuthScope]]) -> CoordinatorConfig:
    db = open_database(tmp / "c.db")
    runs, log = sqlite_run_backend(db)

    def authorize(connection: HTTPConnection, action: str, scope: AuthScope) -> Any:
        asked.append((action, scope))
        user = connection.headers.get("authorization", "").removeprefix("User ")
        if user == "raises":
            raise RuntimeError("the hook's own bug")
        if user == "truthy":
            return "yes"  # not True: a hook's accident must not open the door
        return user == "alice" or (user == "bob" and action != "runs.tail")

    return CoordinatorConfig(
        sandboxes={"local": define_sandbox("ws-hook", local_process_sandbox(base_dir=tmp / "sb"))},
        harnesses={"command": CommandHarness(command=scripted_agent(tmp))},
        stores=StoreSet(runs, log, SqliteLockStore(db), SqliteInstanceStore(db), close=db.close),
        authorize=authorize,
        inactivity_timeout=0,
    )


def test_an_auth_hook_refuses_websocket_handshakes_with_401_or_403_and_leaks_no_event(tmp_path: Path) -> None:
    asked: list[tuple[str, AuthScope]] = []

    async def main() -> None:
        async with coordinator_server(_hook_config(tmp_path, asked)) as (url, _):
            async with httpx.AsyncClient(base_url=url, headers={"Authorization": "User alice"}, timeout=30) as http:
                body = trigger("t-h", "lines 5 0", "r-h")
                assert (await http.post("/runs", json=body)).status_code == 202
                ws_base = url.replace("http://", "ws://")
                for route in ("stream", "ws"):
                    path = f"/runs/r-h/{route}?threadId=t-h&offset=-1"
                    for headers, expected in (
                        ({}, 401),
                        ({"X-User": "alice"}, 401),  # a header the hook does not read
                        ({"Authorization": "User mallory"}, 403),
                        ({"Authorization": "User bob"}, 403),  # may read records, not tail them
                        ({"Authorization": "User raises"}, 403),
                        ({"Authorization": "User truthy"}, 403),
                        ({"Authorization": f"Bearer {CLIENT_TOKEN}"}, 403),
                    ):
                        asked.clear()
                        with pytest.raises(InvalidStatus) as refused:
                            async with connect(ws_base + path, additional_headers=headers):
                                pass
                        response = refused.value.response
                        assert response.status_code == expected, (route, headers, response.status_code)
                        code = "unauthorized" if expected == 401 else "forbidden"
                        assert json.loads(response.body) == {"error": code, "code": code}, response.body
                        assert asked == [("runs.tail", AuthScope(run_id="r-h", thread_id="t-h"))], asked
                    # A refused handshake's status is the answer: no event after it, on the same socket or not.
                    status, raw = await asyncio.to_thread(
                        _answer, url, _handshake(path, auth=False, extra="Authorization: User mallory\r\n")
                    )
                    assert status == 403 and b"TEXT_MESSAGE" not in raw and b"RUN_" not in raw
                # Consent reads every event.
                while (await http.get("/runs/r-h?threadId=t-h")).json()["status"] != "completed":  # noqa: ASYNC110
                    await asyncio.sleep(0.05)  # the record is all a client can poll
                async with connect(
                    ws_base + "/runs/r-h/stream?threadId=t-h", additional_headers={"Authorization": "User alice"}
                ) as ws:
                    frames = await _read_all(ws)
                assert [f["seq"] for f in frames[:-1]] == list(range(len(frames) - 1)) and frames[-1][
                    "type"
                ] == "status"
                assert sum(f["chunk"]["type"] == "TEXT_MESSAGE_CONTENT" for f in frames[:-1]) == 5
                assert (await http.get("/healthz")).json()["ok"] is True

    asyncio.run(main())
