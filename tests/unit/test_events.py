"""boxwright.events against the official ag-ui-protocol package, both directions."""

from __future__ import annotations

import time
from typing import Any

import ag_ui._generated.models as agui_models
import ag_ui.core as agui
import msgspec
import pytest
from ag_ui.encoder import EventEncoder
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter, ValidationError

from boxwright import events as ev
from boxwright.errors import BoxwrightError, EventDecodeError

OFFICIAL_EVENT = TypeAdapter(agui.Event)


def official_wire(event: agui.BaseEvent) -> str:
    """What the official SSE encoder puts after ``data: ``."""
    frame = EventEncoder().encode(event)
    assert frame.startswith("data: ") and frame.endswith("\n\n")
    return frame[len("data: ") : -2]


META = {"source": "test", "nested": {"b": [1, 2.5, None], "a": True}}
RAW = {"provider": "claude", "line": 7}
COMMON: dict[str, Any] = {"timestamp": 1_700_000_000_123, "raw_event": RAW, "metadata": META}
SUB: dict[str, Any] = {**COMMON, "subagent_run_id": "sub-1"}
USAGE = [
    ev.TokenUsage(
        provider="anthropic",
        model="claude-x",
        input_tokens=100,
        output_tokens=40,
        total_tokens=140,
        reasoning_tokens=10,
        cached_input_tokens=60,
        cache_write_input_tokens=20,
    )
]
INTERRUPT = ev.Interrupt(
    subagent_run_id="sub-1",
    id="int-1",
    reason="tool-approval",
    message="Allow rm?",
    tool_call_id="tc-1",
    response_schema={"type": "object"},
    expires_at="2030-01-01T00:00:00Z",
    metadata={"k": "v"},
)
PARTS: list[ev.ContentPart] = [
    ev.TextPart(id="p1", text="hello", metadata={"k": 1}),
    ev.ImagePart(id="p2", source=ev.DataSource(value="aGk=", mime_type="image/png"), metadata={"k": 2}),
    ev.AudioPart(id="p3", source=ev.UrlSource(value="https://x/a.mp3", mime_type="audio/mpeg"), metadata=3),
    ev.VideoPart(id="p4", source=ev.FileSource(value="file-1", provider="openai", mime_type="video/mp4"), metadata="m"),
    ev.DocumentPart(id="p5", source=ev.UrlSource(value="https://x/d.pdf", mime_type="application/pdf"), metadata=[1]),
]
PATCH: list[ev.JsonPatchOperation] = [
    ev.AddOperation(path="/a", value={"x": 1}),
    ev.AddOperation(path="/n", value=None),
    ev.RemoveOperation(path="/b"),
    ev.ReplaceOperation(path="/c/0", value=[1, 2]),
    ev.MoveOperation(from_="/d", path="/e~1f"),
    ev.CopyOperation(from_="/e~1f", path="/g"),
    ev.TestOperation(path="", value={"whole": "doc"}),
]

