"""The host bridge over real HTTP on 127.0.0.1: the official MCP SDK client, auth, bad input, many runs."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from boxwright.errors import InvalidRunIdError, ToolBridgeConfigError
from boxwright.secrets import TOKEN_PREFIX
from boxwright.tool_bridge import (
    HostToolBridge,
    ToolBridgeApp,
    ToolContext,
    bind_address_for,
    host_for_sandbox,
    start_host_tool_bridge,
    tool,
)
from tests.support.require import missing

ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def require_mcp_sdk() -> None:
    if importlib.util.find_spec("mcp") is None:
        reason = "the official MCP SDK (`mcp`, in the dev extra) is not installed"
        missing(reason)


@contextlib.asynccontextmanager
async def sdk_session(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    """A ClientSession of the official SDK over its streamable HTTP client (mcp 2.x, or 1.x)."""
    from mcp import ClientSession

    try:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client
    except ImportError:  # mcp 1.x
        from mcp.client.streamable_http import streamablehttp_client  # type: ignore[attr-defined,unused-ignore]

        async with streamablehttp_client(url, headers=headers) as (read, write, _), ClientSession(read, write) as s:
            yield s
        return
    async with (
        httpx2.AsyncClient(headers=headers, timeout=10) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        yield session


def sdk_text(result: Any) -> str:
    """The single text block of an SDK ``CallToolResult``."""
    [block] = result.content
    assert block.type == "text"
    text: str = block.text
    return text


def rpc(method: str, id_: int | None = 1, **params: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if id_ is not None:
        message["id"] = id_
    return message


def call(name: str, arguments: Any, id_: int = 1) -> dict[str, Any]:
    return rpc("tools/call", id_, name=name, arguments=arguments)


def assert_clean(response: httpx.Response, *secrets: str) -> None:
    assert "Traceback" not in response.text
    for secret in secrets:
        assert secret not in response.text


@tool(read_only=True)
def add(a: int, b: int = 2) -> int:
    """Add two integers."""
    return a + b


@tool
async def whoami(ctx: ToolContext) -> str:
    await asyncio.sleep(0)
    return f"run {ctx.run_id}"


@tool
def explode() -> str:
    raise RuntimeError("kaboom")


def test_official_client_initializes_lists_and_calls_tools_in_process() -> None:
    require_mcp_sdk()
    todos: list[str] = []

    @tool
    def add_todo(title: str) -> str:
        """Add a todo; the list lives in this test's closure."""
        todos.append(title)
        return f"{len(todos)} todos"

    async def main() -> None:
        async with await start_host_tool_bridge() as bridge:
            registration = bridge.register("run-1", [add, whoami, add_todo])
            assert registration.url == f"http://127.0.0.1:{bridge.port}/runs/run-1/mcp"
            async with sdk_session(registration.url, registration.headers) as session:
                init = await session.initialize()
                assert init.server_info.name == "boxwright"
                assert init.protocol_version in ("2025-06-18", "2025-11-25")
                listed = await session.list_tools()
                by_name = {t.name: t for t in listed.tools}
                assert list(by_name) == ["add", "whoami", "add_todo"]
                assert by_name["add"].annotations is not None and by_name["add"].annotations.read_only_hint is True
                assert by_name["add"].input_schema["required"] == ["a"]
                assert by_name["add_todo"].description.startswith("Add a todo")

                sync_result = await session.call_tool("add", {"a": 40})
                assert (sync_result.is_error, sdk_text(sync_result)) == (False, "42")
                assert sync_result.structured_content is None
                async_result = await session.call_tool("whoami", {})
                assert sdk_text(async_result) == "run run-1"
                assert sdk_text(await session.call_tool("add_todo", {"title": "write tests"})) == "1 todos"
                assert sdk_text(await session.call_tool("add_todo", {"title": "ship"})) == "2 todos"
                bad = await session.call_tool("add", {"a": "forty"})
                assert bad.is_error is True and "`$.a`" in sdk_text(bad)
                failed = await session.call_tool("add_todo", {})
                assert failed.is_error is True and "`title`" in sdk_text(failed)
            assert todos == ["write tests", "ship"]  # the tool ran here, in this process
            assert [r.name for r in registration.core.history] == [
                "add",
                "whoami",
                "add_todo",
                "add_todo",
                "add",
                "add_todo",
            ]

    asyncio.run(main())


