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
result, starts the next run. An approval request (``boxwright.middleware.approvals``: the agent
waits on the service's desk) is an AG-UI interrupt (``Interrupts``): the answer ends with RUN_FINISHED,
outcome ``interrupt``; the client's next input answers it in ``resume``, and that input's answer is
the same run going on, under the new run id (``POST /runs/{id}/approval`` answers it too).

Bad input is a clear 4xx before any run starts: a body that is not JSON (``415`` for another
content type, ``413`` over 2 MiB, ``400`` naming the field for a malformed input or an unknown
content part type), a ``runId`` that names another thread's run (``409 thread_mismatch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
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
    CustomEvent,
    DocumentPart,
    Event,
    ImagePart,
    Interrupt,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunErrorEvent,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
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
from boxwright.policy import APPROVAL_REQUESTED_EVENT
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


class ResumeEntry(_Input):
    """An answer to one interrupt of the previous run (AG-UI 1.0 human in the loop)."""

    interrupt_id: ShortStr
    status: Literal["resolved", "cancelled"]
    payload: Any = None


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
    resume: Annotated[list[ResumeEntry], msgspec.Meta(max_length=MAX_TOOLS)] | None = None


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


@dataclass
class Interrupts:
    """Approval requests as AG-UI interrupts, for the runs this process drives.

    A run whose agent asks a person (``boxwright.middleware.approvals``: a CUSTOM
    ``approval-requested`` event, then the agent waits on the service's desk) is, to an AG-UI
    client, a run that finished with an interrupt: its answer stops there with RUN_FINISHED
    (outcome ``interrupt``). The client's next RunAgentInput answers it in ``resume``; that answers
    the desk, and the new run id's answer is the same run's log from that point on (its agent never
    stopped), under the new id. Like the desk, this is in-process: the answer must reach the
    process that drives the run.
    """

    desk: Any  # the service's ApprovalDesk
    # Interrupt id -> (the run, the offset of its approval-requested event), while it is unanswered.
    paused: dict[str, tuple[str, str]] = field(default_factory=dict)
    # A continuation's run id -> (the run it continues, the offset it starts after); the oldest go first.
    continued: OrderedDict[str, tuple[str, str]] = field(default_factory=OrderedDict)

    def interrupt(self, run_id: str, at: str, event: Event, seen: Sequence[Event]) -> Interrupt | None:
        """The interrupt ``event`` raises in ``run_id``'s answer, if it asks a question still waited on."""
        if not isinstance(event, CustomEvent) or event.name != APPROVAL_REQUESTED_EVENT:
            return None
        value = event.value if isinstance(event.value, dict) else {}
        approval = value.get("approvalId")
        if not isinstance(approval, str) or approval not in self.desk.pending(run_id):
            return None
        if any(not isinstance(e, RunStartedEvent) for e in reopening(seen)):
            return None  # a message or a call is open: RUN_FINISHED cannot come here; the stream goes on
        # Questions answered another way (POST /runs/{id}/approval, a timeout, the run's end) go first.
        for stale in [key for key, (run, _) in self.paused.items() if key not in self.desk.pending(run)]:
            del self.paused[stale]
        self.paused[approval] = (run_id, at)
        title = value.get("title")
        return Interrupt(
            id=approval,
            reason="approval",
            message=title if isinstance(title, str) else None,
            response_schema=APPROVAL_RESPONSE_SCHEMA,
        )

    def continue_as(self, continuation: str, run_id: str, at: str) -> None:
        self.continued[continuation] = (run_id, at)
        while len(self.continued) > MAX_CONTINUATIONS:
            self.continued.popitem(last=False)


APPROVAL_RESPONSE_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {"decision": {"type": "string", "enum": ["allow", "deny"]}},
    "required": ["decision"],
}
MAX_CONTINUATIONS: Final = 1024


def _allows(entry: ResumeEntry) -> bool:
    payload = entry.payload
    if entry.status != "resolved":
        return False
    if payload is True:
        return True
    return isinstance(payload, dict) and (payload.get("decision") == "allow" or payload.get("approved") is True)


def _as_run(event: Event, run_id: str) -> Event:
    if isinstance(event, (RunStartedEvent, RunFinishedEvent, RunErrorEvent)) and event.run_id not in (None, run_id):
        return msgspec.structs.replace(event, run_id=run_id)
    return event


