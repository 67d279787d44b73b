"""The transport-free bridge: tools/call results, history, bridge events, aborts, and the JSON-RPC dispatcher."""

from __future__ import annotations

import asyncio
import importlib.metadata
import re
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boxwright.abort import AbortController
from boxwright.errors import ToolDefinitionError, UnknownToolError
from boxwright.tool_bridge import (
    BRIDGE_FAILED_EVENT,
    BRIDGE_FINISHED_EVENT,
    BRIDGE_STARTED_EVENT,
    LATEST_PROTOCOL_VERSION,
    SUPPORTED_PROTOCOL_VERSIONS,
    ToolBridgeCore,
    ToolContext,
    create_tool_bridge_core,
    define_tool,
    handle_json_rpc,
    tool,
)


class Point(msgspec.Struct):
    x: int
    y: int


@tool(read_only=True)
def add(a: int, b: int = 2) -> int:
    """Add two integers."""
    return a + b


@tool
async def echo(text: str) -> str:
    return text


@tool
def point(x: int, y: int) -> Point:
    return Point(x, y)


@tool
async def nothing() -> None:
    return None


@tool
async def explode(message: str = "boom") -> str:
    raise RuntimeError(message)


@tool(structured_output=True)
def stats(n: int) -> dict[str, int]:
    return {"n": n, "square": n * n}


@tool(structured_output=True)
def count(n: int) -> int:
    return n


@tool
async def slow() -> str:
    await asyncio.sleep(30)
    return "never"


TOOLS = [add, echo, point, nothing, explode, stats, count, slow]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def text_of(result: dict[str, Any]) -> str:
    [block] = result["content"]
    assert block["type"] == "text"
    text: str = block["text"]
    return text


def test_list_tools_shapes_each_entry() -> None:
    core = create_tool_bridge_core(TOOLS)
    listing = {entry["name"]: entry for entry in core.list_tools()}
    assert list(listing) == [t.name for t in TOOLS]
    assert listing["add"] == {
        "name": "add",
        "description": "Add two integers.",
        "inputSchema": add.input_schema,
        "annotations": {"readOnlyHint": True},
    }
    assert "annotations" not in listing["echo"]  # only read-only tools carry the hint


def test_results_are_one_text_block_and_structured_content_only_when_declared() -> None:
    core = create_tool_bridge_core(TOOLS)

    async def main() -> None:
        verbatim = await core.call_tool("echo", {"text": '{"not": "re-encoded"}'})
        assert text_of(verbatim) == '{"not": "re-encoded"}'
        assert verbatim == {"content": verbatim["content"], "isError": False}  # no structuredContent by default
        assert text_of(await core.call_tool("add", {"a": 1})) == "3"
        assert text_of(await core.call_tool("point", {"x": 1, "y": 2})) == '{"x":1,"y":2}'
        assert text_of(await core.call_tool("nothing", None)) == "null"
        structured = await core.call_tool("stats", {"n": 3})
        assert structured["structuredContent"] == {"n": 3, "square": 9}
        assert text_of(structured) == '{"n":3,"square":9}'
        # A value that is not an object is wrapped, as the MCP spec requires an object there.
        assert (await core.call_tool("count", {"n": 4}))["structuredContent"] == {"result": 4}

    run(main())


def test_failures_become_error_results_and_never_raise() -> None:
    core = create_tool_bridge_core(TOOLS)

    async def main() -> None:
        raised = await core.call_tool("explode", {"message": "disk on fire"})
        assert raised["isError"] is True
        assert text_of(raised) == "Tool execution failed: disk on fire"
        invalid = await core.call_tool("add", {"a": "one"})
        assert invalid["isError"] is True
        assert "`$.a`" in text_of(invalid) and "Invalid arguments" in text_of(invalid)
        not_an_object = await core.call_tool("add", [1, 2])  # type: ignore[arg-type]
        assert not_an_object["isError"] is True and "must be an object" in text_of(not_an_object)
        with pytest.raises(UnknownToolError, match="Unknown tool: nope"):
            await core.call_tool("nope", {})

    run(main())


def test_history_and_bridge_events_record_every_call() -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    core = create_tool_bridge_core(
        TOOLS, run_id="r7", thread_id="t1", emit_custom_event=lambda name, value: events.append((name, value))
    )

    async def main() -> None:
        await core.call_tool("add", {"a": 1, "b": 1})
        await core.call_tool("explode", {})

    run(main())
    first, second = (r.call_id for r in core.history)
    assert re.fullmatch(r"r7-bridge-[0-9a-f]{6}-0", first) and second == first[:-1] + "1"
    assert [(r.call_id, r.name, r.args, r.ok, r.error) for r in core.history] == [
        (first, "add", {"a": 1, "b": 1}, True, None),
        (second, "explode", {}, False, "boom"),
    ]
    assert all(r.duration_ms >= 0 for r in core.history)
    wire = msgspec.json.decode(msgspec.json.encode(core.history[0]))
    assert set(wire) == {"callId", "name", "args", "ok", "durationMs"}  # camelCase, no null error
    assert [(name, value["callId"]) for name, value in events] == [
        (BRIDGE_STARTED_EVENT, first),
        (BRIDGE_FINISHED_EVENT, first),
        (BRIDGE_STARTED_EVENT, second),
        (BRIDGE_FAILED_EVENT, second),
    ]
    assert events[0][1] == {"callId": first, "toolName": "add", "args": {"a": 1, "b": 1}}
    assert events[3][1]["error"] == "boom" and events[3][1]["toolName"] == "explode"


