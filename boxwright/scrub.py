"""Masks a run's secret values in its events, also when a value arrives split over several deltas.

Model text streams token by token, so a key the agent repeats reaches us as ``"sk-ab"`` in one
``TEXT_MESSAGE_CONTENT`` and ``"cd12"`` in the next: masking each event on its own would store both
halves. Each delta stream (a text message, a tool call's arguments, a reasoning message) keeps back
the longest end of what it has seen that could still become a secret (at most the longest secret's
length minus one characters) and emits it with the next delta or, at the stream's end event, just
before it. Every other event is masked whole.

Deterministic: the same translated events give the same scrubbed events, so a successor that
re-translates a run's journal produces exactly what its predecessor stored.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from .events import (
    Event,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    RunErrorEvent,
    RunFinishedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    decode_event,
    encode_event,
)
from .secrets import MASK, SecretScope

_DeltaEvent = TextMessageContentEvent | ToolCallArgsEvent | ReasoningMessageContentEvent
_StreamKey = tuple[str, str]


def _key(event: Event) -> _StreamKey | None:
    if isinstance(event, (TextMessageContentEvent, TextMessageEndEvent)):
        return ("text", event.message_id)
    if isinstance(event, (ToolCallArgsEvent, ToolCallEndEvent)):
        return ("args", event.tool_call_id)
    if isinstance(event, (ReasoningMessageContentEvent, ReasoningMessageEndEvent)):
        return ("reasoning", event.message_id)
    return None


class EventScrubber:
    """Per run: ``feed`` each event, get back the events to publish (none, one or several).

    A terminal event (RUN_FINISHED / RUN_ERROR) first flushes every open stream, so no held text
    is lost; ``flush()`` does the same for a run that ends without one. With a ``scope``, every
    value added is also masked in logs and errors while that scope is open.
    """

    def __init__(self, values: Iterable[str] = (), *, scope: SecretScope | None = None) -> None:
        self._scope = scope
        self._needles: list[str] = []
        self._prefixes: set[str] = set()
        self._longest = 0
        self._held: dict[_StreamKey, tuple[_DeltaEvent, str]] = {}
        self.add(values)

    def add(self, values: Iterable[str]) -> None:
        values = [v for v in values if v]
        if self._scope is not None:
            self._scope.add(values)
        needles = set(self._needles)
        for value in values:
            if value:
                needles.add(value)
                # Tool arguments are JSON text: a value with a quote or a backslash appears escaped there.
                needles.add(msgspec.json.encode(value).decode()[1:-1])
        # Longest first, so a value that contains another is masked whole.
        self._needles = sorted(needles, key=len, reverse=True)
        self._prefixes = {n[:i] for n in self._needles for i in range(1, len(n))}
        self._longest = len(self._needles[0]) if self._needles else 0

    @property
    def longest(self) -> int:
        """The length of the longest value masked (in any of its encodings)."""
        return self._longest

    def mask(self, text: str) -> str:
        for needle in self._needles:
            if needle in text:
                text = text.replace(needle, MASK)
        return text

    def feed(self, event: Event) -> list[Event]:
        if not self._needles:
            return [event]
        if isinstance(event, (RunFinishedEvent, RunErrorEvent)):
            return [*self.flush(), self._mask_whole(event)]
        key = _key(event)
        if key is None:
            return [self._mask_whole(event)]
        if isinstance(event, (TextMessageContentEvent, ToolCallArgsEvent, ReasoningMessageContentEvent)):
            return self._feed_delta(key, event)
        return [*self._release(key), self._mask_whole(event)]

    def flush(self) -> list[Event]:
        out: list[Event] = []
        for key in list(self._held):
            out += self._release(key)
        return out

    def _feed_delta(self, key: _StreamKey, event: _DeltaEvent) -> list[Event]:
        _, held = self._held.pop(key, (event, ""))
        text = self.mask(held + event.delta)
        keep = self._hold_back(text)
        out: list[Event] = []
        if keep < len(text):
            out.append(msgspec.structs.replace(event, delta=text[: len(text) - keep]))
        if keep:
            self._held[key] = (event, text[len(text) - keep :])
        return out

    def _hold_back(self, text: str) -> int:
        """How many trailing characters of ``text`` could be the start of a secret."""
        for size in range(min(len(text), self._longest - 1), 0, -1):
            if text[-size:] in self._prefixes:
                return size
        return 0

    def _release(self, key: _StreamKey) -> list[Event]:
        found = self._held.pop(key, None)
        if found is None:
            return []
        template, text = found
        return [msgspec.structs.replace(template, delta=text)]

    def _mask_whole(self, event: Event) -> Event:
        raw = encode_event(event).decode()
        if not any(needle in raw for needle in self._needles):
            return event
        # Inside strings only: a value that happens to be digits must not turn a number into "***".
        return decode_event(msgspec.json.encode(self._mask_value(msgspec.json.decode(raw))))

    def _mask_value(self, value: object) -> object:
        if isinstance(value, str):
            return self.mask(value)
        if isinstance(value, list):
            return [self._mask_value(v) for v in value]
        if isinstance(value, dict):
            return {self.mask(k): self._mask_value(v) for k, v in value.items()}
        return value


def mask_then_tail(text: str, limit: int, scrubber: EventScrubber | None) -> str:
    """The last ``limit`` characters of ``text`` after masking: cutting first could keep half a key."""
    masked = scrubber.mask(text) if scrubber is not None else text
    return masked[-limit:] if limit >= 0 else masked
