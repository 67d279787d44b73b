"""The standard AG-UI run endpoint: ``POST <prefix>/agui`` takes a ``RunAgentInput`` and answers with the run.

What ``@ag-ui/client``'s ``HttpAgent`` (CopilotKit, the AG-UI Dojo) and TanStack AI's
``fetchServerSentEvents`` send: one POST whose SSE answer is the run itself. Here that POST starts
a durable run (``SandboxService.start_run``, so the run outlives the request, as every run of the
service does) and its answer reads the run's log, every frame carrying its log offset as ``id:``.
A client whose connection dropped resumes with ``Last-Event-ID``: on the tail route
(``GET /runs/{id}/events``), or by posting the same input again (the run id names the run: nothing
new starts) or ``GET <prefix>/agui?runId=...`` (TanStack's ``joinRun``).

Each answer is a whole AG-UI run for the client that reads it: the log's own order (RUN_STARTED
first, nothing after the terminal event) is kept by its one writer (``boxwright.runs``), and a
stream that resumes mid-run starts with the run's RUN_STARTED and re-opens what was open at that
offset (a text message, a tool call, a reasoning message, a step), each under the resume offset's
id, so a client's verifier sees every content event inside its START/END and a resumable client
(which skips ids it saw) sees nothing twice.

Frontend tools (``RunAgentInput.tools``) are offered to the agent through the bridge, beside the
app's own; as AG-UI specifies, the run ends right after the agent calls one (RUN_FINISHED, outcome
success with that call pending: ``hand_off``), and the client's next input, carrying the tool
result, starts the next run. Approval requests are not AG-UI interrupts yet: they are the CUSTOM
``approval-requested`` events of ``boxwright.middleware.approvals``, answered on
``POST /runs/{id}/approval``.

Bad input is a clear 4xx before any run starts: a body that is not JSON (``415`` for another
content type, ``413`` over 2 MiB, ``400`` naming the field for a malformed input or an unknown
content part type), a ``runId`` that names another thread's run (``409 thread_mismatch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Annotated, Any, Final, Literal, TypeAlias

import msgspec
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from boxwright._json import BoundedDecoder, JsonBoundsError
from boxwright.abort import AbortController, wait_unless_aborted
from boxwright.errors import (
    InvalidRunIdError,
    InvalidThreadIdError,
    RunThreadMismatchError,
    ThreadBusyError,
    ToolDefinitionError,
)
from boxwright.events import (
    AudioPart,
    DocumentPart,
    Event,
    ImagePart,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunErrorEvent,
    RunFinishedEvent,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    StepStartedEvent,
    TextMessageStartEvent,
    TextPart,
    ToolCallEndEvent,
    ToolCallStartEvent,
    VideoPart,
    encode_event,
    now_ms,
)
from boxwright.harnesses.base import Message
from boxwright.ids import check_client_run_id, check_thread_id
from boxwright.runs import (
    NOW_OFFSET,
    RUN_CANCEL_REASON,
    START_OFFSET,
    EventLog,
    format_offset,
    is_terminal_status,
    parse_offset,
)
from boxwright.secrets import redact
from boxwright.tool_bridge.tools import Tool, define_tool, object_schema

from .delivery import PING_INTERVAL_S, DeliveryRefusal, check_tail_request, json_response

log = logging.getLogger("boxwright.middleware.agui")

AGUI_PATH: Final = "/agui"
MAX_AGUI_BODY: Final = 2 * 1024 * 1024
# Bounds of one input, far above any chat a person has; they keep a request from costing without end.
MAX_MESSAGES: Final = 1000
MAX_TOOLS: Final = 128
MAX_CONTEXT: Final = 128
ShortStr = Annotated[str, msgspec.Meta(max_length=256)]


# -- RunAgentInput (ag_ui.core, protocol 1.0) -----------------------------------------------------


class _Input(msgspec.Struct, rename="camel", kw_only=True):
    """A part of a RunAgentInput; fields ag_ui does not define (TanStack's ``data``, ...) are ignored."""


class BinaryPart(_Input, tag_field="type", tag="binary"):
    """The older AG-UI binary input part (``mimeType`` plus ``data``, ``url`` or ``id``)."""

    mime_type: str
    id: str | None = None
    url: str | None = None
    data: str | None = None
    filename: str | None = None


InputPart: TypeAlias = TextPart | ImagePart | AudioPart | VideoPart | DocumentPart | BinaryPart


class FunctionCall(_Input):
    name: ShortStr
    arguments: str = ""


class MessageToolCall(_Input):
    id: ShortStr
    function: FunctionCall
    type: Literal["function"] = "function"


class InputMessage(_Input):
    """One message of the conversation: AG-UI's message union, read as one struct."""

    id: ShortStr
    role: Literal["developer", "system", "assistant", "user", "tool", "activity", "reasoning"]
    content: str | list[InputPart] | None = None
    name: ShortStr | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: ShortStr | None = None
    error: str | None = None


class InputTool(_Input):
    """A tool the frontend declares: a name, what it does, a JSON Schema of its parameters."""

    name: ShortStr
    description: str = ""
    parameters: Any = None


class InputContext(_Input):
    description: str
    value: str


class RunAgentInput(_Input):
    """The body of ``POST /agui``: AG-UI's RunAgentInput."""

    thread_id: str
    run_id: str
    parent_run_id: str | None = None
    state: Any = None
    messages: Annotated[list[InputMessage], msgspec.Meta(max_length=MAX_MESSAGES)] = msgspec.field(default_factory=list)
    tools: Annotated[list[InputTool], msgspec.Meta(max_length=MAX_TOOLS)] = msgspec.field(default_factory=list)
    context: Annotated[list[InputContext], msgspec.Meta(max_length=MAX_CONTEXT)] = msgspec.field(default_factory=list)
    forwarded_props: Any = None


# Bounded in depth and size: ``state`` and ``forwardedProps`` are any JSON a client sends.
_input_decoder = BoundedDecoder(RunAgentInput, max_bytes=MAX_AGUI_BODY)


class InputRefusal(Exception):
    """Why an input cannot start a run: an HTTP status, a code and a message the client can act on."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code

    def response(self) -> Response:
        return json_response(self.status, {"error": str(self), "code": self.code})


def decode_run_agent_input(raw: bytes) -> RunAgentInput:
    """The input, its ids checked; ``InputRefusal`` (400) naming what is wrong otherwise."""
    try:
        body = _input_decoder.decode(raw)
    except JsonBoundsError as exc:
        raise InputRefusal(400, f"body must be valid JSON: {exc}", "invalid_body") from None
    except msgspec.ValidationError as exc:
        raise InputRefusal(400, f"invalid RunAgentInput: {exc}", "invalid_body") from None
    except msgspec.DecodeError:
        raise InputRefusal(400, "body must be valid JSON (a RunAgentInput)", "invalid_body") from None
    try:
        check_thread_id(body.thread_id)
    except InvalidThreadIdError as exc:
        raise InputRefusal(400, f"invalid threadId: {exc}", exc.code) from None
    try:
        check_client_run_id(body.run_id)
    except InvalidRunIdError as exc:
        raise InputRefusal(400, f"invalid runId: {exc}", exc.code) from None
    return body


def _text_of(message: InputMessage, index: int) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if not isinstance(part, TextPart):
                kind = part.__struct_config__.tag
                raise InputRefusal(
                    400,
                    f"messages[{index}].content: a {kind!r} part cannot be given to this agent "
                    "(its CLI takes text): send text parts only",
                    "unsupported_content",
                )
            texts.append(part.text)
        return "\n".join(texts)
    raise InputRefusal(400, f"messages[{index}].content must be a string or a list of content parts", "invalid_body")


def conversation(body: RunAgentInput) -> list[Message]:
    """The input's messages as the text conversation a harness takes, the context as a system message.

    Tool calls and their results become text the agent reads (its CLI has no other way in for
    them); activity and reasoning messages are the client's own rendering and are left out.
    """
    messages: list[Message] = []
    if body.context:
        lines = [f"- {item.description}: {item.value}" for item in body.context]
        messages.append(Message(role="system", content="Context from the application:\n" + "\n".join(lines)))
    for index, message in enumerate(body.messages):
        if message.role in ("activity", "reasoning"):
            continue
        text = _text_of(message, index)
        if message.role == "assistant" and message.tool_calls:
            calls = [f"[called tool {c.function.name} with {c.function.arguments or '{}'}]" for c in message.tool_calls]
            text = "\n".join([text, *calls]) if text else "\n".join(calls)
        if message.role == "tool":
            result = message.error if message.error else text
            messages.append(Message(role="user", content=f"[tool result for {message.tool_call_id}]: {result}"))
            continue
        role: Literal["user", "assistant", "system", "developer"] = message.role  # type: ignore[assignment]
        messages.append(Message(role=role, content=text, id=message.id))
    if not messages or messages[-1].role != "user" or not messages[-1].content.strip():
        raise InputRefusal(400, "messages must end with a user message with text (or a tool result)", "invalid_body")
    return messages


# -- frontend tools: offered to the agent, answered by the client in its next input ---------------

# How long a frontend tool's bridge call waits when no hand-off ends the turn first (a run taken over by
# another process drives without the route's hand-off): then the agent is told the client did not answer.
FRONTEND_TOOL_WAIT_S: Final = 600.0
_BRIDGE_PREFIX: Final = "mcp__boxwright__"


async def _answered_by_the_client(args: dict[str, Any], ctx: Any) -> str:
    # The hand-off (``hand_off``) ends the run right after this call's TOOL_CALL_END; the agent is stopped
    # while it waits here. The result below only reaches an agent whose run had no hand-off.
    await wait_unless_aborted(asyncio.sleep(FRONTEND_TOOL_WAIT_S), ctx.abort_signal)
    return "the client that declared this tool did not answer it"


def frontend_tools(body: RunAgentInput, app_tools: Sequence[Tool]) -> list[Tool]:
    """The input's ``tools`` as bridge tools the agent may call; a name the app's tools use is refused."""
    taken = {tool.name for tool in app_tools}
    made: list[Tool] = []
    for index, declared in enumerate(body.tools):
        if declared.name in taken:
            raise InputRefusal(
                400,
                f"tools[{index}].name {declared.name!r} is taken (by the app's own tools or an earlier entry)",
                "invalid_body",
            )
        taken.add(declared.name)
        try:
            made.append(
                define_tool(
                    declared.name, declared.description, object_schema(declared.parameters), _answered_by_the_client
                )
            )
        except ToolDefinitionError as exc:
            raise InputRefusal(400, f"tools[{index}]: {exc}", "invalid_body") from None
    return made


def hand_off(
    names: frozenset[str], thread_id: str, run_id: str
) -> Callable[[AsyncIterator[Event], AbortController], AsyncIterator[Event]]:
    """AG-UI's frontend tool semantics over a run's events: the run ends after a frontend tool call.

    Right after the TOOL_CALL_END of a call to one of ``names`` comes RUN_FINISHED (outcome success,
    that call pending), then the agent is stopped: the client runs the tool and sends its result in
    the next RunAgentInput, which starts the next run. The log keeps nothing after RUN_FINISHED
    (``boxwright.runs``), so the agent's own end never reaches the client.
    """

    def wrap(events: AsyncIterator[Event], abort: AbortController) -> AsyncIterator[Event]:
        async def handed_off() -> AsyncIterator[Event]:
            called: dict[str, str] = {}
            async with contextlib.aclosing(events):  # type: ignore[type-var]
                async for event in events:
                    yield event
                    if isinstance(event, ToolCallStartEvent):
                        called[event.tool_call_id] = (event.tool_name or event.tool_call_name).removeprefix(
                            _BRIDGE_PREFIX
                        )
                    elif isinstance(event, ToolCallEndEvent) and called.get(event.tool_call_id) in names:
                        yield RunFinishedEvent(
                            thread_id=thread_id,
                            run_id=run_id,
                            outcome=RunFinishedSuccessOutcome(pending_tool_call_ids=[event.tool_call_id]),
                            timestamp=now_ms(),
                        )
                        # The turn is the client's now: stop the agent (its sandbox goes with it).
                        abort.abort(RUN_CANCEL_REASON)

        return handed_off()

    return wrap


# -- the answer: the run's log as one AG-UI run ----------------------------------------------------


def reopening(stored: Sequence[Event]) -> list[Event]:
    """What a client joining after ``stored`` needs first: the run's RUN_STARTED and a START for each
    text message, tool call, reasoning span and message and step open at its end.

    A log that ended (a terminal event stored) gives its RUN_STARTED and that terminal event.
    """
    started: RunStartedEvent | None = None
    texts: dict[str, TextMessageStartEvent] = {}
    calls: dict[str, ToolCallStartEvent] = {}
    spans: dict[str, ReasoningStartEvent] = {}
    thoughts: dict[str, ReasoningMessageStartEvent] = {}
    steps: dict[str, StepStartedEvent] = {}
    for event in stored:
        kind = event.type
        if isinstance(event, RunStartedEvent):
            started = started or event
        elif isinstance(event, (RunFinishedEvent, RunErrorEvent)):
            return [started, event] if started is not None else [event]
        elif isinstance(event, TextMessageStartEvent):
            texts[event.message_id] = event
        elif kind == "TEXT_MESSAGE_END":
            texts.pop(getattr(event, "message_id", ""), None)
        elif isinstance(event, ToolCallStartEvent):
            calls[event.tool_call_id] = event
        elif kind == "TOOL_CALL_END":
            calls.pop(getattr(event, "tool_call_id", ""), None)
        elif isinstance(event, ReasoningStartEvent):
            spans[event.message_id] = event
        elif kind == "REASONING_END":
            spans.pop(getattr(event, "message_id", ""), None)
        elif isinstance(event, ReasoningMessageStartEvent):
            thoughts[event.message_id] = event
        elif kind == "REASONING_MESSAGE_END":
            thoughts.pop(getattr(event, "message_id", ""), None)
        elif isinstance(event, StepStartedEvent):
            steps[event.step_name] = event
        elif kind == "STEP_FINISHED":
            steps.pop(getattr(event, "step_name", ""), None)
    head: list[Event] = [started] if started is not None else []
    return [*head, *steps.values(), *spans.values(), *thoughts.values(), *texts.values(), *calls.values()]


def _frame(offset: str, event: Event) -> bytes:
    # Offsets are [0-9a-f_] and encoded JSON holds no raw newline: neither can break the framing.
    return b"id: " + offset.encode() + b"\ndata: " + encode_event(event) + b"\n\n"


async def _stored_until(events: EventLog, run_id: str, offset: str) -> list[Event]:
    until = parse_offset(run_id, offset) or 0
    stored: list[Event] = []
    reader = events.read(run_id, START_OFFSET, live=False)
    async with contextlib.aclosing(reader):  # type: ignore[type-var]
        async for at, event in reader:
            if (parse_offset(run_id, at) or 0) > until:
                break
            stored.append(event)
    return stored


async def agui_stream(events: EventLog, run_id: str, offset: str) -> AsyncIterator[bytes]:
    """The run's log from ``offset`` as AG-UI SSE frames, re-opened first when it resumes mid-run.

    Ends once the log is closed and read; no frame follows the run's terminal event (the
    ``event: status`` frame of the tail route would be read as an event by AG-UI clients).
    """
    controller = AbortController()
    try:
        if offset == NOW_OFFSET:
            offset = await events.tail(run_id)  # concrete, so the re-opening and the read agree on it
        if offset != START_OFFSET:
            for event in reopening(await _stored_until(events, run_id, offset)):
                yield _frame(offset, event)
        reader = events.read(run_id, offset, signal=controller.signal)
        async with contextlib.aclosing(reader):  # type: ignore[type-var]
            async for at, event in reader:
                yield _frame(at, event)
    except Exception as exc:
        # Headers are gone: end the stream; the client resumes from the last id it got.
        log.error("run %r: AG-UI stream failed: %s", run_id, redact(f"{type(exc).__name__}: {exc}"))
    finally:
        controller.abort("the AG-UI client went away")


def _resume_offset(request: Request) -> str:
    return request.headers.get("last-event-id") or request.query_params.get("offset") or START_OFFSET


async def agui_response(service: Any, run_id: str, request: Request) -> Response:
    """The SSE answer for ``run_id`` from the request's ``Last-Event-ID`` (else ``?offset=``, else the start)."""
    offset = _resume_offset(request)
    try:
        await check_tail_request(service.log, service.runs, run_id, offset)
    except DeliveryRefusal as refusal:
        return refusal.response()
    return EventSourceResponse(
        agui_stream(service.log, run_id, offset),
        headers={"Cache-Control": "no-cache"},
        ping=PING_INTERVAL_S,
        sep="\n",
    )


