"""JSON decoding with a bound on nesting depth and size, for every document that crosses a boundary.

HTTP bodies, WebSocket frames and the lines an agent prints are written by someone else. msgspec
decodes them at C speed but bounds nesting only by the interpreter's recursion limit: 100k
levels of ``[`` raise ``RecursionError`` (not a ``DecodeError``, so handlers meant for bad JSON
miss it and a request ends in a 500 or a run fails), and a document just under that limit
decodes, then breaks whatever walks it next. Every boundary decode goes through here instead.

Depth limit: 128 levels (``MAX_JSON_DEPTH``). It is serde_json's default recursion limit, so
anything a Rust-built agent emits or accepts passes; AG-UI events nest at most 6 levels by
schema and MCP tool arguments a few more; and it leaves most of Python's 1,000-frame recursion
budget to the recursive code that later walks a document (msgspec's encoder, ``json.dumps``, the
scrubber), called from the 50-100 frames deep asyncio and Starlette stacks.

Cost: a valid document of at most 257 bytes (``SHALLOW_LEN``), or with at most 128 ``[`` and
``{`` in all, cannot nest deeper than 128, so the common case costs a ``len`` or two
``bytes.count`` calls after the decode. Only a document with more brackets than that (in its
strings or not) gets the exact check, a chain of C-level ``bytes`` operations (``replace``,
``translate``), never a Python loop per byte: see ``depth_exceeds``.

Both errors subclass ``msgspec.DecodeError``, so a handler written for bad JSON (HTTP 400, JSON-RPC
-32700, "not an event, so text") already treats a too-deep or too-large document the same way.
"""

from __future__ import annotations

import re
from typing import Any, Generic, TypeVar, overload

import msgspec

from .errors import BoxwrightError

__all__ = [
    "MAX_AGENT_LINE_BYTES",
    "MAX_JSON_DEPTH",
    "SHALLOW_LEN",
    "BoundedDecoder",
    "JsonBoundsError",
    "JsonTooDeepError",
    "JsonTooLargeError",
    "decode_json",
    "depth_exceeds",
]

MAX_JSON_DEPTH = 128
# An agent's NDJSON line: Claude Code's largest are tool results with a base64 image (5 MB before
# encoding); a longer line is handled as text, like any other line that is not an event.
MAX_AGENT_LINE_BYTES = 16 << 20
# A valid document nesting deeper than MAX_JSON_DEPTH has at least that many brackets open and as
# many closed: one of at most this many bytes (or characters) never needs checking.
SHALLOW_LEN = 2 * MAX_JSON_DEPTH + 1

T = TypeVar("T")


class JsonBoundsError(BoxwrightError, msgspec.DecodeError):
    """A JSON document outside the bounds a boundary accepts (too deep, too large)."""


class JsonTooDeepError(JsonBoundsError):
    """A JSON document nests deeper than ``max_depth`` arrays and objects."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        super().__init__(f"JSON nested deeper than {max_depth} levels")


class JsonTooLargeError(JsonBoundsError):
    """A JSON document longer than ``max_bytes`` (characters, for a ``str``)."""

    def __init__(self, size: int, max_bytes: int) -> None:
        self.size = size
        self.max_bytes = max_bytes
        super().__init__(f"JSON document of {size} bytes is over the {max_bytes}-byte limit")


# The skeleton of a document: its quotes and its brackets, ``{}`` folded into ``[]`` (in valid JSON
# they nest properly, so one kind is enough to measure depth).
_FOLD = bytes.maketrans(b"{}", b"[]")
_NOT_SKELETON = bytes(byte for byte in range(256) if byte not in b'"[]{}')
_STRING = re.compile(rb'"[^"]*"')


# Documents are checked in spans of about this many bytes, each cut after a newline: a line lies
# in one span, so a span with few enough brackets proves all its lines shallow, and an NDJSON batch
# of small events pays for a few ``count`` calls per span rather than the exact check.
_SPAN = 4096


def depth_exceeds(data: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``data`` (one JSON document, or NDJSON) nests deeper than ``max_depth``.

    Exact for valid JSON; for anything else the answer does not matter, since the decoder refuses
    it. A span (see ``_SPAN``) with at most ``max_depth`` ``[`` and ``{`` cannot nest deeper; any
    other goes through ``_exact_depth_exceeds``.
    """
    size = len(data)
    if size <= 2 * max_depth + 1:
        return False
    if isinstance(data, str):
        if size <= _SPAN:  # one span: no loop (this is every event line but a few)
            return data.count("[") + data.count("{") > max_depth and _exact_depth_exceeds(
                data.encode("utf-8", "surrogatepass"), max_depth
            )
        opens: tuple[Any, Any, Any] = ("[", "{", "\n")
    else:
        if size <= _SPAN:
            return data.count(b"[") + data.count(b"{") > max_depth and _exact_depth_exceeds(data, max_depth)
        opens = (b"[", b"{", b"\n")
    square, curly, newline = opens
    start = 0
    while start < size:
        end = (data.find(newline, start + _SPAN) + 1) or size
        if data.count(square, start, end) + data.count(curly, start, end) > max_depth:
            span = data[start:end]
            raw = span.encode("utf-8", "surrogatepass") if isinstance(span, str) else span
            if _exact_depth_exceeds(raw, max_depth):
                return True
        start = end
    return False