# Every optional field set, so a misnamed one cannot hide. Several samples where a type has variants.
SAMPLES: list[ev.Event] = [
    ev.RunStartedEvent(
        **COMMON,
        thread_id="t1",
        run_id="r7",
        protocol_version="1.0",
        parent_run_id="r6",
        input={"threadId": "t1", "runId": "r7", "messages": [{"id": "u1", "role": "user", "content": "hi"}]},
    ),
    ev.RunFinishedEvent(
        **COMMON,
        thread_id="t1",
        run_id="r7",
        result={"answer": 42},
        outcome=ev.RunFinishedSuccessOutcome(pending_tool_call_ids=["tc-1"]),
        usage=USAGE,
        finish_reason="stop",
    ),
    ev.RunFinishedEvent(
        **COMMON,
        thread_id="t1",
        run_id="r7",
        result="paused",
        outcome=ev.RunFinishedInterruptOutcome(interrupts=[INTERRUPT]),
        usage=USAGE,
        finish_reason="length",
    ),
    ev.RunFinishedEvent(
        **COMMON,
        thread_id="t1",
        run_id="r7",
        result=0,
        outcome=ev.RunFinishedCancelledOutcome(),
        usage=[],
        finish_reason="content_filter",
    ),
    ev.RunErrorEvent(**COMMON, message="boom", code="E_AGENT", usage=USAGE, thread_id="t1", run_id="r7"),
    ev.TextMessageStartEvent(**SUB, message_id="m1", role="assistant", name="claude"),
    ev.TextMessageContentEvent(**SUB, message_id="m1", delta="Hello ✓ \u2028 world"),
    ev.TextMessageEndEvent(**SUB, message_id="m1"),
    ev.ToolCallStartEvent(
        **SUB,
        tool_call_id="tc-1",
        tool_call_name="mcp__boxwright__get_fact",
        parent_message_id="m1",
        tool_name="get_fact",
    ),
    ev.ToolCallArgsEvent(**SUB, tool_call_id="tc-1", delta='{"topic":"x"}'),
    ev.ToolCallEndEvent(**SUB, tool_call_id="tc-1", input={"topic": "x"}),
    ev.ToolCallResultEvent(
        **SUB, message_id="m2", tool_call_id="tc-1", content="42", role="tool", state="output-available"
    ),
    ev.ToolCallResultEvent(
        **SUB, message_id="m3", tool_call_id="tc-2", content=PARTS, role="tool", state="output-error"
    ),
    ev.ReasoningStartEvent(**SUB, message_id="r1"),
    ev.ReasoningMessageStartEvent(**SUB, message_id="r1", role="reasoning"),
    ev.ReasoningMessageContentEvent(**SUB, message_id="r1", delta="thinking"),
    ev.ReasoningMessageEndEvent(**SUB, message_id="r1"),
    ev.ReasoningMessageChunkEvent(**SUB, message_id="r1", delta="more"),
    ev.ReasoningEndEvent(**SUB, message_id="r1"),
    ev.ReasoningEncryptedValueEvent(**SUB, subtype="tool-call", entity_id="tc-1", encrypted_value="b64=="),
    ev.StepStartedEvent(**SUB, step_name="plan"),
    ev.StepFinishedEvent(**SUB, step_name="plan"),
    ev.StateSnapshotEvent(**SUB, snapshot={"todo": ["a", "b"], "done": 0}),
    ev.StateDeltaEvent(**SUB, delta=PATCH),
    ev.CustomEvent(**SUB, name="run.accepted", value={"runId": "r7"}),
    ev.RawEvent(**SUB, event={"type": "stream_event", "delta": "x"}, source="claude-code"),
]


def _id(sample: ev.Event) -> str:
    return sample.type


