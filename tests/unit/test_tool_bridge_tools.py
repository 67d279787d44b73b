"""Declaring tools: schema from type hints, argument checking, ToolContext, threads and aborts."""

from __future__ import annotations

import asyncio
import inspect
import threading
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import pytest

from boxwright.abort import AbortController
from boxwright.agent import run_agent
from boxwright.definition import define_sandbox
from boxwright.errors import AbortError, ToolArgumentsError, ToolDefinitionError
from boxwright.events import RunErrorEvent
from boxwright.harnesses.command import command_harness
from boxwright.providers import local_process_sandbox
from boxwright.tool_bridge import Tool, ToolContext, as_tool, as_tools, define_tool, invoke_tool, tool


class Address(msgspec.Struct):
    city: str
    zip_code: str | None = None


@tool
def add_contact(
    name: Annotated[str, msgspec.Meta(description="full name")],
    age: int,
    address: Address | None = None,
    kind: Literal["friend", "work"] = "friend",
    tags: list[str] = [],  # noqa: B006 - msgspec copies mutable defaults per call
) -> dict[str, Any]:
    """Add a contact to the address book."""
    return {"name": name, "age": age, "city": address.city if address else None, "kind": kind, "tags": tags}


class Opaque:
    """Not a type msgspec can describe."""


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_schema_comes_from_the_signature_and_the_docstring() -> None:
    assert isinstance(add_contact, Tool)
    assert add_contact.name == "add_contact"
    assert add_contact.description == "Add a contact to the address book."
    schema = add_contact.input_schema
    assert schema["type"] == "object"
    assert schema["required"] == ["name", "age"]  # defaults make a parameter optional
    assert schema["additionalProperties"] is False
    assert "title" not in schema
    props = schema["properties"]
    assert props["name"] == {"type": "string", "description": "full name"}
    assert props["age"] == {"type": "integer"}
    assert props["kind"] == {"enum": ["friend", "work"], "default": "friend"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "default": []}
    # A nested Struct is described once under $defs and referenced from the property.
    assert props["address"]["anyOf"][0] == {"$ref": "#/$defs/Address"}
    assert schema["$defs"]["Address"]["required"] == ["city"]
    assert add_contact.read_only is False and add_contact.structured_output is False


def test_arguments_are_converted_before_the_call() -> None:
    args = {"name": "Ada", "age": 36, "address": {"city": "London"}, "tags": ["math"]}
    value = run(invoke_tool(add_contact, args, ToolContext()))
    assert value == {"name": "Ada", "age": 36, "city": "London", "kind": "friend", "tags": ["math"]}


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ({"name": "Ada", "age": "36"}, "`$.age`"),
        ({"name": "Ada"}, "`age`"),
        ({"name": "Ada", "age": 1, "agee": 2}, "`agee`"),
        ({"name": "Ada", "age": 1, "address": {"city": 5}}, "`$.address.city`"),
        ({"name": "Ada", "age": 1, "kind": "enemy"}, "`$.kind`"),
    ],
)
def test_bad_arguments_raise_an_error_naming_the_field(args: dict[str, Any], named: str) -> None:
    with pytest.raises(ToolArgumentsError) as info:
        run(invoke_tool(add_contact, args, ToolContext()))
    assert info.value.tool_name == "add_contact"
    assert named in str(info.value)


def test_decorator_forms_and_options() -> None:
    @tool()
    async def ping() -> str:
        return "pong"

    @tool(name="lookup-user", description="Find a user.", read_only=True, structured_output=True)
    def find(user_id: int) -> dict[str, int]:
        """Ignored: description= wins."""
        return {"id": user_id}

    assert (ping.name, ping.description, ping.input_schema) == (
        "ping",
        "",
        {"type": "object", "properties": {}, "additionalProperties": False},
    )
    assert (find.name, find.description, find.read_only, find.structured_output) == (
        "lookup-user",
        "Find a user.",
        True,
        True,
    )
    assert find.fn is not None and find.fn(3) == {"id": 3}  # the function stays callable for unit tests


@pytest.mark.parametrize("bad", ["", "has space", "dots.not.allowed", "x" * 65, "naïve"])
def test_tool_names_must_suit_every_client(bad: str) -> None:
    with pytest.raises(ToolDefinitionError):
        define_tool(bad, "", {"type": "object"}, lambda args, ctx: None)


