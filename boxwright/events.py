"""The AG-UI events boxwright emits, as msgspec Structs, and their JSON / NDJSON codec.

Each struct mirrors the model of the same name in the official ``ag-ui-protocol``
package (``ag_ui.core``, protocol 1.0): same fields, same required/optional split,
snake_case attributes, camelCase on the wire, optional fields left out when unset.
Protocol 1.0 names the reasoning family ``REASONING_*``; ``THINKING_*`` left the
protocol and ``ag_ui.core`` no longer accepts it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from typing import Annotated, Any, Literal, Protocol, TypeAlias, get_args

import msgspec
import msgspec.inspect

from boxwright._json import SHALLOW_LEN, BoundedDecoder, JsonBoundsError, JsonTooDeepError, decode_json, depth_exceeds
from boxwright.errors import EventDecodeError

_MAX_SAFE_INT = 2**53 - 1

# Bounded like ag_ui's: the range a JSON number survives a round trip through JavaScript in.
Timestamp = Annotated[int, msgspec.Meta(ge=-_MAX_SAFE_INT, le=_MAX_SAFE_INT)]
TokenCount = Annotated[int, msgspec.Meta(ge=0, le=_MAX_SAFE_INT)]
JsonPointer = Annotated[str, msgspec.Meta(pattern=r"^(/([^/~]|~[01])*)*$")]
Metadata = dict[str, Any]
TextMessageRole = Literal["developer", "system", "assistant", "user"]


class _Wire(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """A nested value of an event (content part, patch operation, outcome, usage)."""


class _Event(msgspec.Struct, tag_field="type", rename="camel", omit_defaults=True, kw_only=True):
    """The fields every event carries."""

    timestamp: Timestamp | None = None
    raw_event: Any = None
    metadata: Metadata | None = None

    @property
    def type(self) -> str:
        """The wire ``type`` of this event, e.g. ``"TEXT_MESSAGE_CONTENT"``."""
        return str(self.__struct_config__.tag)


class _AttributableEvent(_Event, kw_only=True):
    """An event that may belong to a subagent's work (all but the run-scoped ones)."""

    subagent_run_id: str | None = None


# --- nested values --------------------------------------------------------------------------


class DataSource(_Wire, tag_field="type", tag="data", kw_only=True):
    value: str
    mime_type: str


class UrlSource(_Wire, tag_field="type", tag="url", kw_only=True):
    value: str
    mime_type: str | None = None


class FileSource(_Wire, tag_field="type", tag="file", kw_only=True):
    value: str
    provider: str | None = None
    mime_type: str | None = None


PartSource: TypeAlias = DataSource | UrlSource | FileSource


class TextPart(_Wire, tag_field="type", tag="text", kw_only=True):
    id: str | None = None
    text: str
    metadata: Any = None


class ImagePart(_Wire, tag_field="type", tag="image", kw_only=True):
    id: str | None = None
    source: PartSource
    metadata: Any = None


class AudioPart(_Wire, tag_field="type", tag="audio", kw_only=True):
    id: str | None = None
    source: PartSource
    metadata: Any = None


class VideoPart(_Wire, tag_field="type", tag="video", kw_only=True):
    id: str | None = None
    source: PartSource
    metadata: Any = None


class DocumentPart(_Wire, tag_field="type", tag="document", kw_only=True):
    id: str | None = None
    source: PartSource
    metadata: Any = None


ContentPart: TypeAlias = TextPart | ImagePart | AudioPart | VideoPart | DocumentPart


class AddOperation(_Wire, tag_field="op", tag="add", kw_only=True):
    path: JsonPointer
    value: Any


class RemoveOperation(_Wire, tag_field="op", tag="remove", kw_only=True):
    path: JsonPointer


class ReplaceOperation(_Wire, tag_field="op", tag="replace", kw_only=True):
    path: JsonPointer
    value: Any


class MoveOperation(_Wire, tag_field="op", tag="move", kw_only=True):
    from_: JsonPointer  # "from" on the wire: camel renaming drops the trailing underscore
    path: JsonPointer


class CopyOperation(_Wire, tag_field="op", tag="copy", kw_only=True):
    from_: JsonPointer
    path: JsonPointer


class TestOperation(_Wire, tag_field="op", tag="test", kw_only=True):
    __test__ = False  # not a pytest test class, despite the name ag_ui gives it

    path: JsonPointer
    value: Any


JsonPatchOperation: TypeAlias = (
    AddOperation | RemoveOperation | ReplaceOperation | MoveOperation | CopyOperation | TestOperation
)


class TokenUsage(_Wire, kw_only=True):
    provider: str | None = None
    model: str | None = None
    input_tokens: TokenCount | None = None
    output_tokens: TokenCount | None = None
    total_tokens: TokenCount | None = None
    reasoning_tokens: TokenCount | None = None
    cached_input_tokens: TokenCount | None = None
    cache_write_input_tokens: TokenCount | None = None