def test_sdk_auto_negotiation_falls_back_to_initialize() -> None:
    require_mcp_sdk()
    try:
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client
    except ImportError:
        pytest.skip("mcp 1.x has no Client with server/discover negotiation")

    async def main() -> None:
        async with await start_host_tool_bridge() as bridge:
            registration = bridge.register("run-auto", [add])
            async with (
                httpx2.AsyncClient(headers=registration.headers, timeout=10) as http,
                Client(streamable_http_client(registration.url, http_client=http)) as client,
            ):
                assert client.protocol_version == "2025-11-25"
                result = await client.call_tool("add", {"a": 1, "b": 1})
                assert sdk_text(result) == "2"

    asyncio.run(main())


def test_missing_or_wrong_token_is_401_and_the_tool_does_not_run() -> None:
    require_mcp_sdk()
    calls: list[int] = []

    @tool
    def counted() -> str:
        calls.append(1)
        return "ran"

    async def main() -> None:
        async with await start_host_tool_bridge() as bridge, httpx.AsyncClient(timeout=10) as http:
            registration = bridge.register("run-auth", [counted])
            other = bridge.register("run-other", [counted])
            token = registration.token
            attempts: list[dict[str, str]] = [
                {},
                {"Authorization": "Bearer " + "0" * len(token)},
                {"Authorization": token},  # a bare token is not a bearer header
                {"Authorization": "Basic " + token},
                {"Authorization": f"bearer {token}"},
                {"Authorization": f"Bearer {token}x"},
                {"Authorization": f"Bearer {token[:-1]}"},
                {"Authorization": f"Bearer  {token}"},
                other.headers,  # another run's valid token
            ]
            for headers in attempts:
                response = await http.post(registration.url, json=call("counted", {}), headers={**ACCEPT, **headers})
                assert response.status_code == 401, headers
                assert response.headers["www-authenticate"] == "Bearer"
                assert_clean(response, token, other.token)
            # Two Authorization headers never pass, even when one of them is right.
            doubled = await http.post(
                registration.url,
                json=call("counted", {}),
                headers=httpx.Headers([("Authorization", "Bearer x"), ("Authorization", f"Bearer {token}")]),
            )
            assert doubled.status_code == 401
            began = time.monotonic()
            with pytest.raises(BaseException):  # noqa: B017 - the SDK wraps its HTTP error in task-group groups
                async with sdk_session(registration.url, {"Authorization": "Bearer wrong"}) as session:
                    await asyncio.wait_for(session.initialize(), 10)
            assert time.monotonic() - began < 10
            assert calls == []
            ok = await http.post(registration.url, json=call("counted", {}), headers={**ACCEPT, **registration.headers})
            assert ok.status_code == 200 and calls == [1]

    asyncio.run(main())


