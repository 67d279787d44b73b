"""The input stored with a run: secrets masked, bounded, and read back as it was given."""

from __future__ import annotations

import pytest

from boxwright.harnesses.base import Message
from boxwright.run_input import RunInputTooLargeError, decode_run_input, encode_run_input
from boxwright.secrets import MASK


def test_registered_secret_values_are_masked_in_every_message() -> None:
    given = [Message(role="system", content="key sk-live-123"), Message(role="user", content="use sk-live-123 now")]
    stored = encode_run_input(given, limit=4096, secrets=["sk-live-123"])
    assert "sk-live-123" not in stored
    assert decode_run_input(stored) == [
        Message(role="system", content=f"key {MASK}"),
        Message(role="user", content=f"use {MASK} now"),
    ]


def test_a_prompt_round_trips_as_a_string() -> None:
    assert decode_run_input(encode_run_input('say "hi"\n', limit=100)) == 'say "hi"\n'


def test_an_input_over_the_limit_is_refused() -> None:
    with pytest.raises(RunInputTooLargeError, match="over the 64 bytes"):
        encode_run_input([Message(role="user", content="x" * 100)], limit=64)
