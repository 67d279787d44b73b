"""The runner's tool-exec calls while no host answers: held for a successor, bounded, and never sent twice.

Real servers on 127.0.0.1: the host's tool-exec app under uvicorn, and a raw socket that takes a request and dies.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from boxwright.errors import RemoteToolError
from boxwright.runner.tool_exec import ToolExecTarget, held_tool_exec_client
from boxwright.tool_bridge import tool
from boxwright.tool_bridge.asgi import serve_asgi
from boxwright.tool_bridge.remote import ToolExecRun, http_remote_tool_executor, tool_exec_app, tool_exec_path


def dead_url() -> str:
    """A URL on a port nothing listens on (bound, then closed): a connect there is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}{tool_exec_path('r1')}?threadId=t1"


def test_a_call_no_host_answers_is_held_until_a_successor_is_pointed_to() -> None:
    ran: list[str] = []

    @tool(read_only=True)
    def get_todos(status: str = "open") -> str:
        """List the todos."""
        ran.append(status)
        return f"todos [{status}]"

    async def main() -> object:
        target = ToolExecTarget(dead_url(), "the-dead-hosts-token")
        client = held_tool_exec_client(target, hold=30.0)
        executor = http_remote_tool_executor(target.url, target.token, client=client)
        try:
            call = asyncio.ensure_future(executor("get_todos", {"status": "open"}))
            await asyncio.sleep(1.5)  # refused more than once meanwhile: held, not failed
            assert not call.done(), call
            server = await serve_asgi(
                tool_exec_app({"r1": ToolExecRun([get_todos], token="successor-token", thread_id="t1")})
            )
            try:
                target.repoint(f"http://127.0.0.1:{server.port}{tool_exec_path('r1')}?threadId=t1", "successor-token")
                return await asyncio.wait_for(call, 10)
            finally:
                await server.close()
        finally:
            await client.aclose()

    assert asyncio.run(main()) == "todos [open]"
    assert ran == ["open"], "the held call ran once, on the host it was re-pointed to"


def test_past_the_bound_a_held_call_fails_with_an_error_naming_the_wait() -> None:
    async def main() -> None:
        target = ToolExecTarget(dead_url(), "token")
        client = held_tool_exec_client(target, hold=0.5)
        try:
            with pytest.raises(RemoteToolError) as caught:
                await asyncio.wait_for(http_remote_tool_executor(target.url, "token", client=client)("x", {}), 10)
        finally:
            await client.aclose()
        message = str(caught.value)
        assert "no host answered tool-exec for 0.5 s" in message and "no successor attached" in message, message
        assert "token" not in message.replace("tool-exec", "")

    asyncio.run(main())


def test_a_call_whose_reply_was_lost_is_not_sent_again() -> None:
    async def main() -> int:
        connections = 0

        async def take_and_die(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            await reader.readuntil(b"\r\n\r\n")  # the request reached this host: the tool may have run
            writer.close()

        server = await asyncio.start_server(take_and_die, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        target = ToolExecTarget(f"http://127.0.0.1:{port}/tool-exec/r1", "token")
        client = held_tool_exec_client(target, hold=30.0)
        try:
            with pytest.raises(RemoteToolError) as caught:
                await asyncio.wait_for(http_remote_tool_executor(target.url, "token", client=client)("x", {}), 10)
            assert "it may have run, so it is not sent again" in str(caught.value), caught.value
        finally:
            await client.aclose()
            server.close()
            await server.wait_closed()
        return connections

    assert asyncio.run(main()) == 1
