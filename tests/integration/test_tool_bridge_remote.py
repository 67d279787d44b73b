"""The co-located seam over real HTTP: descriptors, stubs, the HTTP executor and the host's tool-exec endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest

from boxwright.abort import AbortController
from boxwright.errors import RemoteToolError, ToolArgumentsError, UnknownToolError
from boxwright.tool_bridge import (
    ToolContext,
    ToolDescriptor,
    ToolExecRun,
    create_tool_bridge_core,
    define_tool,
    execute_host_tool,
    http_remote_tool_executor,
    remote_tool_stubs,
    serve_asgi,
    start_host_tool_bridge,
    tool,
    tool_descriptors,
    tool_exec_app,
    tool_exec_path,
)
from tests.support.require import missing


class Todo(msgspec.Struct):
    id: int
    title: str


class HostTools:
    """The app's tools with state that must stay on the host."""

    def __init__(self) -> None:
        self.todos: list[Todo] = []
        self.contexts: list[ToolContext] = []
        self.slow_cancelled = asyncio.Event()

        @tool(read_only=True)
        def get_todos() -> list[Todo]:
            """List the todos."""
            return self.todos

        @tool
        async def add_todo(title: str, ctx: ToolContext) -> str:
            """Add a todo."""
            self.contexts.append(ctx)
            self.todos.append(Todo(len(self.todos) + 1, title))
            return f"added #{len(self.todos)}"

        @tool
        def explode() -> str:
            raise RuntimeError("database is down")

        @tool
        async def slow() -> str:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.slow_cancelled.set()
                raise
            return "never"

        self.tools = [get_todos, add_todo, explode, slow]


@contextlib.asynccontextmanager
async def tool_exec_server(
    host: HostTools, run_id: str = "r1"
) -> AsyncIterator[tuple[str, str, dict[str, ToolExecRun]]]:
    token = secrets.token_hex(24)
    runs = {run_id: ToolExecRun(tools=host.tools, token=token, context={"tenant": "acme"}, thread_id="t1")}
    async with await serve_asgi(tool_exec_app(runs)) as server:
        yield server.url + tool_exec_path(run_id), token, runs


def sdk_text(result: Any) -> str:
    """The single text block of an SDK ``CallToolResult``."""
    [block] = result.content
    assert block.type == "text"
    text: str = block.text
    return text


def text_of(result: dict[str, Any]) -> str:
    text: str = result["content"][0]["text"]
    return text


def test_descriptors_carry_everything_but_the_code() -> None:
    host = HostTools()
    raw = define_tool("raw", "Raw.", {"type": "array"}, lambda args, ctx: None)
    descriptors = tool_descriptors([*host.tools, raw])
    assert [d.name for d in descriptors] == ["get_todos", "add_todo", "explode", "slow", "raw"]
    get_todos = descriptors[0]
    assert (get_todos.description, get_todos.read_only) == ("List the todos.", True)
    assert descriptors[1].input_schema == host.tools[1].input_schema
    assert descriptors[4].input_schema == {"type": "object", "properties": {}}  # fallback schema
    wire = msgspec.json.decode(msgspec.json.encode(descriptors))
    assert wire[0] == {
        "name": "get_todos",
        "description": "List the todos.",
        "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False},
        "readOnly": True,
        "structuredOutput": False,
    }
    assert msgspec.json.decode(msgspec.json.encode(descriptors), type=list[ToolDescriptor]) == descriptors


def test_execute_host_tool_returns_the_raw_value() -> None:
    host = HostTools()

    async def main() -> None:
        assert await execute_host_tool(host.tools, "add_todo", {"title": "a"}, run_id="r9", context=7) == "added #1"
        assert await execute_host_tool(host.tools, "get_todos", None) == [Todo(1, "a")]
        assert host.contexts[0].run_id == "r9" and host.contexts[0].context == 7
        with pytest.raises(UnknownToolError):
            await execute_host_tool(host.tools, "nope", {})
        with pytest.raises(ToolArgumentsError):
            await execute_host_tool(host.tools, "add_todo", {"title": 5})
        with pytest.raises(RuntimeError, match="database is down"):
            await execute_host_tool(host.tools, "explode", {})

    asyncio.run(main())