def test_a_second_registration_of_a_run_never_reuses_a_call_id() -> None:
    # A successor host registers the run again: its first call must not collide with the first one stored.
    ids = []
    for _ in range(2):
        core = create_tool_bridge_core(TOOLS, run_id="r7", thread_id="t1")
        run(core.call_tool("add", {"a": 1, "b": 1}))
        ids.append(core.history[0].call_id)
    assert ids[0] != ids[1]


def test_a_failing_event_sink_does_not_fail_the_call() -> None:
    def sink(name: str, value: Any) -> None:
        raise RuntimeError("sink down")

    core = create_tool_bridge_core(TOOLS, emit_custom_event=sink)
    result = run(core.call_tool("add", {"a": 40}))
    assert text_of(result) == "42" and result["isError"] is False
    assert core.history[0].ok


def test_tools_receive_the_run_context() -> None:
    @tool
    async def whoami(ctx: ToolContext) -> str:
        ctx.emit_custom_event("tool.note", {"hello": ctx.context})
        return f"{ctx.run_id}:{ctx.thread_id}:{ctx.context}"

    events: list[str] = []
    core = create_tool_bridge_core(
        [whoami], context="db-session", run_id="r1", thread_id="t9", emit_custom_event=lambda n, v: events.append(n)
    )
    assert text_of(run(core.call_tool("whoami", {}))) == "r1:t9:db-session"
    assert events == [BRIDGE_STARTED_EVENT, "tool.note", BRIDGE_FINISHED_EVENT]


def test_an_abort_ends_in_flight_calls_with_an_error_result() -> None:
    async def main() -> None:
        controller = AbortController()
        core = create_tool_bridge_core(TOOLS, signal=controller.signal)
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, controller.abort, "run cancelled")
        began = loop.time()
        result = await core.call_tool("slow", {})
        assert loop.time() - began < 5
        assert result["isError"] is True and text_of(result) == "Tool execution failed: aborted: run cancelled"
        again = await core.call_tool("add", {"a": 1})  # nothing runs once the run is aborted
        assert again["isError"] is True
        assert [r.ok for r in core.history] == [False, False]

    run(main())


def test_duplicate_names_are_refused_and_the_permission_tool_is_listed_last() -> None:
    with pytest.raises(ToolDefinitionError):
        create_tool_bridge_core([add, add])
    approve = define_tool("approve", "Permission prompt.", {"type": "object"}, lambda a, c: {"behavior": "allow"})
    core = create_tool_bridge_core([echo, add], permission=approve)
    assert [t["name"] for t in core.list_tools()] == ["echo", "add", "approve"]
    assert text_of(run(core.call_tool("approve", {"tool_name": "Bash"}))) == '{"behavior":"allow"}'


# -- JSON-RPC --------------------------------------------------------------------------------------


def rpc(message: Any, core: ToolBridgeCore | None = None) -> dict[str, Any] | None:
    reply: dict[str, Any] | None = run(handle_json_rpc(core or create_tool_bridge_core(TOOLS), message))
    return reply


def error_code(reply: dict[str, Any] | None) -> int:
    assert reply is not None and reply["jsonrpc"] == "2.0"
    code: int = reply["error"]["code"]
    return code


@pytest.mark.parametrize("version", SUPPORTED_PROTOCOL_VERSIONS)
def test_initialize_echoes_a_supported_version(version: str) -> None:
    reply = rpc({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": version}})
    assert reply == {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "boxwright", "version": importlib.metadata.version("boxwright")},
        },
    }


@pytest.mark.parametrize("requested", ["1999-01-01", "2026-07-28", None, 20250618])
def test_initialize_answers_our_latest_version_otherwise(requested: Any) -> None:
    params = {} if requested is None else {"protocolVersion": requested}
    reply = rpc({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": params})
    assert reply is not None and reply["id"] == "init"
    assert reply["result"]["protocolVersion"] == LATEST_PROTOCOL_VERSION == "2025-11-25"


def test_methods_and_notifications() -> None:
    assert rpc({"jsonrpc": "2.0", "id": 2, "method": "ping"}) == {"jsonrpc": "2.0", "id": 2, "result": {}}
    listed = rpc({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"cursor": "ignored"}})
    assert listed is not None and [t["name"] for t in listed["result"]["tools"]][:2] == ["add", "echo"]
    called = rpc({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "add", "arguments": {"a": 2}}})
    assert called == {
        "jsonrpc": "2.0",
        "id": 4,
        "result": {"content": [{"type": "text", "text": "4"}], "isError": False},
    }
    no_arguments = rpc({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "nothing"}})
    assert no_arguments is not None and no_arguments["result"]["isError"] is False
    assert rpc({"jsonrpc": "2.0", "method": "notifications/initialized"}) is None
    assert rpc({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "add", "arguments": {"a": 1}}}) is None
    assert rpc({"jsonrpc": "2.0", "id": 9, "result": {}}) is None  # a client's response to nothing we asked