def _extra_fields(value: Any, where: str = "$") -> list[str]:
    """Keys the official models kept as unknown extras, i.e. keys we spelled differently than they do."""
    found: list[str] = []
    if isinstance(value, BaseModel):
        found += [f"{where}.{key}" for key in value.model_extra or {}]
        for name in type(value).model_fields:
            found += _extra_fields(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _extra_fields(item, f"{where}[{index}]")
    return found


def _struct_types(value: Any) -> set[type[msgspec.Struct]]:
    if isinstance(value, msgspec.Struct):
        found = {type(value)}
        for field in msgspec.structs.fields(value):
            found |= _struct_types(getattr(value, field.name))
        return found
    if isinstance(value, list):
        return set().union(*map(_struct_types, value))
    return set()


def test_every_union_member_and_nested_struct_has_a_sample() -> None:
    assert {type(sample) for sample in SAMPLES} == set(ev.EVENT_TYPES), "add a sample for each new Event member"
    assert len(ev.EVENT_TYPES) == len(ev.EVENT_TYPE_BY_NAME)
    assert _struct_types(SAMPLES) == set(ev.EVENT_TYPES) | set(NESTED_TYPES)


NESTED_TYPES: list[type[msgspec.Struct]] = [
    value
    for name, value in vars(ev).items()
    if isinstance(value, type)
    and issubclass(value, msgspec.Struct)
    and not name.startswith("_")
    and value not in ev.EVENT_TYPES
]


@pytest.mark.parametrize("ours", [*ev.EVENT_TYPES, *NESTED_TYPES], ids=lambda t: t.__name__)
def test_fields_and_their_optionality_mirror_the_official_model(ours: type[msgspec.Struct]) -> None:
    # ag_ui.core does not re-export the JSON Patch operations; the generated module holds them all.
    official: type[BaseModel] = getattr(agui_models, ours.__name__)
    tag_field = ours.__struct_config__.tag_field
    theirs = {f.alias or name: f.is_required() for name, f in official.model_fields.items() if name != tag_field}
    extras = ev.EXTRA_FIELDS.get(ours, frozenset())
    mine = {f.encode_name: f.required for f in msgspec.structs.fields(ours) if f.encode_name not in extras}
    assert mine == theirs
    assert all(not f.required for f in msgspec.structs.fields(ours) if f.encode_name in extras)
    if tag_field is not None:
        assert official.model_fields[tag_field].default == ours.__struct_config__.tag


@pytest.mark.parametrize("sample", SAMPLES, ids=_id)
def test_samples_set_every_field(sample: ev.Event) -> None:
    unset = [f.name for f in msgspec.structs.fields(sample) if getattr(sample, f.name) is None]
    assert unset == []


@pytest.mark.parametrize("sample", SAMPLES, ids=_id)
def test_our_encoding_validates_with_the_official_package(sample: ev.Event) -> None:
    wire = ev.encode_event(sample)
    official = OFFICIAL_EVENT.validate_json(wire)
    assert type(official).__name__ == type(sample).__name__
    assert official.type.value == sample.type
    declared = {f"$.{key}" for key in ev.EXTRA_FIELDS.get(type(sample), ())}
    assert set(_extra_fields(official)) <= declared
    ours_as_json = msgspec.json.decode(wire)
    assert official.model_dump(mode="json", by_alias=True) == ours_as_json


@pytest.mark.parametrize("sample", SAMPLES, ids=_id)
def test_our_decode_of_our_encode_is_equal(sample: ev.Event) -> None:
    assert ev.decode_event(ev.encode_event(sample)) == sample
    assert ev.decode_event(ev.encode_event(sample).decode()) == sample


@pytest.mark.parametrize("sample", SAMPLES, ids=_id)
def test_official_encoding_decodes_with_ours(sample: ev.Event) -> None:
    official = OFFICIAL_EVENT.validate_json(ev.encode_event(sample))
    assert ev.decode_event(official_wire(official)) == sample
    assert ev.decode_event(official.model_dump_json(by_alias=True)) == sample


@pytest.mark.parametrize("sample", SAMPLES, ids=_id)
def test_official_exclude_none_encoding_is_accepted_exactly_when_the_official_package_accepts_it(
    sample: ev.Event,
) -> None:
    # exclude_none (the 0.x idiom) also drops required nulls, e.g. STATE_DELTA's {"op":"add","value":null}.
    wire = OFFICIAL_EVENT.validate_json(ev.encode_event(sample)).model_dump_json(by_alias=True, exclude_none=True)
    try:
        OFFICIAL_EVENT.validate_json(wire)
    except ValidationError:
        with pytest.raises(EventDecodeError):
            ev.decode_event(wire)
    else:
        assert ev.decode_event(wire) == sample


# Built with the official constructors only, required fields only: their defaults must decode with ours.
OFFICIAL_MINIMAL: list[agui.BaseEvent] = [
    agui.RunStartedEvent(thread_id="t", run_id="r"),
    agui.RunFinishedEvent(thread_id="t", run_id="r"),
    agui.RunErrorEvent(message="boom"),
    agui.TextMessageStartEvent(message_id="m"),
    agui.TextMessageContentEvent(message_id="m", delta=""),
    agui.TextMessageEndEvent(message_id="m"),
    agui.ToolCallStartEvent(tool_call_id="c", tool_call_name="f"),
    agui.ToolCallArgsEvent(tool_call_id="c", delta="{}"),
    agui.ToolCallEndEvent(tool_call_id="c"),
    agui.ToolCallResultEvent(message_id="m", tool_call_id="c", content="ok"),
    agui.ReasoningStartEvent(message_id="m"),
    agui.ReasoningMessageStartEvent(message_id="m"),
    agui.ReasoningMessageContentEvent(message_id="m", delta="x"),
    agui.ReasoningMessageEndEvent(message_id="m"),
    agui.ReasoningMessageChunkEvent(),
    agui.ReasoningEndEvent(message_id="m"),
    agui.ReasoningEncryptedValueEvent(subtype="message", entity_id="m", encrypted_value="e"),
    agui.StepStartedEvent(step_name="s"),
    agui.StepFinishedEvent(step_name="s"),
    agui.StateSnapshotEvent(snapshot=None),
    agui.StateDeltaEvent(delta=[]),
    agui.CustomEvent(name="n", value=None),
    agui.RawEvent(event=None),
]


def test_official_minimal_samples_cover_every_member() -> None:
    assert {type(m).__name__ for m in OFFICIAL_MINIMAL} == {t.__name__ for t in ev.EVENT_TYPES}


@pytest.mark.parametrize("official", OFFICIAL_MINIMAL, ids=lambda m: type(m).__name__)
def test_official_minimal_events_round_trip_through_ours(official: agui.BaseEvent) -> None:
    wire = official_wire(official)
    ours = ev.decode_event(wire)
    assert type(ours).__name__ == type(official).__name__
    assert msgspec.json.decode(ev.encode_event(ours)) == msgspec.json.decode(wire)


def test_reasoning_is_the_family_the_official_package_accepts() -> None:
    with pytest.raises(ValidationError):
        OFFICIAL_EVENT.validate_python({"type": "THINKING_START"})
    assert not any(name.startswith("THINKING") for name in ev.EVENT_TYPE_BY_NAME)
    official_reasoning = {t.value for t in agui.EventType if t.value.startswith("REASONING_")}
    assert official_reasoning <= set(ev.EVENT_TYPE_BY_NAME)


def test_unset_optionals_are_left_off_the_wire_and_reasoning_role_is_not() -> None:
    assert ev.encode_event(ev.TextMessageEndEvent(message_id="m")) == b'{"type":"TEXT_MESSAGE_END","messageId":"m"}'
    assert ev.encode_event(ev.ReasoningMessageStartEvent(message_id="m")) == (
        b'{"type":"REASONING_MESSAGE_START","messageId":"m","role":"reasoning"}'
    )
    assert ev.decode_event(b'{"type":"REASONING_MESSAGE_START","messageId":"m"}') == ev.ReasoningMessageStartEvent(
        message_id="m"
    )
    assert ev.encode_event(ev.CustomEvent(name="n", value=None)) == b'{"type":"CUSTOM","name":"n","value":null}'


def test_timestamp_outside_the_json_safe_range_is_refused_like_the_official_package() -> None:
    wire = b'{"type":"STEP_STARTED","stepName":"s","timestamp":9007199254740992}'
    with pytest.raises(ValidationError):
        OFFICIAL_EVENT.validate_json(wire)
    with pytest.raises(EventDecodeError, match="timestamp"):
        ev.decode_event(wire)


# --- NDJSON ---------------------------------------------------------------------------------


def test_ndjson_batch_round_trips() -> None:
    data = ev.encode_ndjson(SAMPLES)
    assert data.endswith(b"\n")
    assert data.count(b"\n") == len(SAMPLES)
    assert ev.decode_ndjson(data) == SAMPLES
    assert ev.decode_ndjson(data.decode()) == SAMPLES
    assert ev.encode_ndjson(iter(SAMPLES)) == data
    assert ev.encode_ndjson([]) == b""


def test_ndjson_skips_blank_lines_and_accepts_crlf() -> None:
    one, two = SAMPLES[5], SAMPLES[6]
    data = b"\n  \n" + ev.encode_event(one) + b"\r\n\t\r\n" + ev.encode_event(two)
    assert ev.decode_ndjson(data) == [one, two]
    assert ev.decode_ndjson(b"") == []
    assert ev.decode_ndjson("\n\n") == []


GOOD = ev.encode_event(ev.TextMessageEndEvent(message_id="m"))


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"type":"TEXT_MESSAGE_END","messageId":"m"} trailing', "not valid JSON"),
        (b'{"type":"NOPE","messageId":"m"}', "unknown event type 'NOPE'"),
        (b'{"type":"THINKING_START"}', "unknown event type 'THINKING_START'"),
        (b'{"type":"TEXT_MESSAGE_CONTENT","messageId":"m"}', "invalid TEXT_MESSAGE_CONTENT event: .*`delta`"),
        (b'{"type":"TOOL_CALL_START","toolCallId":1,"toolCallName":"f"}', "invalid TOOL_CALL_START event"),
        (b'{"messageId":"m"}', "not an AG-UI event: .*`type`"),
        (b'{"type":["RAW"]}', "not an AG-UI event"),
        (b"[1, 2]", "not an AG-UI event"),
    ],
)
def test_malformed_ndjson_names_the_line_and_the_fault(bad_line: bytes, expected: str) -> None:
    data = GOOD + b"\n\n" + bad_line + b"\n" + GOOD + b"\n"
    with pytest.raises(EventDecodeError, match=f"^NDJSON line 3: {expected}") as caught:
        ev.decode_ndjson(data)
    assert isinstance(caught.value, BoxwrightError)
    assert isinstance(caught.value, ValueError)
    with pytest.raises(EventDecodeError, match=f"^{expected}"):
        ev.decode_event(bad_line)