def test_bad_input_gets_the_right_error_and_never_a_500() -> None:
    async def main() -> None:
        async with await start_host_tool_bridge() as bridge, httpx.AsyncClient(timeout=10) as http:
            registration = bridge.register("run-bad", [add, explode])
            url, token = registration.url, registration.token
            headers = {**ACCEPT, **registration.headers}

            async def post(body: Any = None, *, content: Any = None, **extra: str) -> httpx.Response:
                if content is None:
                    response = await http.post(url, json=body, headers={**headers, **extra})
                else:
                    response = await http.post(url, content=content, headers={**headers, **extra})
                assert response.status_code != 500
                assert_clean(response, token)
                return response

            malformed = await post(content=b'{"jsonrpc": "2.0", "id": 1, "method": ')
            assert malformed.status_code == 400
            assert malformed.json() == {
                "jsonrpc": "2.0",
                "id": None,
                "error": {"code": -32700, "message": "Parse error"},
            }
            not_utf8 = await post(content=b'{"jsonrpc":"2.0","id":1,"method":"\xff"}')
            assert not_utf8.status_code == 400 and not_utf8.json()["error"]["code"] == -32700

            batch = await post([rpc("ping", 1), rpc("ping", 2)])
            assert batch.status_code == 400 and batch.json()["error"]["code"] == -32600
            assert batch.json()["id"] is None

            unknown_method = await post(rpc("resources/list", 3))
            assert unknown_method.status_code == 200
            assert unknown_method.json()["error"]["code"] == -32601 and unknown_method.json()["id"] == 3

            unknown_tool = await post(call("nope", {}, 4))
            assert unknown_tool.json() == {
                "jsonrpc": "2.0",
                "id": 4,
                "error": {"code": -32602, "message": "Unknown tool: nope"},
            }

            bad_args = (await post(call("add", {"a": [1]}, 5))).json()["result"]
            assert bad_args["isError"] is True and "`$.a`" in bad_args["content"][0]["text"]

            raised = (await post(call("explode", {}, 6))).json()["result"]
            assert raised == {"content": [{"type": "text", "text": "Tool execution failed: kaboom"}], "isError": True}

            notification = await post(rpc("notifications/initialized", None))
            assert notification.status_code == 202 and notification.content == b""

            stream_only = await post(rpc("ping", 7), Accept="text/event-stream")
            assert stream_only.headers["content-type"].startswith("text/event-stream")
            assert stream_only.text == 'event: message\ndata: {"jsonrpc":"2.0","id":7,"result":{}}\n\n'

            # httpx will not send a broken Content-Length, so a raw socket does.
            reader, writer = await asyncio.open_connection("127.0.0.1", bridge.port)
            path = url.split(str(bridge.port), 1)[1]
            writer.write(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                "Content-Length: x\r\n\r\n{}".encode()
            )
            status_line = await asyncio.wait_for(reader.readline(), 5)
            writer.close()
            assert status_line.split()[1] == b"400"

            for method in ("GET", "DELETE", "PUT"):
                response = await http.request(method, url, headers=headers)
                assert response.status_code == 405 and response.headers["allow"] == "POST"
            assert (await http.get(url)).status_code == 401  # the bearer check comes first

            for path in ("/runs/nope/mcp", "/mcp", "/runs/run-bad/mcp/extra", "/"):
                response = await http.post(bridge.base_url + path, json=rpc("ping"), headers=headers)
                assert response.status_code == 404

            # 10 MiB, declared or streamed, is refused quickly and never buffered.
            big = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"' + b"a" * (10 << 20) + b'"}}'

            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(10):
                    yield b"a" * (1 << 20)

            for content in (big, chunks()):
                began = time.monotonic()
                too_large = await http.post(url, content=content, headers=headers)
                assert too_large.status_code == 413
                assert time.monotonic() - began < 2
            # The listener still serves normal requests afterwards.
            assert (await post(rpc("ping", 8))).json() == {"jsonrpc": "2.0", "id": 8, "result": {}}

    asyncio.run(main())


def test_one_listener_keeps_runs_apart() -> None:
    alpha_calls: list[str] = []
    beta_calls: list[str] = []

    @tool(name="note")
    def note_alpha(text: str) -> str:
        alpha_calls.append(text)
        return "alpha"

    @tool(name="note")
    def note_beta(text: str) -> str:
        beta_calls.append(text)
        return "beta"

    @tool
    def beta_only() -> str:
        return "b"

    async def main() -> None:
        async with await start_host_tool_bridge() as bridge, httpx.AsyncClient(timeout=10) as http:
            alpha = bridge.register("alpha", [note_alpha])
            beta = bridge.register("beta", [note_beta, beta_only])
            assert alpha.token != beta.token and alpha.token.startswith(TOKEN_PREFIX) and len(alpha.token) >= 47
            assert alpha.token not in repr(alpha)

            async def post(url: str, token_of: Any, body: dict[str, Any]) -> httpx.Response:
                return await http.post(url, json=body, headers={**ACCEPT, **token_of.headers})

            # Crossing tokens is refused both ways, and nothing runs.
            assert (await post(alpha.url, beta, call("note", {"text": "x"}))).status_code == 401
            assert (await post(beta.url, alpha, call("note", {"text": "x"}))).status_code == 401
            assert alpha_calls == beta_calls == []
            # Each run reaches only its own tools.
            listed = (await post(alpha.url, alpha, rpc("tools/list"))).json()["result"]["tools"]
            assert [t["name"] for t in listed] == ["note"]
            assert (await post(alpha.url, alpha, call("beta_only", {}))).json()["error"]["code"] == -32602
            assert (await post(alpha.url, alpha, call("note", {"text": "a1"}))).json()["result"]["content"][0][
                "text"
            ] == "alpha"
            assert (await post(beta.url, beta, call("note", {"text": "b1"}))).json()["result"]["content"][0][
                "text"
            ] == "beta"
            assert (alpha_calls, beta_calls) == (["a1"], ["b1"])
            # A closed run is gone (404) while the other keeps working; its id can be registered again.
            alpha.close()
            alpha.close()
            assert (await post(alpha.url, alpha, rpc("ping"))).status_code == 404
            assert (await post(beta.url, beta, rpc("ping"))).status_code == 200
            with pytest.raises(ToolBridgeConfigError):
                bridge.register("beta", [beta_only])
            again = bridge.register("alpha", [note_alpha])
            assert again.token != alpha.token
            assert (await post(again.url, again, rpc("ping"))).status_code == 200

    asyncio.run(main())


