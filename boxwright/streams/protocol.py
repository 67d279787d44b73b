"""Durable Streams wire rules that need no state: header names, offsets, cursors, validation, SSE frames.

Offsets are ``0000000000000000_<16-digit position>``, the reference server's shape (the suite
sends ``0000000000000000_0000000000000000`` as a literal start). The position counts bytes in
a byte stream and messages in a JSON stream, so a fork's sub-offset is plain addition and every
position is an append boundary or a fork split.
"""

from __future__ import annotations

import base64
import datetime
import math
import random
import re
import time
from typing import Final

import msgspec

START: Final = "-1"
NOW: Final = "now"
OFFSET_PREFIX: Final = "0" * 16
_OFFSET_RE = re.compile(r"([0-9]{16})_([0-9]{16})")
_UINT_RE = re.compile(r"0|[1-9][0-9]*")
_RFC3339_RE = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
MAX_SAFE_INTEGER: Final = 2**53 - 1
# The cursor clock of protocol §8: 20-second windows counted from this instant.
CURSOR_EPOCH_S: Final = datetime.datetime(2024, 10, 9, tzinfo=datetime.UTC).timestamp()
CURSOR_WINDOW_S: Final = 20.0

OCTET_STREAM: Final = "application/octet-stream"
JSON_TYPE: Final = "application/json"

SECURITY_HEADERS: Final = {
    "x-content-type-options": "nosniff",
    "cross-origin-resource-policy": "cross-origin",
    "access-control-allow-origin": "*",
    "access-control-expose-headers": (
        "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, Stream-SSE-Data-Encoding, "
        "Stream-TTL, Stream-Expires-At, Producer-Epoch, Producer-Seq, Producer-Expected-Seq, "
        "Producer-Received-Seq, ETag, Location"
    ),
}
CORS_ALLOW_HEADERS: Final = (
    "content-type, if-none-match, stream-closed, stream-seq, stream-ttl, stream-expires-at, "
    "stream-forked-from, stream-fork-offset, stream-fork-sub-offset, producer-id, producer-epoch, producer-seq"
)


class BadRequest(Exception):
    """A request the protocol answers with 400; the message says which header or parameter."""


def format_offset(position: int) -> str:
    return f"{OFFSET_PREFIX}_{position:016d}"


def parse_offset(value: str) -> int:
    """The position an offset token names; ``BadRequest`` for anything this server cannot have issued."""
    match = _OFFSET_RE.fullmatch(value)
    if match is None or match[1] != OFFSET_PREFIX:
        raise BadRequest(f"offset {value[:80]!r} is malformed: expected '-1', 'now' or an offset this server issued")
    return int(match[2])


def parse_uint(name: str, value: str, maximum: int = MAX_SAFE_INTEGER) -> int:
    if _UINT_RE.fullmatch(value) is None or int(value) > maximum:
        raise BadRequest(f"{name} must be a plain non-negative integer (no sign, no leading zeros), got {value[:40]!r}")
    return int(value)


def parse_expires_at(value: str) -> float:
    if _RFC3339_RE.fullmatch(value) is None:
        raise BadRequest(f"Stream-Expires-At must be an RFC 3339 timestamp, got {value[:60]!r}")
    try:
        return datetime.datetime.fromisoformat(value.upper().replace("Z", "+00:00")).timestamp()
    except ValueError as exc:
        raise BadRequest(f"Stream-Expires-At {value[:60]!r} is not a real instant: {exc}") from None


def media_type(content_type: str) -> str:
    """``application/json; charset=utf-8`` and ``Application/JSON`` both mean ``application/json``."""
    return content_type.split(";", 1)[0].strip().lower()


def valid_media_type(content_type: str) -> bool:
    kind, _, sub = media_type(content_type).partition("/")
    return bool(kind) and bool(sub) and " " not in kind and " " not in sub


def is_true(value: str | None) -> bool:
    return value is not None and value.lower() == "true"


def next_cursor(client: str | None, now: float | None = None) -> str:
    """The cursor rule: the current window, or strictly past the client's when it is already there."""
    window = int(((time.time() if now is None else now) - CURSOR_EPOCH_S) // CURSOR_WINDOW_S)
    if client is not None and _UINT_RE.fullmatch(client) is not None and int(client) >= window:
        return str(int(client) + max(1, math.ceil(random.uniform(1.0, 3600.0) / CURSOR_WINDOW_S)))
    return str(window)


# -- JSON mode -------------------------------------------------------------------------------------

_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])
_ANY = msgspec.json.Decoder(msgspec.Raw)


def json_messages(body: bytes, *, allow_empty: bool) -> list[bytes]:
    """Split one array level, keeping each element's bytes; a non-array body is one message."""
    stripped = body.lstrip()
    try:
        if stripped[:1] == b"[":
            items = [bytes(raw) for raw in _ARRAY.decode(body)]
            if not items and not allow_empty:
                raise BadRequest("an append of an empty JSON array ([]) carries no message")
            return items
        return [bytes(_ANY.decode(body))]
    except msgspec.DecodeError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None


def json_body(messages: list[bytes]) -> bytes:
    return b"[" + b",".join(messages) + b"]"


# -- SSE -------------------------------------------------------------------------------------------

_LINES = re.compile(r"\r\n|\r|\n")


class Control(msgspec.Struct, rename="camel", omit_defaults=True):
    stream_next_offset: str
    stream_cursor: str | None = None
    up_to_date: bool | None = None
    stream_closed: bool | None = None


_encode_control = msgspec.json.Encoder().encode


def sse_event(kind: str, payload: str) -> str:
    # No space after "data:" (the suite matches "data:line1"); a line that itself starts with a
    # space gets exactly one, which SSE parsing strips again.
    lines = [f"data: {line}" if line.startswith(" ") else f"data:{line}" for line in _LINES.split(payload)]
    return f"event: {kind}\n" + "\n".join(lines) + "\n\n"


def sse_data(payload: bytes, *, text: bool) -> bytes:
    body = payload.decode("utf-8", "replace") if text else base64.b64encode(payload).decode("ascii")
    return sse_event("data", body).encode()


def sse_control(control: Control) -> bytes:
    return b"event: control\ndata:" + _encode_control(control) + b"\n\n"


def sse_is_text(content_type: str) -> bool:
    kind = media_type(content_type)
    return kind.startswith("text/") or kind == JSON_TYPE