def test_ndjson_is_one_event_per_line() -> None:
    with pytest.raises(EventDecodeError, match=r"^NDJSON line 1: not valid JSON"):
        ev.decode_ndjson(b'{"type":"TEXT_MESSAGE_END",\n"messageId":"m"}\n')
    with pytest.raises(EventDecodeError, match=r"^NDJSON line 2: not valid JSON"):
        ev.decode_ndjson(GOOD + b"\n" + GOOD + GOOD + b"\n")


def test_ndjson_str_with_a_lone_surrogate_is_refused() -> None:
    with pytest.raises(EventDecodeError, match="UTF-8"):
        ev.decode_ndjson('{"type":"RAW","event":"\ud800"}\n')


# --- fingerprints ---------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(value=json_values, t1=st.integers(0, 2**53 - 1), t2=st.integers(0, 2**53 - 1))
def test_fingerprint_ignores_timestamp_and_survives_a_wire_round_trip(value: Any, t1: int, t2: int) -> None:
    first = ev.CustomEvent(name="x", value=value, timestamp=t1)
    second = ev.decode_event(ev.encode_event(msgspec.structs.replace(first, timestamp=t2)))
    assert ev.chunk_fingerprint(first) == ev.chunk_fingerprint(second)


@given(metadata=st.dictionaries(st.text(max_size=8), json_values, min_size=1, max_size=6))
def test_fingerprint_ignores_key_order(metadata: dict[str, Any]) -> None:
    reordered = dict(reversed(list(metadata.items())))
    event = ev.TextMessageEndEvent(message_id="m", metadata=metadata)
    assert ev.chunk_fingerprint(event) == ev.chunk_fingerprint(msgspec.structs.replace(event, metadata=reordered))


