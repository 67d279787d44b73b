"""A run's input as stored on its record: what a successor starts the agent from if it never started.

The trigger's messages (or its prompt) are the user's input; its metadata never is (it may hold
secrets, R4), so it is never part of this. Values registered as secrets are masked in each
message's text before it is stored, and the whole is bounded by the trigger's body limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import msgspec

from boxwright.harnesses.base import Message
from boxwright.secrets import MASK, process_secret_values

# What is stored: the prompt string or the message list, one JSON value.
StoredInput = list[Message] | str
_decoder: Final = msgspec.json.Decoder(StoredInput)


class RunInputTooLargeError(ValueError):
    """A run's input is over the bound a record may store: the run is refused before it starts."""

    code = "too_large"

    def __init__(self, size: int, limit: int) -> None:
        self.size, self.limit = size, limit
        super().__init__(f"the run's input is {size} bytes as JSON, over the {limit} bytes a run may be given")


def _masked(text: str, values: Sequence[str]) -> str:
    for value in values:  # longest first: a value inside a longer one must not leave the rest of it
        text = text.replace(value, MASK)
    return text


def encode_run_input(messages: Sequence[Message] | str, *, limit: int, secrets: Iterable[str] = ()) -> str:
    """The JSON text stored for ``messages``, secrets (``secrets`` and the process's own) masked.

    Raises ``RunInputTooLargeError`` over ``limit`` bytes.
    """
    values = sorted({v for v in (*process_secret_values(), *secrets) if v}, key=len, reverse=True)
    value: StoredInput
    if isinstance(messages, str):
        value = _masked(messages, values)
    else:
        value = [msgspec.structs.replace(m, content=_masked(m.content, values)) for m in messages]
    raw = msgspec.json.encode(value)
    if len(raw) > limit:
        raise RunInputTooLargeError(len(raw), limit)
    return raw.decode()


def decode_run_input(text: str) -> Sequence[Message] | str:
    """The messages (or prompt) ``encode_run_input`` stored."""
    return _decoder.decode(text)


__all__ = ["RunInputTooLargeError", "decode_run_input", "encode_run_input"]
