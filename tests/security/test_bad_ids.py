"""Every entry point refuses a bad run id or thread id by name, and keeps serving (issue 9, point 4).

Entry points: the run stores, journal paths, the bridge (register, URL, HTTP route), tool-exec,
and the service routes (POST /runs, GET /runs/{id}, /events, /poll, /ws, POST /cancel). HTTP
faces answer 400 ``{"error": <message>, "code": "invalid_run_id" | "invalid_thread_id"}`` (the
service's error body shape); a WebSocket closes 4400. Two ids cannot reach a service route as
themselves: a ``%2F`` splits the decoded path (the router answers 404) and a non-UTF-8 byte is
decoded by the server to U+FFFD (a valid id: 404 unknown run); the bridge routes on the raw
path, so there both are 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from boxwright.definition import define_sandbox
from boxwright.errors import InvalidRunIdError, InvalidThreadIdError
from boxwright.harnesses.command import command_harness
from boxwright.journal import KeptJournal, journal_dir_of, journal_paths, prune_journals
from boxwright.middleware import SandboxService, sandbox_routes
from boxwright.providers import local_process_sandbox
from boxwright.runs import RunStore
from boxwright.sandbox import CreateInput
from boxwright.stores.memory import MemoryRunStore, memory_run_backend
from boxwright.stores.sqlite import SqliteRunStore, open_database
from boxwright.tool_bridge import ToolExecRun, start_host_tool_bridge, tool, tool_exec_app, tool_exec_path
from boxwright.tool_bridge.asgi import serve_asgi

pytestmark = pytest.mark.integration

BAD_IDS = ["", ".", "..", "/", "a/b", "a\\b", "a\x00b", "a\nb", "a\x1bb", "\x7f", "\ud800", "x" * 201]
# Path segments (percent-encoded) that decode to a refused id, for the routes that take one.
BAD_SEGMENTS = ["%2E", "%2E%2E", "a%5Cb", "%00", "a%0Ab", "%1B", "%7F", "x" * 201]
# Only the bridge and tool-exec route on the raw path: these are refused there too.
RAW_ONLY_SEGMENTS = ["a%2Fb", "%ED%A0%80", "%FF"]
GOOD_RUN = "good-run"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
PING = {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {}}


@tool
async def echo(text: str) -> str:
    return text


def _refused(response: httpx.Response, code: str = "invalid_run_id") -> str:
    assert response.status_code == 400, (response.status_code, response.text)
    body = response.json()
    assert body["code"] == code and isinstance(body["error"], str), body
    return str(body["error"])


# -- the run stores and the journal ---------------------------------------------------------------


@contextlib.asynccontextmanager
async def _store(kind: str, tmp_path: Path) -> AsyncIterator[RunStore]:
    if kind == "memory":
        yield MemoryRunStore()
        return
    async with open_database(tmp_path / "runs.db") as db:
        yield SqliteRunStore(db)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_run_store_create_refuses_each_bad_run_and_thread_id(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with _store(kind, tmp_path) as runs:
            for bad in BAD_IDS:
                with pytest.raises(InvalidRunIdError, match="run id"):
                    await runs.create_or_resume(bad, "t")
                with pytest.raises(InvalidThreadIdError, match="thread id"):
                    await runs.create_or_resume("ok", bad)
                with pytest.raises(InvalidRunIdError):
                    await runs.get(bad)
            assert await runs.get("ok") is None, "a refused thread id wrote no record"
            assert (await runs.create_or_resume("ok", "t")).status == "running"

    asyncio.run(main())


def test_journal_paths_refuse_each_bad_id_and_a_legacy_name_is_kept_not_fatal(tmp_path: Path) -> None:
    for bad in BAD_IDS:
        with pytest.raises(InvalidRunIdError, match="run id"):
            journal_paths(bad)

    async def main() -> None:
        handle = await local_process_sandbox(base_dir=tmp_path / "sb").create(CreateInput())
        try:
            # An older version journaled run "a/b" as a_2fb.ndjson: the sweep keeps it and goes on.
            dir = journal_dir_of(handle)
            await handle.process.exec(f"mkdir -p {dir} && : > {dir}/a_2fb.ndjson && : > {dir}/_2e_2e.ndjson")
            runs, _ = memory_run_backend()
            result = await prune_journals(handle, runs, orphan_ttl_ms=0)
            assert result.failures == [] and result.deleted == []
            assert sorted(result.kept, key=lambda k: k.names) == [
                KeptJournal(names=("_2e_2e.ndjson",), reason="undecodable-name"),
                KeptJournal(names=("a_2fb.ndjson",), reason="undecodable-name"),
            ]
        finally:
            await handle.destroy()

    asyncio.run(main())


# -- the bridge and tool-exec ---------------------------------------------------------------------


async def _raw_post(port: int, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
    """A request whose path goes out byte for byte (httpx would resolve a literal ``..``)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = "".join(f"{k}: {v}\r\n" for k, v in {**headers, "Content-Length": str(len(body))}.items())
        writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{head}\r\n".encode() + body)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