@pytest.mark.parametrize(
    ("message", "code", "reply_id"),
    [
        (["not", "a", "dict"], -32600, None),
        ([{"jsonrpc": "2.0", "id": 1, "method": "ping"}], -32600, None),  # batches are refused
        ([], -32600, None),
        (7, -32600, None),
        ("ping", -32600, None),
        (None, -32600, None),
        ({"jsonrpc": "1.0", "id": 1, "method": "ping"}, -32600, 1),
        ({"id": 1, "method": "ping"}, -32600, 1),
        ({"jsonrpc": "2.0", "id": None, "method": "ping"}, -32600, None),
        ({"jsonrpc": "2.0", "id": 1.5, "method": "ping"}, -32600, None),
        ({"jsonrpc": "2.0", "id": True, "method": "ping"}, -32600, None),
        ({"jsonrpc": "2.0", "id": [1], "method": "ping"}, -32600, None),
        ({"jsonrpc": "2.0", "id": 1, "method": 5}, -32600, 1),
        ({"jsonrpc": "2.0", "id": 1}, -32600, 1),
        ({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": "x"}, -32600, 1),
        ({"jsonrpc": "2.0", "method": 5}, -32600, None),  # malformed even without an id: answered
        ({"jsonrpc": "2.0", "id": "a", "method": "resources/list"}, -32601, "a"),
        ({"jsonrpc": "2.0", "id": 1, "method": "server/discover"}, -32601, 1),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": [1]}, -32602, 1),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": 3}}, -32602, 1),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {}}, -32602, 1),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "nope"}}, -32602, 1),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "add", "arguments": [1]}}, -32602, 1),
    ],
)
def test_dispatcher_error_codes(message: Any, code: int, reply_id: Any) -> None:
    reply = rpc(message)
    assert error_code(reply) == code
    assert reply is not None and reply["id"] == reply_id
    assert isinstance(reply["error"]["message"], str)


def test_named_error_messages() -> None:
    assert rpc({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": 3}}) == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {"code": -32602, "message": "Invalid params: name"},
    }
    unknown = rpc({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "nope"}})
    assert unknown is not None and unknown["error"]["message"] == "Unknown tool: nope"
    missing = rpc({"jsonrpc": "2.0", "id": 1, "method": "frobnicate"})
    assert missing is not None and missing["error"] == {
        "code": -32601,
        "message": "Method not found",
        "data": {"method": "frobnicate"},
    }


# -- property: the dispatcher never raises and always answers in shape -----------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
methods = st.sampled_from(
    ["initialize", "ping", "tools/list", "tools/call", "notifications/initialized", "server/discover", "x"]
) | st.text(max_size=10)
tool_names = st.sampled_from([t.name for t in TOOLS if t.name != "slow"] + ["nope"]) | json_scalars
call_params = st.fixed_dictionaries(
    {}, optional={"name": tool_names, "arguments": json_values | st.dictionaries(st.sampled_from("abnxy"), json_values)}
)
rpc_shaped = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.sampled_from(["2.0", "1.0", 2.0]) | json_scalars,
        "id": st.integers() | st.text(max_size=5) | json_values,
        "method": methods | json_scalars,
        "params": call_params | json_values,
        "result": json_values,
    },
)
KNOWN_CODES = {-32700, -32600, -32601, -32602, -32603}


def check_reply(message: Any, reply: Any) -> None:
    if reply is None:
        assert isinstance(message, dict)
        assert "id" not in message or "method" not in message
        return
    assert isinstance(reply, dict) and reply["jsonrpc"] == "2.0" and "id" in reply
    assert ("result" in reply) != ("error" in reply)
    reply_id = reply["id"]
    assert reply_id is None or isinstance(reply_id, str) or (type(reply_id) is int)
    if isinstance(message, dict) and reply_id is not None:
        assert reply_id == message["id"]
    if "error" in reply:
        assert reply["error"]["code"] in KNOWN_CODES and isinstance(reply["error"]["message"], str)
    msgspec.json.encode(reply)  # always sendable


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message=json_values | rpc_shaped)
def test_dispatcher_never_raises_on_arbitrary_input(message: Any) -> None:
    loop = asyncio.new_event_loop()
    try:
        core = create_tool_bridge_core([t for t in TOOLS if t.name != "slow"])
        reply = loop.run_until_complete(handle_json_rpc(core, message))
    finally:
        loop.close()
    check_reply(message, reply)