def test_run_ids_are_path_encoded_and_closing_aborts_in_flight_calls() -> None:
    @tool
    async def wait_forever() -> str:
        await asyncio.sleep(60)
        return "never"

    async def main() -> None:
        async with await start_host_tool_bridge() as bridge, httpx.AsyncClient(timeout=10) as http:
            # A "/" is no part of a run id any more (boxwright.ids); everything else odd is escaped.
            run_id = "team:\u03b1 run?#1%"
            registration = bridge.register(run_id, [wait_forever, add])
            assert registration.url.endswith("/runs/team%3A%CE%B1%20run%3F%231%25/mcp")
            headers = {**ACCEPT, **registration.headers}
            ok = await http.post(registration.url, json=call("add", {"a": 1}), headers=headers)
            assert ok.json()["result"]["content"][0]["text"] == "3"

            pending = asyncio.create_task(http.post(registration.url, json=call("wait_forever", {}), headers=headers))
            await asyncio.sleep(0.1)
            began = time.monotonic()
            registration.close()
            response = await asyncio.wait_for(pending, 5)
            assert time.monotonic() - began < 2
            result = response.json()["result"]
            assert result["isError"] is True and result["content"][0]["text"].startswith(
                "Tool execution failed: aborted"
            )

        with pytest.raises(InvalidRunIdError, match="lone surrogate"):
            ToolBridgeApp().register("\ud800", [add])
        with pytest.raises(ToolBridgeConfigError):
            ToolBridgeApp(base_url="http://h").register("r", [add], token="short")

    asyncio.run(main())


def test_host_for_sandbox_table_and_bridge_urls() -> None:
    assert host_for_sandbox("local-process") == "127.0.0.1"
    assert host_for_sandbox("bubblewrap") == "127.0.0.1"
    assert host_for_sandbox("docker") == "host.docker.internal"
    assert host_for_sandbox("sbx") == "host.docker.internal"
    with pytest.raises(ToolBridgeConfigError, match="public_url"):
        host_for_sandbox("e2b")
    assert bind_address_for("local-process") == "127.0.0.1"
    assert bind_address_for("e2b") == "127.0.0.1"
    docker_bind = bind_address_for("docker")
    assert docker_bind == "127.0.0.1" or docker_bind.count(".") == 3  # the docker0 gateway when it exists

    async def main() -> None:
        bridge: HostToolBridge
        async with await start_host_tool_bridge(provider="docker", host="127.0.0.1") as bridge:
            assert bridge.url_for("r1") == f"http://host.docker.internal:{bridge.port}/runs/r1/mcp"
        async with await start_host_tool_bridge(provider="e2b", public_url="https://bridge.example.com/") as bridge:
            assert bridge.host == "127.0.0.1"
            registration = bridge.register("r1", [add])
            assert registration.url == "https://bridge.example.com/runs/r1/mcp"
            # The URL comes from configuration only: a request's Host header changes nothing.
            async with httpx.AsyncClient(timeout=10) as http:
                local = f"http://127.0.0.1:{bridge.port}/runs/r1/mcp"
                hostile = {"Host": "evil.example", "X-Forwarded-Host": "evil.example"}
                response = await http.post(
                    local, json=rpc("ping"), headers={**ACCEPT, **registration.headers, **hostile}
                )
                assert response.status_code == 200
            assert bridge.url_for("r1") == registration.url
        with pytest.raises(ToolBridgeConfigError):
            await start_host_tool_bridge(provider="e2b")

    asyncio.run(main())