def test_bridge_refuses_each_bad_run_id_at_register_url_and_route_and_keeps_serving() -> None:
    async def main() -> None:
        async with await start_host_tool_bridge() as bridge, httpx.AsyncClient(timeout=10) as http:
            for bad in BAD_IDS:
                with pytest.raises(InvalidRunIdError, match="run id"):
                    bridge.register(bad, [echo])
                with pytest.raises(InvalidRunIdError):
                    bridge.url_for(bad)
            with pytest.raises(InvalidThreadIdError, match="thread id"):
                bridge.register("r-thread", [echo], thread_id="..")
            good = bridge.register(GOOD_RUN, [echo])
            headers = {**ACCEPT, **good.headers}
            for segment in BAD_SEGMENTS + RAW_ONLY_SEGMENTS:
                # The right bearer changes nothing: no run can live under such a segment.
                response = await http.post(f"{bridge.base_url}/runs/{segment}/mcp", json=PING, headers=headers)
                assert "run id" in _refused(response), segment
            for literal in ("/runs/../mcp", "/runs/./mcp"):
                status, body = await _raw_post(
                    bridge.port, literal, headers, b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
                )
                assert status == 400 and b'"code":"invalid_run_id"' in body, (literal, body)
            ok = await http.post(good.url, json=PING, headers=headers)
            assert ok.status_code == 200 and ok.json()["result"] == {}

    asyncio.run(main())


def test_tool_exec_refuses_each_bad_run_id_and_keeps_serving() -> None:
    async def main() -> None:
        token = secrets.token_hex(24)
        for bad in BAD_IDS:
            with pytest.raises(InvalidRunIdError, match="run id"):
                tool_exec_path(bad)
        with pytest.raises(InvalidThreadIdError):
            ToolExecRun(tools=[echo], token=token, thread_id="a/b")
        app = tool_exec_app({GOOD_RUN: ToolExecRun(tools=[echo], token=token)})
        async with await serve_asgi(app) as server, httpx.AsyncClient(timeout=10) as http:
            headers = {"Authorization": f"Bearer {token}"}
            call = {"name": "echo", "args": {"text": "hi"}}
            for segment in BAD_SEGMENTS + RAW_ONLY_SEGMENTS:
                response = await http.post(f"{server.url}/tool-exec/{segment}", json=call, headers=headers)
                assert "run id" in _refused(response), segment
            ok = await http.post(server.url + tool_exec_path(GOOD_RUN), json=call, headers=headers)
            assert ok.status_code == 200 and ok.json() == {"result": "hi"}

    asyncio.run(main())


# -- the service routes ---------------------------------------------------------------------------


def test_service_routes_refuse_each_bad_id_by_name_and_keep_serving(tmp_path: Path) -> None:
    runs, log = memory_run_backend()
    sandbox = define_sandbox("ids", local_process_sandbox(base_dir=tmp_path / "sb"))
    start = '{"type":"TEXT_MESSAGE_START","messageId":"m","role":"assistant"}'
    harness = command_harness(f'printf \'%s\\n\' \'{start}\' \'{{"type":"TEXT_MESSAGE_END","messageId":"m"}}\'')
    service = SandboxService(runs, log, factory=lambda body: (sandbox, harness))

    async def main() -> None:
        async with (
            await serve_asgi(Starlette(routes=sandbox_routes(service))) as server,
            httpx.AsyncClient(base_url=server.url, timeout=15) as http,
        ):

            async def trigger(**body: Any) -> httpx.Response:
                headers = body.pop("headers", {})
                return await http.post("/runs", json={"prompt": "go", "threadId": "t", **body}, headers=headers)

            for bad in BAD_IDS:
                if bad == "\ud800":
                    continue  # not JSON text at all: below
                assert "run id" in _refused(await trigger(runId=bad)), bad
                assert "thread id" in _refused(await trigger(threadId=bad), "invalid_thread_id"), bad
            # A lone surrogate cannot be sent as JSON text: the body itself is refused.
            raw = b'{"prompt":"go","threadId":"t","runId":"\\ud800"}'
            lone = await http.post("/runs", content=raw, headers={"Content-Type": "application/json"})
            assert lone.status_code == 400 and lone.json()["code"] == "invalid_body"
            assert "run id" in _refused(await trigger(headers={"X-Run-Id": ".."}))
            assert "[A-Za-z0-9._:-]" in _refused(await trigger(runId="a b"))

            for segment in BAD_SEGMENTS:
                for method, path in [
                    ("GET", f"/runs/{segment}"),
                    ("GET", f"/runs/{segment}/events"),
                    ("GET", f"/runs/{segment}/poll?offset=-1"),
                    ("POST", f"/runs/{segment}/cancel"),
                ]:
                    assert "run id" in _refused(await http.request(method, path)), (method, path)
                ws_url = server.url.replace("http://", "ws://") + f"/runs/{segment}/ws"
                async with connect(ws_url) as ws:
                    with pytest.raises(ConnectionClosed) as closed:
                        await asyncio.wait_for(ws.recv(), 10)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 4400, segment
                assert "run id" in closed.value.rcvd.reason
            for segment in RAW_ONLY_SEGMENTS:
                # The router or the server's decoding gets there first: a 404, never a 500.
                assert (await http.get(f"/runs/{segment}/events")).status_code == 404, segment

            # Still serving: a good run starts, ends and is tailed.
            started = await trigger(runId="after-the-bad-ones")
            assert started.status_code == 202, started.text
            record = await service.wait_run("after-the-bad-ones")
            assert record is not None and record.status == "completed"
            page = await http.get("/runs/after-the-bad-ones/poll?offset=-1")
            assert page.status_code == 200

    asyncio.run(main())