def test_signatures_without_a_schema_are_refused() -> None:
    def variadic(*items: int) -> int:
        return len(items)

    def keywords(**options: str) -> int:
        return len(options)

    def opaque(thing: Opaque) -> None:
        return None

    for fn in (variadic, keywords, opaque):
        with pytest.raises(ToolDefinitionError) as info:
            tool(fn)
        assert fn.__name__ in str(info.value)
        assert "JSON Schema" in str(info.value)


def test_context_parameter_is_injected_and_not_in_the_schema() -> None:
    seen: list[ToolContext] = []

    @tool
    async def whoami(ctx: ToolContext, /, shout: bool = False) -> str:
        seen.append(ctx)
        text = f"{ctx.run_id}/{ctx.thread_id}/{ctx.context['user']}"
        return text.upper() if shout else text

    assert "ctx" not in whoami.input_schema["properties"]
    assert list(whoami.input_schema["properties"]) == ["shout"]
    ctx = ToolContext(run_id="r7", thread_id="t1", context={"user": "ada"})
    assert run(invoke_tool(whoami, {"shout": True}, ctx)) == "R7/T1/ADA"
    assert seen == [ctx]


def test_sync_tools_run_in_a_worker_thread_and_emit_events_on_the_loop() -> None:
    threads: dict[str, int] = {}
    events: list[tuple[str, Any, int]] = []

    @tool
    def blocking(ctx: ToolContext) -> str:
        threads["tool"] = threading.get_ident()
        ctx.emit_custom_event("progress", {"pct": 50})
        return "done"

    @tool
    async def nonblocking() -> str:
        threads["async"] = threading.get_ident()
        return "done"

    assert blocking.threaded is True and nonblocking.threaded is False

    async def main() -> None:
        threads["loop"] = threading.get_ident()

        def emit(name: str, value: Any) -> None:
            events.append((name, value, threading.get_ident()))

        assert await invoke_tool(blocking, {}, ToolContext(emit_custom_event=emit)) == "done"
        assert await invoke_tool(nonblocking, {}, ToolContext()) == "done"
        await asyncio.sleep(0)  # the hop back is a call_soon_threadsafe callback

    run(main())
    assert threads["tool"] != threads["loop"]
    assert threads["async"] == threads["loop"]
    assert events == [("progress", {"pct": 50}, threads["loop"])]


def test_define_tool_keeps_a_raw_execute_and_normalises_a_non_object_schema() -> None:
    calls: list[dict[str, Any]] = []

    async def execute(args: dict[str, Any], ctx: ToolContext) -> str:
        calls.append(args)
        return "ok"

    raw = define_tool("raw", "Raw tool.", {"type": "string"}, execute, read_only=True)
    assert raw.input_schema == {"type": "object", "properties": {}}
    assert raw.threaded is False and raw.read_only is True
    assert run(invoke_tool(raw, {"anything": [1, 2]}, ToolContext())) == "ok"
    assert calls == [{"anything": [1, 2]}]

    kept = define_tool("kept", "", {"type": "object", "properties": {"q": {"type": "string"}}}, lambda a, c: a["q"])
    assert kept.input_schema["properties"] == {"q": {"type": "string"}}
    assert kept.threaded is True
    assert run(invoke_tool(kept, {"q": "x"}, ToolContext())) == "x"


def test_an_abort_cancels_the_tool_but_not_the_caller() -> None:
    @tool
    async def slow() -> str:
        await asyncio.sleep(30)
        return "never"

    async def main() -> None:
        controller = AbortController()
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, controller.abort, "stop now")
        began = loop.time()
        with pytest.raises(AbortError) as info:
            await invoke_tool(slow, {}, ToolContext(), signal=controller.signal)
        assert info.value.reason == "stop now"
        assert loop.time() - began < 5
        current = asyncio.current_task()
        assert current is not None and current.cancelling() == 0
        await asyncio.sleep(0)  # the caller's task is still usable
        # An already-aborted signal refuses to start the tool at all.
        with pytest.raises(AbortError):
            await invoke_tool(slow, {}, ToolContext(), signal=controller.signal)

    run(main())


