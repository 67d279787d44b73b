"""Declaring the app's Python tools for the agent: a typed function becomes a name, a JSON Schema and a checked call.

The schema is derived with msgspec from the function's type hints, and the same Struct that
produced it converts the agent's arguments before the function runs, so the schema the agent is
shown and the check its arguments pass can never drift apart. Unknown argument names are refused
(``additionalProperties: false``): a model that misspells a field learns so at once instead of
having the value silently dropped.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Union, overload

import msgspec

from ..abort import AbortSignal
from ..errors import AbortError, ToolArgumentsError, ToolDefinitionError

__all__ = [
    "EMPTY_OBJECT_SCHEMA",
    "EmitCustomEvent",
    "Tool",
    "ToolContext",
    "ToolExecute",
    "as_tool",
    "as_tools",
    "define_tool",
    "invoke_tool",
    "object_schema",
    "tool",
]

# The strictest common rule among the clients: Anthropic's tool-name pattern, which Claude applies
# to the prefixed `mcp__boxwright__<name>` as well; MCP itself would also allow dots.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
EMPTY_OBJECT_SCHEMA: Mapping[str, Any] = {"type": "object", "properties": {}}


EmitCustomEvent = Callable[[str, Any], object]
"""``emit_custom_event(name, value)``: a CUSTOM event into the run's stream (its return value is ignored)."""