# -- the routes ------------------------------------------------------------------------------------


# How long a new input waits for its thread's previous run, whose log already ended, to record its end.
ENDING_WAIT_S: Final = 30.0


async def _ending(service: Any, run_id: str) -> bool:
    """Whether ``run_id``'s log holds its terminal event and its record then turned terminal (in time)."""
    events: EventLog = service.log
    last = parse_offset(run_id, await events.tail(run_id)) or 0
    if last == 0:
        return False
    reader = events.read(run_id, format_offset(run_id, last - 1), live=False)
    async with contextlib.aclosing(reader):  # type: ignore[type-var]
        ends = [event async for _, event in reader]
    if not ends or not isinstance(ends[-1], (RunFinishedEvent, RunErrorEvent)):
        return False
    deadline = asyncio.get_running_loop().time() + ENDING_WAIT_S
    while asyncio.get_running_loop().time() < deadline:
        record = await service.runs.get(run_id)
        if record is None or is_terminal_status(record.status):
            return True
        await asyncio.sleep(0.05)
    return False


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def agui_routes(service: Any, *, spec_for: Any, bounded_body: Any) -> list[BaseRoute]:
    """``POST /agui`` (start or rejoin a run, answer with its SSE) and ``GET /agui?runId=`` (join a run).

    ``service`` is the ``SandboxService``; ``spec_for`` and ``bounded_body`` are the service
    module's own factory call and bounded read, so every route of the service decides a run alike.
    """
    from .service import ServiceClosedError, StartRunRequest

    async def start(request: Request) -> Response:
        if service.factory is None:
            return json_response(501, {"error": "this service was given no run factory", "code": "no_factory"})
        content_type = request.headers.get("content-type", "")
        if not _is_json(content_type):
            return json_response(
                415,
                {
                    "error": f"a RunAgentInput is JSON: send Content-Type: application/json, not {content_type!r}",
                    "code": "unsupported_media_type",
                },
            )
        raw = await bounded_body(request, MAX_AGUI_BODY)
        if raw is None:
            return json_response(413, {"error": "body over 2 MiB", "code": "too_large"})
        try:
            body = decode_run_agent_input(raw)
            existing = await service.runs.get(body.run_id)
            if existing is not None:
                if existing.thread_id != body.thread_id:
                    raise RunThreadMismatchError(body.run_id, body.thread_id, existing.thread_id)
                # The same input again (a client reconnecting): the run it names, nothing new started.
                await service._before_tail(body.run_id)
                return await agui_response(service, body.run_id, request)
            messages = conversation(body)
            prompt = messages[-1].content
            spec = await spec_for(service, StartRunRequest(prompt=prompt, thread_id=body.thread_id, run_id=body.run_id))
            app_tools = list(spec.tools or ())
            offered = frontend_tools(body, app_tools)

            async def start_it() -> str:
                run_id: str = await service.start_run(
                    spec.sandbox,
                    spec.harness,
                    messages,
                    thread_id=body.thread_id,
                    run_id=body.run_id,
                    tools=[*app_tools, *offered] if offered or spec.tools is not None else None,
                    durable=spec.durable,
                    file_hooks=spec.file_hooks,
                    wrap=hand_off(frozenset(t.name for t in offered), body.thread_id, body.run_id) if offered else None,
                )
                return run_id

            try:
                run_id = await start_it()
            except ThreadBusyError as exc:
                # A client answering a frontend tool call posts its next input on the previous run's
                # RUN_FINISHED, while that run still stops its agent: wait for that end, not a 409.
                if not await _ending(service, exc.active_run_id):
                    raise
                run_id = await start_it()
        except InputRefusal as refusal:
            return refusal.response()
        except RunThreadMismatchError as exc:
            return json_response(
                409, {"error": str(exc), "code": "thread_mismatch", "ownerThreadId": exc.existing_thread_id}
            )
        except ThreadBusyError as exc:
            return json_response(409, {"error": str(exc), "code": "thread_busy", "activeRunId": exc.active_run_id})
        except ServiceClosedError as exc:
            return json_response(503, {"error": str(exc), "code": "service_closed"})
        except (InvalidRunIdError, InvalidThreadIdError) as exc:
            return json_response(400, {"error": str(exc), "code": exc.code})
        except Exception as exc:
            log.error("could not start an AG-UI run: %s", redact(f"{type(exc).__name__}: {exc}"))
            return json_response(500, {"error": "could not start the run", "code": "start_failed"})
        return await agui_response(service, run_id, request)

    async def join(request: Request) -> Response:
        run_id = request.query_params.get("runId")
        if not run_id:
            return json_response(400, {"error": "GET /agui joins a run: name it with ?runId=", "code": "no_run_id"})
        await service._before_tail(run_id)
        return await agui_response(service, run_id, request)

    return [Route(AGUI_PATH, start, methods=["POST"]), Route(AGUI_PATH, join, methods=["GET"])]


__all__ = [
    "AGUI_PATH",
    "MAX_AGUI_BODY",
    "InputMessage",
    "InputRefusal",
    "InputTool",
    "RunAgentInput",
    "agui_routes",
    "agui_stream",
    "conversation",
    "decode_run_agent_input",
    "reopening",
]