def test_stubs_round_trip_through_the_tool_exec_endpoint() -> None:
    host = HostTools()

    async def main() -> None:
        async with tool_exec_server(host) as (url, token, _runs):
            async with http_remote_tool_executor(url, token) as executor:
                stubs = remote_tool_stubs(tool_descriptors(host.tools), executor)
                assert [s.name for s in stubs] == [t.name for t in host.tools]
                assert stubs[0].read_only is True and stubs[1].input_schema == host.tools[1].input_schema
                # The container's bridge core serves the stubs exactly as it would the real tools.
                core = create_tool_bridge_core(stubs, run_id="r1")
                local = create_tool_bridge_core(HostTools().tools, run_id="r1")
                assert core.list_tools() == local.list_tools()

                added = await core.call_tool("add_todo", {"title": "remote"})
                assert (added["isError"], text_of(added)) == (False, "added #1")
                listed = await core.call_tool("get_todos", {})
                assert text_of(listed) == '[{"id":1,"title":"remote"}]'
                # The real tool ran on the host, with the host's context for this run.
                assert host.todos == [Todo(1, "remote")]
                [ctx] = host.contexts
                assert (ctx.run_id, ctx.thread_id, ctx.context) == ("r1", "t1", {"tenant": "acme"})

                failed = await core.call_tool("explode", {})
                assert failed["isError"] is True
                assert text_of(failed) == 'Tool execution failed: remote tool "explode" failed: 500 database is down'
                bad_args = await core.call_tool("add_todo", {"title": ["x"]})
                assert bad_args["isError"] is True and "`$.title`" in text_of(bad_args)
                assert text_of(bad_args).startswith("Invalid arguments for tool 'add_todo'")

    asyncio.run(main())


