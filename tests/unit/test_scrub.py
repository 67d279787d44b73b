"""A run's secrets are masked in its events, also when a value arrives split over several deltas."""

from __future__ import annotations

import itertools
import string

import msgspec
import pytest

from boxwright.events import (
    CustomEvent,
    Event,
    RunFinishedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallStartEvent,
    encode_event,
)
from boxwright.scrub import EventScrubber, mask_then_tail
from boxwright.secrets import MASK, TOKEN_PREFIX, SecretScope, mint_token, redact, register_secret_values

SECRET = "sk-canary-7f3a9c0d2e"


def _split(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def _text_stream(pieces: list[str]) -> list[Event]:
    return [
        TextMessageStartEvent(message_id="m1", role="assistant"),
        *(TextMessageContentEvent(message_id="m1", delta=p) for p in pieces),
        TextMessageEndEvent(message_id="m1"),
    ]


def _scrub(scrubber: EventScrubber, events: list[Event]) -> list[Event]:
    out: list[Event] = []
    for event in events:
        out += scrubber.feed(event)
    return out + scrubber.flush()


def _text_of(events: list[Event]) -> str:
    return "".join(e.delta for e in events if isinstance(e, TextMessageContentEvent))


@pytest.mark.parametrize("parts", [2, 3, 4, 5])
def test_a_secret_split_over_text_deltas_is_masked(parts: int) -> None:
    text = f"the key is {SECRET} and again {SECRET}."
    start = text.index(SECRET)
    step = max(1, len(SECRET) // parts)
    cuts = [start + step * i for i in range(1, parts)]
    events = _scrub(EventScrubber([SECRET]), _text_stream(_split(text, cuts)))
    wire = b"".join(encode_event(e) for e in events).decode()
    assert SECRET not in wire
    for i in range(len(SECRET) - 5):  # no 6-character piece of it survives in any one event
        piece = SECRET[i : i + 6]
        assert all(piece not in encode_event(e).decode() for e in events), piece
    assert _text_of(events) == text.replace(SECRET, MASK)
    assert all(e.delta for e in events if isinstance(e, TextMessageContentEvent))  # no empty deltas


@pytest.mark.parametrize("parts", [2, 3, 5])
def test_a_secret_split_over_tool_argument_deltas_is_masked(parts: int) -> None:
    args = msgspec.json.encode({"command": f"curl -H 'x: {SECRET}' http://h"}).decode()
    start = args.index(SECRET)
    cuts = [start + i * 3 for i in range(1, parts)]
    events: list[Event] = [
        ToolCallStartEvent(tool_call_id="t1", tool_call_name="Bash"),
        *(ToolCallArgsEvent(tool_call_id="t1", delta=p) for p in _split(args, cuts)),
        ToolCallEndEvent(tool_call_id="t1"),
    ]
    out = _scrub(EventScrubber([SECRET]), events)
    joined = "".join(e.delta for e in out if isinstance(e, ToolCallArgsEvent))
    assert SECRET not in joined and joined == args.replace(SECRET, MASK)
    assert isinstance(out[-1], ToolCallEndEvent)
    assert msgspec.json.decode(joined)["command"] == f"curl -H 'x: {MASK}' http://h"


def test_held_text_is_released_before_the_end_and_before_the_terminal_event() -> None:
    scrubber = EventScrubber([SECRET])
    out = scrubber.feed(TextMessageContentEvent(message_id="m1", delta="ends with sk-can"))
    assert _text_of(out) == "ends with "  # "sk-can" could still become the key
    out = scrubber.feed(RunFinishedEvent(thread_id="t", run_id="r"))
    assert _text_of(out) == "sk-can" and isinstance(out[-1], RunFinishedEvent)


def test_text_without_secrets_passes_through_unchanged() -> None:
    events = _text_stream(["hello ", "world, ", "s", "k-", "no key here"])
    out = _scrub(EventScrubber([SECRET]), events)
    assert _text_of(out) == "hello world, sk-no key here"
    assert out[0] == events[0] and out[-1] == events[-1]
    assert _scrub(EventScrubber(), events) == events  # no secrets: the very same events


def test_scrubbing_is_deterministic_so_a_successor_reproduces_the_stored_events() -> None:
    text = f"a {SECRET} b {SECRET[:5]}"
    events = _text_stream(_split(text, [3, 7, 11, 19]))
    assert _scrub(EventScrubber([SECRET]), events) == _scrub(EventScrubber([SECRET]), events)


def test_other_events_are_masked_inside_strings_only() -> None:
    scrubber = EventScrubber(["12345", SECRET])
    event = CustomEvent(name="x", value={"n": 12345, "s": f"id 12345 {SECRET}", SECRET: 1})
    (out,) = scrubber.feed(event)
    assert isinstance(out, CustomEvent)
    assert out.value == {"n": 12345, "s": f"id {MASK} {MASK}", MASK: 1}


def test_mask_happens_before_the_tail_is_cut() -> None:
    stderr = ("x" * 2990) + SECRET + ("y" * 10)
    tail = mask_then_tail(stderr, 1000, EventScrubber([SECRET]))
    assert all(SECRET[i:] not in tail for i in range(len(SECRET) - 3))
    assert tail.endswith(MASK + "y" * 10)


def test_a_scope_masks_while_open_and_releases_at_exit() -> None:
    token = "bridge-token-only-this-run-91c2"
    with SecretScope() as scope:
        scope.add([token])
        assert redact(f"Bearer {token}") == f"Bearer {MASK}"
    assert redact(f"Bearer {token}") == f"Bearer {token}"  # released: not masked, not paid for, forever


def test_a_value_held_process_wide_outlives_a_scope_that_also_held_it() -> None:
    value = "configured-app-secret-5d1e"
    register_secret_values([value])
    with SecretScope([value]):
        pass
    assert redact(value) == MASK


def test_two_hosts_with_their_own_minted_tokens_cut_the_replayed_text_alike() -> None:
    # A successor re-translates the journal with its own bridge token among the secrets. Deltas that
    # end in any character a token may start with must still be held (or not) exactly as the
    # predecessor's scrubber held them, or the takeover's alignment sees a divergence.
    ends = string.ascii_letters + string.digits + "-_"
    events = _text_stream([f"word{ch}" for ch in ends] + [" done"])
    for _ in range(50):
        host_a = _scrub(EventScrubber([SECRET, mint_token()]), events)
        host_b = _scrub(EventScrubber([SECRET, mint_token()]), events)
        assert host_a == host_b
    assert mint_token().startswith(TOKEN_PREFIX) and len(mint_token()) > 40


def test_random_first_characters_would_cut_the_text_differently() -> None:
    # The hazard the prefix removes: two tokens that start differently hold back different ends.
    events = _text_stream(["the", " cat"])
    assert _scrub(EventScrubber(["e" + "1" * 40]), events) != _scrub(EventScrubber(["x" + "1" * 40]), events)