def _no_emit(name: str, value: Any) -> None:
    return None


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool may know about the call it serves; passed to a parameter annotated ``ToolContext``."""

    run_id: str | None = None
    thread_id: str | None = None
    abort_signal: AbortSignal = field(default_factory=AbortSignal)
    # Whatever the app handed to the bridge for this run (a DB session, a user, ...).
    context: Any = None
    emit_custom_event: EmitCustomEvent = _no_emit


ToolExecute = Callable[[dict[str, Any], ToolContext], Any]
"""``execute(args, ctx)``; may be sync or async (a sync one may also return an awaitable)."""


@dataclass(frozen=True, slots=True)
class Tool:
    """One tool the bridge serves. ``execute`` receives the raw argument object and a ``ToolContext``."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    execute: ToolExecute = field(repr=False)
    read_only: bool = False
    # Off by default: Claude's permission-prompt tool rejects a result that carries more than one text block.
    structured_output: bool = False
    # A sync tool runs in a worker thread, as the official SDK does: a blocking tool must not stall the
    # event loop that serves every run's bridge.
    threaded: bool = False
    fn: Callable[..., Any] | None = field(default=None, repr=False, compare=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the declared function itself: ``@tool`` must not take the function away from the app's code."""
        if self.fn is None:
            raise TypeError(
                f"tool {self.name!r} was built with define_tool from a raw execute(args, ctx); "
                "there is no function to call: use invoke_tool(tool, args, ctx)"
            )
        return self.fn(*args, **kwargs)

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        # inspect.signature() and functools follow this, so a decorated function still shows its own signature.
        if self.fn is None:
            raise AttributeError("__wrapped__")
        return self.fn


def object_schema(schema: object) -> dict[str, Any]:
    """``schema`` if it describes an object (MCP requires that of an input schema), else an empty object schema."""
    if isinstance(schema, Mapping) and schema.get("type") == "object":
        return dict(schema)
    return {"type": "object", "properties": {}}


def _check_name(name: object) -> str:
    if not isinstance(name, str) or _TOOL_NAME.fullmatch(name) is None:
        raise ToolDefinitionError(str(name), "a tool name is 1-64 characters of A-Z, a-z, 0-9, '_' or '-'")
    return name


def _is_async(fn: Callable[..., Any]) -> bool:
    while True:
        if inspect.iscoroutinefunction(fn):
            return True
        inner = getattr(fn, "func", None)  # functools.partial
        if inner is None:
            call = getattr(fn, "__call__", None)  # noqa: B004 - an object whose __call__ is async
            return call is not None and inspect.iscoroutinefunction(call)
        fn = inner


def define_tool(
    name: str,
    description: str,
    input_schema: Mapping[str, Any],
    execute: ToolExecute,
    read_only: bool = False,
    *,
    structured_output: bool = False,
    threaded: bool | None = None,
) -> Tool:
    """A tool from a raw ``execute(args, ctx)`` and a JSON Schema written by hand.

    The arguments are not checked against ``input_schema`` here (no JSON Schema validator in the
    core); ``execute`` raises ``ToolArgumentsError`` to report bad arguments as such.
    """
    return Tool(
        name=_check_name(name),
        description=description,
        input_schema=object_schema(input_schema),
        execute=execute,
        read_only=read_only,
        structured_output=structured_output,
        threaded=not _is_async(execute) if threaded is None else threaded,
    )


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    structured_output: bool = False,
    threaded: bool | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    structured_output: bool = False,
    threaded: bool | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool from a typed function (``@tool`` or ``@tool(name=..., read_only=True)``).

    Parameters become the input schema (a default makes one optional; ``Annotated[T,
    msgspec.Meta(description=...)]`` describes one); the docstring becomes the description. One
    parameter annotated ``ToolContext`` receives the call's context instead of an argument.
    """

    def build(f: Callable[..., Any]) -> Tool:
        return _tool_from_function(
            f,
            name=name,
            description=description,
            read_only=read_only,
            structured_output=structured_output,
            threaded=threaded,
        )

    return build(fn) if fn is not None else build


_HOW_TO_DECLARE = (
    "pass a typed function (def get_todos(status: str = 'open') -> str: ...), "
    "or declare one with @tool or define_tool(name, description, input_schema, execute)"
)


def _describe(value: object) -> str:
    """How a refused value is named to the user: its own name where it has one, else a short repr."""
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    if isinstance(name, str) and name:
        return f"{name} (a {type(value).__name__})"
    text = repr(value)
    return f"{text if len(text) <= 60 else text[:57] + '...'} (a {type(value).__name__})"


def as_tool(value: object) -> Tool:
    """``value`` as a tool: a ``Tool`` as it is, any other typed callable (sync or async) through ``tool``.

    A class is refused rather than declared from its constructor: ``tools=[Client]`` is a mistake far
    more often than a tool whose call builds an object.
    """
    if isinstance(value, Tool):
        return value
    if callable(value) and not isinstance(value, type):
        return tool(value)
    raise ToolDefinitionError(_describe(value), f"it is not a tool; {_HOW_TO_DECLARE}")


def as_tools(values: object) -> list[Tool]:
    """A list of tools from what an app passes as ``tools=``; refused whole, with the culprit named, before any run.

    Names are checked here too: two tools of one name would otherwise fail only once the bridge
    starts, after the sandbox exists.
    """
    if values is None:
        return []
    if isinstance(values, (str, bytes, Mapping)) or callable(values) or not isinstance(values, Iterable):
        raise ToolDefinitionError(
            _describe(values), "tools takes a list of tools, e.g. tools=[get_todos]; " + _HOW_TO_DECLARE
        )
    tools: list[Tool] = []
    seen: set[str] = set()
    for index, value in enumerate(values):
        try:
            declared = as_tool(value)
        except ToolDefinitionError as exc:
            raise ToolDefinitionError(exc.tool_name, f"tools[{index}]: {exc.reason}") from None
        if declared.name in seen:
            raise ToolDefinitionError(declared.name, f"tools[{index}]: two tools share this name")
        seen.add(declared.name)
        tools.append(declared)
    return tools


def _is_context_annotation(annotation: Any) -> bool:
    if annotation is ToolContext:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _is_context_annotation(typing.get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return ToolContext in typing.get_args(annotation)
    return False


def _tool_from_function(
    fn: Callable[..., Any],
    *,
    name: str | None,
    description: str | None,
    read_only: bool,
    structured_output: bool,
    threaded: bool | None,
) -> Tool:
    tool_name = _check_name(name if name is not None else getattr(fn, "__name__", ""))
    try:
        signature = inspect.signature(fn)
        hints = typing.get_type_hints(fn, include_extras=True)
    except (NameError, TypeError, ValueError) as exc:
        raise ToolDefinitionError(tool_name, f"cannot read the function's signature or type hints: {exc}") from None

    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    plan: list[tuple[str, bool]] = []  # (parameter, passed positionally)
    context_param: str | None = None
    for param in signature.parameters.values():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ToolDefinitionError(tool_name, f"*{param.name} has no JSON Schema; name every parameter")
        annotation = hints.get(param.name, Any)
        plan.append((param.name, param.kind is inspect.Parameter.POSITIONAL_ONLY))
        if _is_context_annotation(annotation):
            if context_param is not None:
                raise ToolDefinitionError(tool_name, "only one parameter may take the ToolContext")
            context_param = param.name
            continue
        if param.default is inspect.Parameter.empty:
            fields.append((param.name, annotation))
        else:
            fields.append((param.name, annotation, param.default))

    try:
        args_type = msgspec.defstruct(f"{tool_name}_arguments", fields, kw_only=True, forbid_unknown_fields=True)
        schema = _schema_of(args_type)
    except (TypeError, ValueError) as exc:
        raise ToolDefinitionError(tool_name, f"no JSON Schema for its parameters: {exc}") from None

    def execute(args: dict[str, Any], ctx: ToolContext) -> Any:
        try:
            parsed = msgspec.convert(args, args_type)
        except msgspec.ValidationError as exc:
            raise ToolArgumentsError(tool_name, str(exc)) from None
        positional: list[Any] = []
        keywords: dict[str, Any] = {}
        for param_name, by_position in plan:
            value = ctx if param_name == context_param else getattr(parsed, param_name)
            if by_position:
                positional.append(value)
            else:
                keywords[param_name] = value
        return fn(*positional, **keywords)

    return Tool(
        name=tool_name,
        description=description if description is not None else (inspect.getdoc(fn) or ""),
        input_schema=schema,
        execute=execute,
        read_only=read_only,
        structured_output=structured_output,
        threaded=not _is_async(fn) if threaded is None else threaded,
        fn=fn,
    )


def _schema_of(args_type: type[msgspec.Struct]) -> dict[str, Any]:
    (_, components) = msgspec.json.schema_components([args_type], ref_template="#/$defs/{name}")
    top = dict(components.pop(args_type.__name__))
    top.pop("title", None)  # the generated Struct's name means nothing to the agent
    if not top.get("required", True):
        del top["required"]  # draft-04 validators, still met in the wild, reject an empty list
    if components:
        top["$defs"] = components
    return top


async def invoke_tool(tool: Tool, args: dict[str, Any], ctx: ToolContext, *, signal: AbortSignal | None = None) -> Any:
    """Run ``tool`` once and return its raw value; exceptions propagate.

    With ``signal``, an abort cancels the tool (``AbortError``) while the caller's own task stays
    uncancelled, so it can still answer the agent.
    """
    if signal is None:
        return await _invoke(tool, args, ctx)
    signal.throw_if_aborted()
    task = asyncio.current_task()
    if task is None:
        return await _invoke(tool, args, ctx)
    # Cancel this very task on abort, the way asyncio.timeout does, and tell that cancellation from
    # one aimed at the caller by the request count: no extra task, no extra loop turn per call.
    aborted = False

    def cancel(_reason: object) -> None:
        nonlocal aborted
        aborted = True
        task.cancel()

    remove = signal.add_listener(cancel)
    try:
        result = await _invoke(tool, args, ctx)
    except asyncio.CancelledError:
        if aborted and task.uncancel() == 0:
            raise AbortError(signal.reason) from None
        raise
    finally:
        remove()
    if aborted:
        task.uncancel()  # the tool swallowed our cancellation; it must not linger on the task
    return result


async def _invoke(tool: Tool, args: dict[str, Any], ctx: ToolContext) -> Any:
    if tool.threaded:
        loop = asyncio.get_running_loop()
        emit = ctx.emit_custom_event
        if emit is not _no_emit:
            # Event sinks live on the loop (they feed an asyncio channel), so a worker thread hops back to it.
            def hop(name: str, value: Any) -> None:
                loop.call_soon_threadsafe(emit, name, value)

            ctx = replace(ctx, emit_custom_event=hop)
        result = await asyncio.to_thread(tool.execute, args, ctx)
    else:
        result = tool.execute(args, ctx)
    if inspect.isawaitable(result):
        result = await result
    return result
