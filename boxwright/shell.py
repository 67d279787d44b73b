"""Building shell command lines safely: every value single-quoted, options refused as values."""

from __future__ import annotations

import shlex
from collections.abc import Iterable


def quote(value: str) -> str:
    """Single-quote ``value`` for POSIX ``sh`` (always quoted, so the output shape is predictable)."""
    if "\x00" in value:
        raise ValueError(f"a shell argument cannot contain a NUL byte: {value!r}")
    return "'" + value.replace("'", "'\"'\"'") + "'"


def join(args: Iterable[str]) -> str:
    return " ".join(quote(a) for a in args)


def positional(value: str, what: str) -> str:
    """Refuse a positional value that a command would read as an option."""
    if value.startswith("-"):
        raise ValueError(f"{what} must not start with '-': {value!r}")
    return value


def split(command: str) -> list[str]:
    return shlex.split(command)