def test_official_client_through_a_colocated_bridge_reaches_the_host_tool() -> None:
    if importlib.util.find_spec("mcp") is None:
        reason = "the official MCP SDK (`mcp`, in the dev extra) is not installed"
        missing(reason)
    try:
        import httpx2
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client
    except ImportError:
        pytest.skip("this test drives the mcp 2.x client")
    host = HostTools()

    async def main() -> None:
        async with (
            tool_exec_server(host) as (url, token, _runs),
            http_remote_tool_executor(url, token) as executor,
            await start_host_tool_bridge() as container_bridge,
        ):
            registration = container_bridge.register("r1", remote_tool_stubs(tool_descriptors(host.tools), executor))
            async with (
                httpx2.AsyncClient(headers=registration.headers, timeout=10) as http,
                streamable_http_client(registration.url, http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                result = await session.call_tool("add_todo", {"title": "via MCP"})
                assert (result.is_error, sdk_text(result)) == (False, "added #1")
            assert host.todos == [Todo(1, "via MCP")]

    asyncio.run(main())


def test_tool_exec_endpoint_answers_every_bad_request_in_json() -> None:
    host = HostTools()

    async def main() -> None:
        async with tool_exec_server(host) as (url, token, _runs), httpx.AsyncClient(timeout=10) as http:
            auth = {"Authorization": f"Bearer {token}"}

            async def post(body: Any = None, *, content: Any = None, headers: Any = auth) -> httpx.Response:
                response = await http.post(url, json=body, content=content, headers=headers)
                assert response.headers["content-type"] == "application/json"
                assert "Traceback" not in response.text and token not in response.text
                return response

            ok = await post({"name": "add_todo", "args": {"title": "x"}})
            assert (ok.status_code, ok.json()) == (200, {"result": "added #1"})
            assert (await post({"name": "get_todos"})).json() == {"result": [{"id": 1, "title": "x"}]}
            assert (await post({"name": "add_todo"}, headers={})).status_code == 401
            assert (await post({"name": "add_todo"}, headers={"Authorization": "Bearer nope"})).status_code == 401
            assert (await post(content=b"{not json")).status_code == 400
            assert (await post({"args": {}})).status_code == 400
            assert (await post({"name": "add_todo", "args": [1]})).status_code == 400
            unknown = await post({"name": "nope", "args": {}})
            assert (unknown.status_code, unknown.json()) == (400, {"error": "Unknown tool: nope"})
            bad_args = await post({"name": "add_todo", "args": {}})
            assert bad_args.status_code == 422 and bad_args.json()["kind"] == "arguments"
            assert "`title`" in bad_args.json()["error"]
            raised = await post({"name": "explode", "args": {}})
            assert (raised.status_code, raised.json()) == (500, {"error": "database is down"})
            assert (await http.get(url, headers=auth)).status_code == 405
            unknown_run = await http.post(url.replace("/r1", "/r2"), json={"name": "get_todos"}, headers=auth)
            assert unknown_run.status_code == 404
            began = time.monotonic()
            too_large = await post(content=b"x" * (10 << 20))
            assert too_large.status_code == 413 and time.monotonic() - began < 2
            assert len(host.todos) == 1  # only the one authorised, valid call ran

    asyncio.run(main())


def test_http_executor_error_cases() -> None:
    host = HostTools()

    async def no_result(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"value": 1}'})

    async def main() -> None:
        async with tool_exec_server(host) as (url, token, _runs), await serve_asgi(no_result) as odd:
            async with http_remote_tool_executor(url, "0" * 48) as wrong_token:
                with pytest.raises(RemoteToolError) as info:
                    await wrong_token("get_todos", {})
                assert info.value.status == 401 and str(info.value).startswith('remote tool "get_todos" failed: 401')
            async with http_remote_tool_executor(odd.url + "/tool-exec/r1", token) as malformed:
                with pytest.raises(RemoteToolError, match="malformed orchestrator response"):
                    await malformed("get_todos", {})
            async with http_remote_tool_executor(url, token) as executor:
                with pytest.raises(RemoteToolError) as info:
                    await executor("nope", {})
                assert info.value.status == 400 and "Unknown tool: nope" in str(info.value)
                # An abort of the container's run cancels the in-flight HTTP call promptly.
                controller = AbortController()
                core = create_tool_bridge_core(
                    remote_tool_stubs(tool_descriptors(host.tools), executor), signal=controller.signal
                )
                asyncio.get_running_loop().call_later(0.1, controller.abort, "run cancelled")
                began = time.monotonic()
                result = await core.call_tool("slow", {})
                assert time.monotonic() - began < 2
                assert result["isError"] is True and "aborted: run cancelled" in text_of(result)
                # The dropped connection reaches the host, which cancels the real tool as well.
                await asyncio.wait_for(host.slow_cancelled.wait(), 2)
            async with http_remote_tool_executor("http://127.0.0.1:9/tool-exec/r1", token) as unreachable:
                with pytest.raises(RemoteToolError) as info:
                    await unreachable("get_todos", {})
                assert info.value.status == 0

    asyncio.run(main())


def test_settling_the_run_aborts_host_tools_in_flight() -> None:
    host = HostTools()

    async def main() -> None:
        controller = AbortController()
        token = secrets.token_hex(24)
        runs = {"r1": ToolExecRun(tools=host.tools, token=token, signal=controller.signal)}
        async with await serve_asgi(tool_exec_app(runs)) as server, httpx.AsyncClient(timeout=10) as http:
            url = server.url + tool_exec_path("r1")
            pending = asyncio.create_task(
                http.post(url, json={"name": "slow", "args": {}}, headers={"Authorization": f"Bearer {token}"})
            )
            await asyncio.sleep(0.1)
            began = time.monotonic()
            controller.abort("run settled")
            del runs["r1"]  # the coordinator drops the run's state
            response = await asyncio.wait_for(pending, 5)
            assert time.monotonic() - began < 2
            assert (response.status_code, response.json()) == (500, {"error": "aborted: run settled"})
            assert host.slow_cancelled.is_set()
            gone = await http.post(url, json={"name": "get_todos"}, headers={"Authorization": f"Bearer {token}"})
            assert gone.status_code == 404

    asyncio.run(main())