def test_cancelling_the_caller_is_not_mistaken_for_an_abort() -> None:
    @tool
    async def slow() -> str:
        await asyncio.sleep(30)
        return "never"

    async def main() -> None:
        controller = AbortController()
        task = asyncio.create_task(invoke_tool(slow, {}, ToolContext(), signal=controller.signal))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not controller.signal.aborted

    run(main())


# -- plain functions as tools, and what is not a tool ------------------------------------------------


def get_todos(status: Literal["open", "done"] = "open") -> list[str]:
    """The app's todos."""
    return [f"{status}: buy milk"]


async def fetch_user(user_id: int) -> dict[str, int]:
    """One user by id."""
    return {"id": user_id}


def test_a_decorated_function_can_still_be_called_as_the_function() -> None:
    assert add_contact("Ada", 36) == {"name": "Ada", "age": 36, "city": None, "kind": "friend", "tags": []}
    fetch = tool(fetch_user)
    assert run(fetch(7)) == {"id": 7}  # an async tool still returns its coroutine
    # Introspection sees the function, not the wrapper.
    assert list(inspect.signature(add_contact).parameters) == ["name", "age", "address", "kind", "tags"]
    raw = define_tool("raw", "", {"type": "object"}, lambda args, ctx: None)
    with pytest.raises(TypeError, match="invoke_tool"):
        raw()


def test_any_typed_callable_is_a_tool_named_and_described_by_itself() -> None:
    declared = as_tools([get_todos, fetch_user, add_contact])
    assert [t.name for t in declared] == ["get_todos", "fetch_user", "add_contact"]
    assert declared[2] is add_contact
    todos, fetch = declared[0], declared[1]
    assert todos.description == "The app's todos." and fetch.description == "One user by id."
    assert todos.input_schema == tool(get_todos).input_schema
    assert todos.input_schema["properties"]["status"] == {"enum": ["done", "open"], "default": "open"}
    assert fetch.input_schema["required"] == ["user_id"]
    assert (todos.threaded, fetch.threaded) == (True, False)
    assert run(invoke_tool(todos, {"status": "done"}, ToolContext())) == ["done: buy milk"]
    assert run(invoke_tool(fetch, {"user_id": 3}, ToolContext())) == {"id": 3}
    assert as_tools(None) == [] and as_tool(get_todos).name == "get_todos"


class Client:
    """A class: its call builds an object, it is no tool."""


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (["get_todos"], "'get_todos' (a str)"),
        ([get_todos, None], "None (a NoneType)"),
        ([Client], "Client (a type)"),
        ([get_todos, {"name": "x"}], "{'name': 'x'} (a dict)"),
    ],
)
def test_a_value_that_is_not_a_tool_is_refused_naming_it_and_how_to_declare_one(value: Any, named: str) -> None:
    with pytest.raises(ToolDefinitionError) as info:
        as_tools(value)
    message = str(info.value)
    assert named in message, message
    assert f"tools[{len(value) - 1}]" in message
    assert "@tool" in message and "typed function" in message


@pytest.mark.parametrize("value", [get_todos, add_contact, "get_todos", {"get_todos": get_todos}])
def test_tools_must_be_a_list(value: Any) -> None:
    with pytest.raises(ToolDefinitionError, match=r"tools takes a list of tools, e\.g\. tools=\[get_todos\]"):
        as_tools(value)


def test_two_tools_of_one_name_are_refused_before_any_bridge() -> None:
    with pytest.raises(ToolDefinitionError, match="two tools share this name") as info:
        as_tools([get_todos, tool(get_todos)])
    assert info.value.tool_name == "get_todos"


def test_run_agent_refuses_a_non_tool_before_any_sandbox_exists(tmp_path: Path) -> None:
    base = tmp_path / "sandboxes"
    sandbox = define_sandbox("tools", local_process_sandbox(base_dir=base))

    async def main() -> list[Any]:
        stream = run_agent(
            sandbox, command_harness("echo hi"), "hi", thread_id="t", run_id="r", tools=[get_todos, "oops"]
        )
        return [event async for event in stream]

    events = run(main())
    assert [e.type for e in events] == ["RUN_STARTED", "RUN_ERROR"]
    error = events[-1]
    assert isinstance(error, RunErrorEvent) and error.code == "invalid_input"
    assert "'oops' (a str)" in error.message and "@tool" in error.message
    assert not base.exists() or not any(base.iterdir()), "no sandbox may be created for a bad tools list"