async def agui_stream(
    events: EventLog, run_id: str, offset: str, *, interrupts: Interrupts | None = None, as_run: str | None = None
) -> AsyncIterator[bytes]:
    """The run's log from ``offset`` as AG-UI SSE frames, re-opened first when it resumes mid-run.

    Ends once the log is closed and read; no frame follows the run's terminal event (the
    ``event: status`` frame of the tail route would be read as an event by AG-UI clients).
    With ``interrupts``, a question the agent waits on ends the answer with an interrupt;
    ``as_run`` names the run as the client knows it (a continuation after an interrupt).
    """
    controller = AbortController()
    view = as_run or run_id
    try:
        if offset == NOW_OFFSET:
            offset = await events.tail(run_id)  # concrete, so the re-opening and the read agree on it
        seen: list[Event] = []
        if offset != START_OFFSET:
            seen = await _stored_until(events, run_id, offset)
            for event in reopening(seen):
                yield _frame(offset, _as_run(event, view))
        reader = events.read(run_id, offset, signal=controller.signal)
        async with contextlib.aclosing(reader):  # type: ignore[type-var]
            async for at, event in reader:
                yield _frame(at, _as_run(event, view))
                if interrupts is None:
                    continue
                seen.append(event)
                asked = interrupts.interrupt(run_id, at, event, seen)
                if asked is not None:
                    started = next((e for e in seen if isinstance(e, RunStartedEvent)), None)
                    outcome = RunFinishedInterruptOutcome(interrupts=[asked])
                    thread = started.thread_id if started is not None else ""
                    paused = RunFinishedEvent(thread_id=thread, run_id=view, outcome=outcome, timestamp=now_ms())
                    yield _frame(at, paused)
                    return
    except Exception as exc:
        # Headers are gone: end the stream; the client resumes from the last id it got.
        log.error("run %r: AG-UI stream failed: %s", run_id, redact(f"{type(exc).__name__}: {exc}"))
    finally:
        controller.abort("the AG-UI client went away")


async def agui_response(
    service: Any,
    run_id: str,
    request: Request,
    *,
    interrupts: Interrupts | None = None,
    as_run: str | None = None,
    after: str | None = None,
) -> Response:
    """The SSE answer for ``run_id`` from the request's ``Last-Event-ID`` (else ``?offset=``, else ``after``,
    else the start)."""
    offset = request.headers.get("last-event-id") or request.query_params.get("offset") or after or START_OFFSET
    try:
        await check_tail_request(service.log, service.runs, run_id, offset)
    except DeliveryRefusal as refusal:
        return refusal.response()
    return EventSourceResponse(
        agui_stream(service.log, run_id, offset, interrupts=interrupts, as_run=as_run),
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

    interrupts = Interrupts(service.approvals) if getattr(service, "approvals", None) is not None else None

    async def resume(body: RunAgentInput, request: Request) -> Response:
        """Answer the interrupts ``body.resume`` names; the answer is the paused run's log from there on."""
        assert body.resume is not None
        if interrupts is None:
            raise InputRefusal(
                409, "this service has no approval desk: there is no interrupt to resume", "no_interrupt"
            )
        continued: tuple[str, str] | None = None
        for index, entry in enumerate(body.resume):
            paused = interrupts.paused.get(entry.interrupt_id)
            if paused is None:
                raise InputRefusal(
                    409,
                    f"resume[{index}]: no run here waits on interrupt {entry.interrupt_id!r} (answered already, "
                    "timed out, or driven by another process)",
                    "no_interrupt",
                )
            run_id, at = paused
            record = await service.runs.get(run_id)
            if record is None or record.thread_id != body.thread_id:
                owner = record.thread_id if record is not None else ""
                raise RunThreadMismatchError(run_id, body.thread_id, owner)
            if not service.approvals.answer(run_id, entry.interrupt_id, _allows(entry)):
                del interrupts.paused[entry.interrupt_id]
                raise InputRefusal(
                    409, f"resume[{index}]: interrupt {entry.interrupt_id!r} was answered already", "no_interrupt"
                )
            del interrupts.paused[entry.interrupt_id]
            continued = continued or (run_id, at)
        if continued is None:
            raise InputRefusal(400, "resume is empty: name the interrupts this input answers", "invalid_body")
        interrupts.continue_as(body.run_id, *continued)
        return await agui_response(
            service, continued[0], request, interrupts=interrupts, as_run=body.run_id, after=continued[1]
        )

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
            if interrupts is not None and body.run_id in interrupts.continued:
                # A continuation's client reconnecting: the run it continues, from where it left.
                run_id, at = interrupts.continued[body.run_id]
                return await agui_response(
                    service, run_id, request, interrupts=interrupts, as_run=body.run_id, after=at
                )
            if body.resume:
                return await resume(body, request)
            existing = await service.runs.get(body.run_id)
            if existing is not None:
                if existing.thread_id != body.thread_id:
                    raise RunThreadMismatchError(body.run_id, body.thread_id, existing.thread_id)
                # The same input again (a client reconnecting): the run it names, nothing new started.
                await service._before_tail(body.run_id)
                return await agui_response(service, body.run_id, request, interrupts=interrupts)
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
        return await agui_response(service, run_id, request, interrupts=interrupts)

    async def join(request: Request) -> Response:
        run_id = request.query_params.get("runId")
        if not run_id:
            return json_response(400, {"error": "GET /agui joins a run: name it with ?runId=", "code": "no_run_id"})
        if interrupts is not None and run_id in interrupts.continued:
            continued, at = interrupts.continued[run_id]
            return await agui_response(service, continued, request, interrupts=interrupts, as_run=run_id, after=at)
        await service._before_tail(run_id)
        return await agui_response(service, run_id, request, interrupts=interrupts)

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