class Interrupt(_Wire, kw_only=True):
    subagent_run_id: str | None = None
    id: str
    reason: str
    message: str | None = None
    tool_call_id: str | None = None
    response_schema: dict[str, Any] | None = None
    expires_at: str | None = None
    metadata: Metadata | None = None


class RunFinishedSuccessOutcome(_Wire, tag_field="type", tag="success", kw_only=True):
    pending_tool_call_ids: list[str] | None = None


class RunFinishedInterruptOutcome(_Wire, tag_field="type", tag="interrupt", kw_only=True):
    interrupts: Annotated[list[Interrupt], msgspec.Meta(min_length=1)]


class RunFinishedCancelledOutcome(_Wire, tag_field="type", tag="cancelled", kw_only=True):
    pass


RunFinishedOutcome: TypeAlias = RunFinishedSuccessOutcome | RunFinishedInterruptOutcome | RunFinishedCancelledOutcome


# --- events ---------------------------------------------------------------------------------


class RunStartedEvent(_Event, tag="RUN_STARTED", kw_only=True):
    thread_id: str
    run_id: str
    protocol_version: str | None = None
    parent_run_id: str | None = None
    # The RunAgentInput echoed verbatim; it is validated where the request is parsed.
    input: dict[str, Any] | None = None


class RunFinishedEvent(_Event, tag="RUN_FINISHED", kw_only=True):
    thread_id: str
    run_id: str
    result: Any = None
    outcome: RunFinishedOutcome | None = None
    usage: list[TokenUsage] | None = None
    # Extras (protocol 1.0 allows them) that TanStack clients read.
    finish_reason: Literal["stop", "length", "content_filter"] | None = None


class RunErrorEvent(_Event, tag="RUN_ERROR", kw_only=True):
    message: str
    code: str | None = None
    usage: list[TokenUsage] | None = None
    # Extras: the run and thread it ends, as RUN_FINISHED names them.
    thread_id: str | None = None
    run_id: str | None = None


class TextMessageStartEvent(_AttributableEvent, tag="TEXT_MESSAGE_START", kw_only=True):
    message_id: str
    role: TextMessageRole | None = None
    name: str | None = None


class TextMessageContentEvent(_AttributableEvent, tag="TEXT_MESSAGE_CONTENT", kw_only=True):
    message_id: str
    delta: str


class TextMessageEndEvent(_AttributableEvent, tag="TEXT_MESSAGE_END", kw_only=True):
    message_id: str


class ToolCallStartEvent(_AttributableEvent, tag="TOOL_CALL_START", kw_only=True):
    tool_call_id: str
    tool_call_name: str
    parent_message_id: str | None = None
    # Extra: the tool's own name where the call name carries a server prefix.
    tool_name: str | None = None


class ToolCallArgsEvent(_AttributableEvent, tag="TOOL_CALL_ARGS", kw_only=True):
    tool_call_id: str
    delta: str


class ToolCallEndEvent(_AttributableEvent, tag="TOOL_CALL_END", kw_only=True):
    tool_call_id: str
    # Extra: the whole parsed input, so a reader need not join the ARGS deltas.
    input: Any = None


class ToolCallResultEvent(_AttributableEvent, tag="TOOL_CALL_RESULT", kw_only=True):
    message_id: str
    tool_call_id: str
    content: str | list[ContentPart]
    role: Literal["tool"] | None = None
    # Extra: "output-error" when the tool failed.
    state: Literal["output-available", "output-error"] | None = None


class ReasoningStartEvent(_AttributableEvent, tag="REASONING_START", kw_only=True):
    message_id: str


def _reasoning_role() -> Literal["reasoning"]:
    return "reasoning"


class ReasoningMessageStartEvent(_AttributableEvent, tag="REASONING_MESSAGE_START", kw_only=True):
    message_id: str
    # Optional when decoding (as in ag_ui) but always encoded, because the TypeScript client
    # requires it: omit_defaults never drops a value made by a non-builtin default_factory.
    role: Literal["reasoning"] = msgspec.field(default_factory=_reasoning_role)


class ReasoningMessageContentEvent(_AttributableEvent, tag="REASONING_MESSAGE_CONTENT", kw_only=True):
    message_id: str
    delta: str


class ReasoningMessageEndEvent(_AttributableEvent, tag="REASONING_MESSAGE_END", kw_only=True):
    message_id: str


class ReasoningMessageChunkEvent(_AttributableEvent, tag="REASONING_MESSAGE_CHUNK", kw_only=True):
    message_id: str | None = None
    delta: str | None = None


