"""Every JSON decode at a boundary is bounded in depth and size (issue 9, point 5).

Real servers under uvicorn on 127.0.0.1 (the tool bridge, tool-exec, the service routes with
their WebSocket tail) and real runs (a command harness on the local-process provider). Each bad
input gets the status the issue names, and the same server answers a normal request right after.
Depth limit: ``MAX_JSON_DEPTH`` (128) levels; 100k levels is what was measured to break things.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from boxwright._json import MAX_JSON_DEPTH, JsonTooDeepError, decode_json, depth_exceeds
from boxwright.agent import JournalOptions, run_agent
from boxwright.definition import define_sandbox
from boxwright.events import (
    CustomEvent,
    Event,
    RunErrorEvent,
    RunFinishedEvent,
    TextMessageContentEvent,
    decode_event,
    encode_event,
)
from boxwright.harnesses.command import command_harness
from boxwright.journal import journal_paths, read_journal_ndjson, start_journaled_agent
from boxwright.middleware import RunSpec, SandboxMiddleware, SandboxService, StartRunRequest, sandbox_routes
from boxwright.providers import local_process_sandbox
from boxwright.stores.memory import MemoryInstanceStore, memory_run_backend
from boxwright.tool_bridge import ToolExecRun, serve_asgi, start_host_tool_bridge, tool, tool_exec_app, tool_exec_path
from boxwright.tool_bridge.asgi import DEFAULT_MAX_BODY_BYTES, AsgiServer

pytestmark = pytest.mark.integration

DEEP = "[" * 100_000  # the measured attack: 100k levels, never closed
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
PARSE_ERROR = -32700
# Reads its prompt first: an agent that exits before its stdin is written fails the run
# ("the process closed its stdin"), which is not what these tests are about.
READS_PROMPT = "cat >/dev/null; echo hello"


def nested(levels: int) -> str:
    """``levels`` arrays, one inside the other, around a 1."""
    return "[" * levels + "1" + "]" * levels


@tool
def echo(text: str) -> str:
    return text


def tools_call(text: str, request_id: int = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": text}},
    }


def ping_with(extra: str) -> str:
    """A JSON-RPC ping whose params carry ``extra`` (raw JSON): two levels plus the extra's own."""
    return '{"jsonrpc":"2.0","id":7,"method":"ping","params":{"x":' + extra + "}}"