@given(a=st.text(), b=st.text())
def test_fingerprint_tells_deltas_apart(a: str, b: str) -> None:
    fa = ev.chunk_fingerprint(ev.TextMessageContentEvent(message_id="m", delta=a))
    fb = ev.chunk_fingerprint(ev.TextMessageContentEvent(message_id="m", delta=b))
    assert (fa == fb) == (a == b)


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, str):
        return value + "~"
    if isinstance(value, int):
        return value + 1
    if isinstance(value, dict):
        return {**value, "~": 1}
    if isinstance(value, list):
        return [*value, value[0]] if value else [1]
    return "~"  # a nested struct


@pytest.mark.parametrize("sample", SAMPLES, ids=_id)
def test_fingerprint_changes_with_every_field_but_timestamp(sample: ev.Event) -> None:
    original = ev.chunk_fingerprint(sample)
    assert len(original) == 64 and int(original, 16) >= 0
    for field in msgspec.structs.fields(sample):
        changed = msgspec.structs.replace(sample, **{field.name: _changed(getattr(sample, field.name))})
        same = ev.chunk_fingerprint(changed) == original
        assert same == (field.name == "timestamp"), field.name


def test_fingerprint_sees_nested_changes_and_the_event_type() -> None:
    base = ev.ToolCallResultEvent(message_id="m", tool_call_id="c", content=PARTS)
    nested = msgspec.structs.replace(base, content=[*PARTS[:-1], ev.TextPart(text="other")])
    assert ev.chunk_fingerprint(base) != ev.chunk_fingerprint(nested)
    assert ev.chunk_fingerprint(ev.StepStartedEvent(step_name="s")) != ev.chunk_fingerprint(
        ev.StepFinishedEvent(step_name="s")
    )