class ReasoningEndEvent(_AttributableEvent, tag="REASONING_END", kw_only=True):
    message_id: str


class ReasoningEncryptedValueEvent(_AttributableEvent, tag="REASONING_ENCRYPTED_VALUE", kw_only=True):
    subtype: Literal["tool-call", "message"]
    entity_id: str
    encrypted_value: str


class StepStartedEvent(_AttributableEvent, tag="STEP_STARTED", kw_only=True):
    step_name: str


class StepFinishedEvent(_AttributableEvent, tag="STEP_FINISHED", kw_only=True):
    step_name: str


class StateSnapshotEvent(_AttributableEvent, tag="STATE_SNAPSHOT", kw_only=True):
    snapshot: Any


class StateDeltaEvent(_AttributableEvent, tag="STATE_DELTA", kw_only=True):
    delta: list[JsonPatchOperation]


class CustomEvent(_AttributableEvent, tag="CUSTOM", kw_only=True):
    name: str
    value: Any


class RawEvent(_AttributableEvent, tag="RAW", kw_only=True):
    event: Any
    source: str | None = None


Event: TypeAlias = (
    RunStartedEvent
    | RunFinishedEvent
    | RunErrorEvent
    | TextMessageStartEvent
    | TextMessageContentEvent
    | TextMessageEndEvent
    | ToolCallStartEvent
    | ToolCallArgsEvent
    | ToolCallEndEvent
    | ToolCallResultEvent
    | ReasoningStartEvent
    | ReasoningMessageStartEvent
    | ReasoningMessageContentEvent
    | ReasoningMessageEndEvent
    | ReasoningMessageChunkEvent
    | ReasoningEndEvent
    | ReasoningEncryptedValueEvent
    | StepStartedEvent
    | StepFinishedEvent
    | StateSnapshotEvent
    | StateDeltaEvent
    | CustomEvent
    | RawEvent
)

EVENT_TYPES: tuple[type[Event], ...] = get_args(Event)

# Wire names of the fields we add beyond ag_ui.core's models (protocol 1.0 keeps unknown fields as extras).
EXTRA_FIELDS: dict[type[msgspec.Struct], frozenset[str]] = {
    RunFinishedEvent: frozenset({"finishReason"}),
    RunErrorEvent: frozenset({"threadId", "runId"}),
    ToolCallStartEvent: frozenset({"toolName"}),
    ToolCallEndEvent: frozenset({"input"}),
    ToolCallResultEvent: frozenset({"state"}),
}
EVENT_TYPE_BY_NAME: dict[str, type[Event]] = {str(t.__struct_config__.tag): t for t in EVENT_TYPES}

_encoder = msgspec.json.Encoder()
# Bounded (boxwright._json): events arrive from agents (harness lines, journals) as often as from
# our own stores. ``decode_event`` inlines what BoundedDecoder.decode does: it is the hot path
# (bench/event_codec.py), and a Python call per event shows there.
_decoder: BoundedDecoder[Event] = BoundedDecoder(Event)
_raw_decoder: msgspec.json.Decoder[Event] = msgspec.json.Decoder(Event)
_canonical_encoder = msgspec.json.Encoder(order="sorted")


def _nests_any(info: msgspec.inspect.Type, seen: set[type]) -> bool:
    """Whether a type holds an ``Any`` anywhere (``raw_event`` and ``metadata`` aside: checked per event)."""
    if isinstance(info, msgspec.inspect.AnyType):
        return True
    if isinstance(info, msgspec.inspect.StructType):
        if info.cls in seen:
            return False
        seen.add(info.cls)
        return any(_nests_any(f.type, seen) for f in info.fields if f.name not in ("raw_event", "metadata"))
    inner: list[msgspec.inspect.Type] = []
    for name in ("item_type", "key_type", "value_type"):
        if isinstance(getattr(info, name, None), msgspec.inspect.Type):
            inner.append(getattr(info, name))
    inner += getattr(info, "types", ()) + getattr(info, "item_types", ())
    return any(_nests_any(t, seen) for t in inner)


# Event types whose fields nest no ``Any``: one decoded with ``raw_event`` and ``metadata`` unset is
# as shallow as its schema, whatever its text (levels msgspec skips, in unknown fields, are dropped,
# never kept), so ``decode_event`` skips the depth scan for it: most long events are these.
_SCHEMA_BOUNDED: frozenset[type] = frozenset(
    cls for cls in EVENT_TYPES if not _nests_any(msgspec.inspect.type_info(cls), set())
)


def encode_event(event: Event) -> bytes:
    """One event as compact JSON."""
    return _encoder.encode(event)