def _exact_depth_exceeds(data: bytes, max_depth: int) -> bool:
    """The exact check, each step one C-level pass over bytes:

    1. drop escaped backslashes, then escaped quotes (left to right, as JSON reads them), so every
       ``"`` left is a string delimiter;
    2. keep only quotes and brackets (``translate``), and drop ``""`` pairs: a pair of adjacent
       quotes either is an empty-looking string or joins two strings with no bracket between
       them, and removing either changes no bracket's inside/outside-a-string status;
    3. cut what is left of strings (few now: only those holding brackets);
    4. peel innermost ``[]`` pairs (one nesting level per ``replace``) at most ``max_depth``
       times: a pair still there afterwards is a level beyond the limit.
    """
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    skeleton = data.translate(_FOLD, _NOT_SKELETON).replace(b'""', b"")
    if b'"' in skeleton:
        skeleton = _STRING.sub(b"", skeleton)
    for _ in range(max_depth):
        peeled = skeleton.replace(b"[]", b"")
        if len(peeled) == len(skeleton):
            return False  # empty (done), or brackets that do not pair up: not JSON the decoder takes
        skeleton = peeled
    return b"[]" in skeleton


class BoundedDecoder(Generic[T]):
    """A ``msgspec.json.Decoder`` of ``type`` that refuses documents deeper than ``max_depth`` or
    longer than ``max_bytes`` (``None``: the caller bounds the size, e.g. a capped body read)."""

    __slots__ = ("_decoder", "max_bytes", "max_depth")

    @overload
    def __init__(
        self: BoundedDecoder[Any], *, max_depth: int = MAX_JSON_DEPTH, max_bytes: int | None = None
    ) -> None: ...

    @overload
    def __init__(self, type: type[T], *, max_depth: int = MAX_JSON_DEPTH, max_bytes: int | None = None) -> None: ...

    @overload  # a union or an annotated type: annotate the variable, as with msgspec's own Decoder
    def __init__(
        self: BoundedDecoder[Any], type: Any, *, max_depth: int = MAX_JSON_DEPTH, max_bytes: int | None = None
    ) -> None: ...

    def __init__(self, type: Any = Any, *, max_depth: int = MAX_JSON_DEPTH, max_bytes: int | None = None) -> None:
        self._decoder: msgspec.json.Decoder[T] = msgspec.json.Decoder(type)
        self.max_depth = max_depth
        self.max_bytes = max_bytes

    def decode(self, data: bytes | str) -> T:
        """One document; raises ``msgspec.DecodeError`` (``JsonBoundsError`` when out of bounds)."""
        if self.max_bytes is not None and len(data) > self.max_bytes:
            raise JsonTooLargeError(len(data), self.max_bytes)
        try:
            value = self._decoder.decode(data)
        except RecursionError:
            # msgspec's own bound: the interpreter's recursion limit, reached in C and unwound cleanly.
            raise JsonTooDeepError(self.max_depth) from None
        # After the decode, so the exact check only ever runs on valid JSON; ``len`` first, inline,
        # because most documents are short enough to need nothing more.
        if len(data) > 2 * self.max_depth + 1 and depth_exceeds(data, self.max_depth):
            raise JsonTooDeepError(self.max_depth)
        return value

    def decode_lines(self, data: bytes | str) -> list[T]:
        """Newline-delimited documents, bounded as one: the depth of the deepest, the size of all."""
        if self.max_bytes is not None and len(data) > self.max_bytes:
            raise JsonTooLargeError(len(data), self.max_bytes)
        try:
            values = self._decoder.decode_lines(data)
        except RecursionError:
            raise JsonTooDeepError(self.max_depth) from None
        if depth_exceeds(data, self.max_depth):
            raise JsonTooDeepError(self.max_depth)
        return values


_any = BoundedDecoder()


def decode_json(data: bytes | str, *, max_depth: int = MAX_JSON_DEPTH, max_bytes: int | None = None) -> Any:
    """One untyped JSON document, bounded (see ``BoundedDecoder``)."""
    if max_depth == MAX_JSON_DEPTH and max_bytes is None:
        return _any.decode(data)
    return BoundedDecoder(max_depth=max_depth, max_bytes=max_bytes).decode(data)