def test_fingerprint_ignores_tanstack_metadata_and_integral_float_spelling() -> None:
    plain = ev.CustomEvent(name="n", value={"count": 1})
    tagged = ev.CustomEvent(name="n", value={"count": 1.0}, metadata={"tanstack": {"threadId": "t"}})
    assert ev.chunk_fingerprint(plain) == ev.chunk_fingerprint(tagged)
    other = msgspec.structs.replace(tagged, metadata={"tanstack": {}, "k": 1})
    assert ev.chunk_fingerprint(other) != ev.chunk_fingerprint(plain)
    assert ev.chunk_fingerprint(ev.CustomEvent(name="n", value=1.5)) != ev.chunk_fingerprint(
        ev.CustomEvent(name="n", value=1)
    )


# --- ids and time ---------------------------------------------------------------------------


def test_id_gen_format_and_independent_counters() -> None:
    gen = ev.create_run_scoped_id_gen("r7")
    assert [gen(), gen(), gen("msg"), gen("tool"), gen("msg"), gen()] == [
        "r7-0",
        "r7-1",
        "r7-msg-0",
        "r7-tool-0",
        "r7-msg-1",
        "r7-2",
    ]


prefixes = st.lists(st.sampled_from(["", "msg", "tool", "0", "msg-0", "-", "a-b"]) | st.text(max_size=5))


@given(calls=prefixes, run_id=st.text(min_size=1, max_size=8))
def test_id_gen_is_deterministic_and_unique_within_a_run(calls: list[str], run_id: str) -> None:
    first, second = ev.create_run_scoped_id_gen(run_id), ev.create_run_scoped_id_gen(run_id)
    ids = [first(prefix) for prefix in calls]
    assert ids == [second(prefix) for prefix in calls]
    assert len(set(ids)) == len(ids)
    assert all(i.startswith(f"{run_id}-") for i in ids)


def test_now_ms_is_epoch_milliseconds() -> None:
    before = int(time.time() * 1000)
    value = ev.now_ms()
    after = int(time.time() * 1000)
    assert isinstance(value, int)
    assert before - 1 <= value <= after + 1