def decode_event(data: bytes | str) -> Event:
    """One event from JSON; raises EventDecodeError saying what was wrong."""
    try:
        event = _raw_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise EventDecodeError(_describe_failure(data, exc)) from None
    except RecursionError:
        raise EventDecodeError(_describe_failure(data, JsonTooDeepError(_decoder.max_depth))) from None
    if (
        len(data) > SHALLOW_LEN
        and (type(event) not in _SCHEMA_BOUNDED or event.raw_event is not None or event.metadata is not None)
        and depth_exceeds(data)
    ):
        raise EventDecodeError(_describe_failure(data, JsonTooDeepError(_decoder.max_depth)))
    return event


def encode_ndjson(events: Iterable[Event]) -> bytes:
    """Events as NDJSON, every line newline-terminated."""
    return _encoder.encode_lines(events)


def decode_ndjson(data: bytes | str) -> list[Event]:
    """Events from NDJSON, one per line, blank lines skipped.

    Raises EventDecodeError naming the 1-based line number and what was wrong with it.
    """
    if isinstance(data, str):
        try:
            data = data.encode()
        except UnicodeEncodeError as exc:
            raise EventDecodeError(f"NDJSON is not valid UTF-8 text: {exc}") from None
    # Fast path (about twice the speed of the loop): msgspec reads a stream of JSON values, which
    # matches NDJSON when it yields one event per line; otherwise (blank lines, a bad line) the
    # loop below decides, and names the line.
    try:
        events = _decoder.decode_lines(data)
    except msgspec.DecodeError:
        pass
    else:
        if len(events) == data.count(b"\n") + (not data.endswith(b"\n")):
            return events
    events = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line or line.isspace():
            continue
        try:
            events.append(_decoder.decode(line))
        except msgspec.DecodeError as exc:
            raise EventDecodeError(f"NDJSON line {number}: {_describe_failure(line, exc)}") from None
    return events


def _describe_failure(data: bytes | str, exc: msgspec.DecodeError) -> str:
    if isinstance(exc, JsonBoundsError) or not isinstance(exc, msgspec.ValidationError):
        return f"not valid JSON ({exc})"
    try:
        document = decode_json(data)
    except msgspec.DecodeError:
        # The text did not even parse as JSON: msgspec reports a number out of range (``1e999``,
        # ``7e5123a fix the parser``) as a ValidationError, with no schema involved.
        return f"not valid JSON ({exc})"
    kind = document.get("type") if isinstance(document, dict) else None
    if isinstance(kind, str) and kind in EVENT_TYPE_BY_NAME:
        return f"invalid {kind} event: {exc}"
    if isinstance(kind, str):
        return f"unknown event type {kind!r}"
    return f"not an AG-UI event: {exc}"


def chunk_fingerprint(event: Event) -> str:
    """A stable identity of an event for matching a replay against a stored log.

    sha256 hex of the canonical (sorted-key) JSON of every field but ``timestamp``. Also left
    out, so a store round trip or a TanStack client cannot fake a divergence: ``metadata.tanstack``
    (and ``metadata`` if nothing else is in it), and the difference between 1.0 and 1.
    """
    document: dict[str, Any] = msgspec.to_builtins(event)
    document.pop("timestamp", None)
    metadata = document.get("metadata")
    if isinstance(metadata, dict) and "tanstack" in metadata:
        rest = {key: value for key, value in metadata.items() if key != "tanstack"}
        if rest:
            document["metadata"] = rest
        else:
            del document["metadata"]
    canonical = _canonical_encoder.encode(_integral_floats_as_ints(document))
    return hashlib.sha256(canonical).hexdigest()


def _integral_floats_as_ints(value: Any) -> Any:
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) <= _MAX_SAFE_INT else value
    if isinstance(value, dict):
        return {key: _integral_floats_as_ints(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integral_floats_as_ints(item) for item in value]
    return value


class RunScopedIdGen(Protocol):
    def __call__(self, prefix: str = "") -> str: ...


def create_run_scoped_id_gen(run_id: str) -> RunScopedIdGen:
    """Ids unique within a run and the same for the same sequence of calls (no clock, no randomness).

    ``gen()`` yields ``f"{run_id}-0"``, ``f"{run_id}-1"``, ...; ``gen("msg")`` yields
    ``f"{run_id}-msg-0"``, ``f"{run_id}-msg-1"``, ...; each prefix counts on its own. A takeover
    that replays the journal through a fresh generator therefore mints the same ids again.
    Ids never collide: the counter is the last ``-`` field and holds no ``-`` itself.
    """
    counters: dict[str, int] = {}

    def gen(prefix: str = "") -> str:
        n = counters.get(prefix, 0)
        counters[prefix] = n + 1
        return f"{run_id}-{prefix}-{n}" if prefix else f"{run_id}-{n}"

    return gen


def now_ms() -> int:
    """Milliseconds since the Unix epoch, the unit of every event ``timestamp``."""
    return time.time_ns() // 1_000_000
