"""The tests' one SSE parser: the lines of a ``text/event-stream`` in, its messages out.

The EventSource rules the servers' streams rely on: a blank line ends a message; a line starting with ``:`` is a
comment (the servers' pings); ``field: value`` loses one space after the colon; several ``data`` lines join with
newlines; a message without a ``data`` line is not dispatched. Unlike a browser, a message's ``id`` is its own
(``None`` when it carries none) rather than the last one seen, so a client sees which message had which offset.

    for frame in parse_frames(response.iter_lines()): ...
    async for frame in aparse_frames(response.aiter_lines()): ...

``SseParser.feed`` takes one line at a time, for a client that acts between lines (a deadline the pings, which
end no message, would otherwise keep from being checked).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, Iterable, Iterator
from typing import NamedTuple


class Frame(NamedTuple):
    """One message: ``event`` (``None``: the default type), ``id`` (``None``: it had none), ``data``."""

    event: str | None
    id: str | None
    data: str


class SseParser:
    def __init__(self) -> None:
        self._event: str | None = None
        self._id: str | None = None
        self._data: list[str] = []

    def feed(self, line: str) -> Frame | None:
        """The message ``line`` completes (``line`` without its line end), if it is the blank line ending one."""
        if not line:
            frame = Frame(self._event, self._id, "\n".join(self._data)) if self._data else None
            self._event, self._id, self._data = None, None, []
            return frame
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        elif name == "data":
            self._data.append(value)
        return None


def parse_frames(lines: Iterable[str]) -> Iterator[Frame]:
    """The messages of a stream's lines, each as soon as the blank line ending it is read."""
    parser = SseParser()
    for line in lines:
        if (frame := parser.feed(line)) is not None:
            yield frame


async def aparse_frames(lines: AsyncIterable[str]) -> AsyncGenerator[Frame, None]:
    """``parse_frames`` over an async stream of lines (``httpx.Response.aiter_lines()``)."""
    parser = SseParser()
    async for line in lines:
        if (frame := parser.feed(line)) is not None:
            yield frame