def echoed(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    text: str = response.json()["result"]["content"][0]["text"]
    return text


# -- the decoder itself ---------------------------------------------------------------------------


def test_depth_is_exact_at_the_limit_and_blind_to_brackets_in_strings() -> None:
    assert decode_json(nested(MAX_JSON_DEPTH)) is not None
    with pytest.raises(JsonTooDeepError):
        decode_json(nested(MAX_JSON_DEPTH + 1))
    with pytest.raises(JsonTooDeepError):
        decode_json(DEEP)  # msgspec's RecursionError, as a DecodeError
    # Brackets inside strings (escaped quotes and backslashes around them) are text, not nesting...
    tricky = json.dumps({"code": '["\\"' * 5000 + "{" * 5000, "more": ["]]]" * 300, "\\"]})
    assert decode_json(tricky)["more"][1] == "\\"
    # ...and closing brackets in strings cannot hide real nesting.
    hidden = "[" * 100 + json.dumps("]" * 200) + "," + nested(40) + "]" * 100
    with pytest.raises(JsonTooDeepError):
        decode_json(hidden)
    # NDJSON: one deep line among many shallow ones, in a later span than the first.
    lines = [encode_event(CustomEvent(name="n", value={"i": i})).decode() for i in range(2000)]
    assert not depth_exceeds("\n".join(lines))
    lines[1500] = '{"x":' + nested(MAX_JSON_DEPTH) + "}"
    assert depth_exceeds("\n".join(lines))
    assert depth_exceeds("\n".join(lines).encode())


def test_event_lines_that_are_not_events_raise_event_decode_errors_only() -> None:
    from boxwright.errors import EventDecodeError

    for line in ("7e5123a fix the parser", "1e999", DEEP, '{"type":"CUSTOM","name":"x","value":' + nested(128) + "}"):
        with pytest.raises(EventDecodeError):
            decode_event(line)
    at_limit = decode_event('{"type":"CUSTOM","name":"x","value":' + nested(MAX_JSON_DEPTH - 2) + "}")
    assert isinstance(at_limit, CustomEvent)
    # A text delta full of brackets is text; the same event carrying deep metadata or raw_event is refused.
    content = '{"type":"TEXT_MESSAGE_CONTENT","messageId":"m","delta":"' + "[{" * 1000 + '"'
    assert decode_event(content + "}").delta == "[{" * 1000  # type: ignore[union-attr]
    for field in ("metadata", "rawEvent"):
        with pytest.raises(EventDecodeError):
            decode_event(content + f',"{field}":{{"x":' + nested(MAX_JSON_DEPTH) + "}}")


# -- the tool bridge (MCP over HTTP) --------------------------------------------------------------


def test_bridge_answers_deep_json_with_a_parse_error_and_keeps_serving() -> None:
    async def main() -> None:
        async with await start_host_tool_bridge() as bridge, httpx.AsyncClient(timeout=30) as http:
            registration = bridge.register("r-deep", [echo])
            headers = {**ACCEPT, **registration.headers}
            for body in (DEEP, nested(100_000), ping_with(nested(MAX_JSON_DEPTH - 1))):
                response = await http.post(registration.url, content=body, headers=headers)
                assert response.status_code == 400, response.text
                assert response.json()["error"]["code"] == PARSE_ERROR
                # The same listener, the same connection: a normal call right after.
                assert echoed(await http.post(registration.url, json=tools_call("still here"), headers=headers)) == (
                    "still here"
                )
            # At the limit exactly: a valid request; brackets in a string are just text.
            at_limit = await http.post(registration.url, content=ping_with(nested(MAX_JSON_DEPTH - 2)), headers=headers)
            assert at_limit.status_code == 200, at_limit.text
            assert at_limit.json() == {"jsonrpc": "2.0", "id": 7, "result": {}}
            assert echoed(await http.post(registration.url, json=tools_call(DEEP), headers=headers)) == DEEP

    asyncio.run(main())


def test_bridge_refuses_an_oversize_body_with_413_and_keeps_serving() -> None:
    async def main() -> None:
        async with await start_host_tool_bridge() as bridge, httpx.AsyncClient(timeout=30) as http:
            registration = bridge.register("r-big", [echo])
            headers = {**ACCEPT, **registration.headers}
            big = json.dumps(tools_call("x" * DEFAULT_MAX_BODY_BYTES))
            response = await http.post(registration.url, content=big, headers=headers)
            assert response.status_code == 413
            assert echoed(await http.post(registration.url, json=tools_call("after"), headers=headers)) == "after"

    asyncio.run(main())


# -- tool-exec (the host endpoint remote sandboxes call) -----------------------------------------


def test_tool_exec_answers_deep_json_with_400_and_keeps_serving() -> None:
    async def main() -> None:
        token = secrets.token_hex(24)
        runs = {"r1": ToolExecRun(tools=[echo], token=token)}
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        async with await serve_asgi(tool_exec_app(runs)) as server, httpx.AsyncClient(timeout=30) as http:
            url = server.url + tool_exec_path("r1")
            for body in (DEEP, '{"name":"echo","args":{"text":"a","x":' + nested(MAX_JSON_DEPTH) + "}}"):
                response = await http.post(url, content=body, headers=headers)
                assert response.status_code == 400, response.text
                assert "nested deeper than 128 levels" in response.json()["error"]
                normal = await http.post(url, json={"name": "echo", "args": {"text": "ok"}}, headers=headers)
                assert normal.status_code == 200 and normal.json() == {"result": "ok"}
            too_big = await http.post(url, content=b"[" + b" " * DEFAULT_MAX_BODY_BYTES + b"]", headers=headers)
            assert too_big.status_code == 413
            normal = await http.post(url, json={"name": "echo", "args": {"text": "ok"}}, headers=headers)
            assert normal.status_code == 200

    asyncio.run(main())


# -- the service routes: POST /runs and the WebSocket tail ----------------------------------------


@dataclass
class Service:
    service: SandboxService
    server: AsgiServer
    http: httpx.AsyncClient

    async def start(self, script: str) -> str:
        response = await self.http.post("/runs", json={"prompt": script, "threadId": f"t-{secrets.token_hex(4)}"})
        assert response.status_code == 202, response.text
        return str(response.json()["runId"])

    async def finished(self, run_id: str, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            record: dict[str, Any] = (await self.http.get(f"/runs/{run_id}")).json()
            if record.get("status") not in (None, "pending", "running"):
                return record
            await asyncio.sleep(0.05)
        raise AssertionError(f"run {run_id} did not finish within {timeout} s")

    def ws(self, run_id: str) -> str:
        return self.server.url.replace("http://", "ws://") + f"/runs/{run_id}/ws"


@contextlib.asynccontextmanager
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    runs, log = memory_run_backend()
    sandbox = define_sandbox("bounded", local_process_sandbox(base_dir=tmp_path / "sb"), file_events=False)

    def factory(request: StartRunRequest) -> RunSpec:
        return RunSpec(sandbox=sandbox, harness=command_harness(request.prompt))

    svc = SandboxService(runs, log, store=MemoryInstanceStore(), factory=factory)
    app = Starlette(routes=sandbox_routes(svc), middleware=[Middleware(SandboxMiddleware, service=svc)])
    server = await serve_asgi(app)
    http = httpx.AsyncClient(base_url=server.url, timeout=30)
    try:
        yield Service(svc, server, http)
    finally:
        await http.aclose()
        await server.close()
        await svc.aclose(cancel=True)


def test_post_runs_answers_deep_json_with_400_and_keeps_serving(tmp_path: Path) -> None:
    async def main() -> None:
        async with service(tmp_path) as svc:
            for body in (DEEP, '{"prompt":"echo hi","threadId":"t","extra":' + nested(100_000) + "}"):
                response = await svc.http.post("/runs", content=body, headers={"Content-Type": "application/json"})
                assert response.status_code == 400, response.text
                assert response.json()["code"] == "invalid_body"
            run_id = await svc.start(READS_PROMPT)
            assert (await svc.finished(run_id))["status"] == "completed"

    asyncio.run(main())


async def _close_code(url: str, message: str | bytes) -> int:
    async with connect(url, max_size=None) as ws:
        await ws.send(message)
        with pytest.raises(ConnectionClosed):
            while True:
                await asyncio.wait_for(ws.recv(), 30)
        assert ws.close_code is not None
        return ws.close_code


def test_websocket_closes_1007_on_deep_json_and_1009_on_a_huge_message(tmp_path: Path) -> None:
    async def main() -> None:
        async with service(tmp_path) as svc:
            run_id = await svc.start(READS_PROMPT)
            await svc.finished(run_id)
            url = svc.ws(run_id)
            # Too deep (129 levels in 260 characters): invalid, 1007.
            assert await _close_code(url, '{"offset":' + nested(MAX_JSON_DEPTH) + "}") == 1007
            assert await _close_code(url, '{"offset":' + "[" * 1000 + "}") == 1007
            # The measured 100k levels are 100 kB: over what an offset message may be, 1009 (too big).
            assert await _close_code(url, '{"offset":' + DEEP) == 1009
            assert await _close_code(url, "-1" + " " * 5000) == 1009  # the app: an offset is short
            assert await _close_code(url, b"x" * (2 << 20)) == 1009  # uvicorn's frame cap (ServerLimits)
            # The same server tails the run right after.
            async with connect(url) as ws:
                await ws.send("-1")
                frames = [json.loads(frame) async for frame in ws]
            assert ws.close_code == 1000
            assert frames[-1]["closed"] is True
            assert any(f.get("event", {}).get("type") == "RUN_FINISHED" for f in frames)

    asyncio.run(main())


# -- agent lines: a real run through the command harness ------------------------------------------


BAD_LINES_SCRIPT = (
    "cat >/dev/null; "
    "printf '%s\\n' '7e5123a fix the parser' '1e999'; "
    "head -c 100000 /dev/zero | tr '\\0' '['; echo; "
    # An event-shaped line one level too deep is text too; one at the limit is an event.
    'printf \'%s\\n\' \'{"type":"CUSTOM","name":"deep","value":' + nested(MAX_JSON_DEPTH) + "}'; "
    'printf \'%s\\n\' \'{"type":"CUSTOM","name":"ok","value":' + nested(MAX_JSON_DEPTH - 2) + "}'; "
    "echo done"
)


@pytest.mark.parametrize("journaled", [False, True], ids=["stdout", "journal"])
def test_agent_lines_that_are_not_events_are_text_and_the_run_completes(tmp_path: Path, journaled: bool) -> None:
    sandbox = define_sandbox("lines", local_process_sandbox(base_dir=tmp_path / "sb"), file_events=False)

    async def main() -> list[Event]:
        options: dict[str, Any] = {"journal": JournalOptions()} if journaled else {}
        stream = run_agent(
            sandbox,
            command_harness(BAD_LINES_SCRIPT),
            "go",
            thread_id="t-lines",
            run_id=f"lines-{secrets.token_hex(4)}",
            store=MemoryInstanceStore(),
            **options,
        )
        return [event async for event in stream]  # to the end: the generator closes itself

    events = asyncio.run(main())
    assert isinstance(events[-1], RunFinishedEvent), events[-1]
    assert not any(isinstance(e, RunErrorEvent) for e in events)
    text = "".join(e.delta for e in events if isinstance(e, TextMessageContentEvent))
    assert "7e5123a fix the parser\n1e999\n" + "[" * 100_000 + "\n" in text
    assert '"name":"deep"' in text and text.endswith("done\n")
    assert [e.name for e in events if isinstance(e, CustomEvent) and e.name in ("deep", "ok")] == ["ok"]


def test_read_journal_ndjson_hands_bad_lines_to_the_text_callback(tmp_path: Path) -> None:
    async def main() -> None:
        handle = await local_process_sandbox(base_dir=tmp_path / "sb").create()
        try:
            paths = journal_paths(f"jl-{secrets.token_hex(4)}")
            await start_journaled_agent(handle, BAD_LINES_SCRIPT.replace("echo done", "echo '{\"a\":1}'"), paths)
            bad: list[str] = []
            values = [v async for v in read_journal_ndjson(handle, paths, on_non_json_line=bad.append)]
        finally:
            await handle.destroy()
        assert values[-1] == {"a": 1}
        assert [v["name"] for v in values if "name" in v] == ["ok"]
        assert bad[:3] == ["7e5123a fix the parser", "1e999", "[" * 100_000]
        assert msgspec.json.decode(bad[3])["name"] == "deep"  # too deep for the boundary, valid JSON all the same

    asyncio.run(main())
